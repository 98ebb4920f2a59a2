"""bench/speed_report.py's handling of what it cannot measure: it names a
missing package before the 20-30 minutes of benchmarks (session 46: a
Python without deltasync was found only at the end, and every figure
measured before it was lost), and a failing benchmark is reported as not
run while the others are kept, in the table and in --json-out."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "bench" / "speed_report.py"


def _report(build: Path, *args, python: str = sys.executable, timeout: int = 600):
    return subprocess.run([sys.executable, str(REPORT), "--build", str(build), "--python", python, *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def test_a_python_without_the_package_is_named_before_any_benchmark(deltasync_bin, tmp_path):
    # A bare interpreter: no torch, no deltasync (-I ignores PYTHONPATH and user site-packages).
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    bare.chmod(0o755)
    r = _report(Path(deltasync_bin).parent, "--quick", "--s3", "off", "--json-out", tmp_path / "raw.json",
                python=str(bare), timeout=60)
    assert r.returncode == 2, r.stderr
    assert "cannot import torch and deltasync" in r.stderr and "pip install" in r.stderr
    assert "deltasync bench" not in r.stderr  # nothing ran
    assert not (tmp_path / "raw.json").exists()


def test_a_python_that_does_not_exist_is_named_too(deltasync_bin, tmp_path):
    r = _report(Path(deltasync_bin).parent, "--quick", "--s3", "off", python=str(tmp_path / "no-such-python"),
                timeout=60)
    assert r.returncode == 2, r.stderr
    assert "no-such-python cannot import torch and deltasync" in r.stderr and "Traceback" not in r.stderr


def test_a_failing_benchmark_is_reported_and_the_others_are_kept(deltasync_bin, tmp_path):
    # An interpreter that imports (the preflight passes) but fails every script it is given to run.
    failing = tmp_path / "failing-python"
    failing.write_text(f"#!/bin/sh\n[ \"$1\" = -c ] && exec {sys.executable} \"$@\"\n"
                       "echo 'failing-python: refusing to run' \"$1\" >&2\nexit 3\n")
    failing.chmod(0o755)
    raw_path = tmp_path / "raw.json"
    r = _report(Path(deltasync_bin).parent, "--quick", "--s3", "off", "--threads", "1", "--sweep-scales", "0.02",
                "--sweep-rates", "0.1", "--json-out", raw_path, python=str(failing))
    assert r.returncode == 1, r.stderr[-3000:]
    raw = json.loads(raw_path.read_text())
    assert raw["failed"] == {"python_publish": "python_publish_bench.py failed (exit 3)"}
    for key in ("bench_t1", "sweep_t1", "gap_apply", "diff"):
        assert key in raw, key
    assert raw["bench_t1"]["apply_compact_vs_memcpy"] > 0
    # The table has the figures that ran and says which one did not.
    assert "| whole compact apply / memcpy (1 thread)" in r.stdout
    # The Model line names the SIMD route the bench ran (its simd_target).
    assert f"SIMD route {raw['bench_t1']['simd_target']}." in r.stdout
    assert "| `python_publish` | not run: python_publish_bench.py failed (exit 3)" in r.stdout
    assert "speed_report: python_publish: python_publish_bench.py failed (exit 3)" in r.stderr
