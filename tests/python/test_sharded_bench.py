"""bench/sharded_bench.py (parted publishing with real processes) on tiny
shapes, so that it cannot rot: both routes run, reach the same state hash,
and report figures in range."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[2] / "bench" / "sharded_bench.py"


def test_sharded_bench_runs_both_routes_on_two_processes(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH), "--layers", "1", "--vocab", "256", "--steps", "2",
                        "--procs", "2", "--cores", "2", "--dir", str(tmp_path), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 1
    s = rows[0]
    assert s["procs"] == 2 and s["threads_per_rank"] == 1
    assert s["hashes_equal"]
    assert len(s["publish_ms_per_rank"]) == 2 and min(s["publish_ms_per_rank"]) > 0
    assert min(s["publish_cpu_ms_per_rank"]) > 0 and s["single_publish_cpu_ms"] > 0
    # Each rank writes its own part (a delta of a few % of its bf16 rows); the
    # receipts and the outcome are a few hundred bytes per rank.
    for written, params in zip(s["written_bytes_per_rank"], s["local_params_per_rank"]):
        assert 0 < written < 2 * params
    assert all(0 < b <= 1024 for b in s["exchange_bytes_per_rank"])
    assert s["commit_ms"] > 0 and s["commit_written_bytes"] > 0
    # The gather route moved the other rank's half of the bf16 model to each rank.
    total = sum(s["local_params_per_rank"])
    for received, params in zip(s["gather_received_bytes_per_rank"], s["local_params_per_rank"]):
        assert received >= 2 * (total - params)
    assert not list(tmp_path.iterdir())  # the buckets are removed
