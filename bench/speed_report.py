#!/usr/bin/env python3
"""Every throughput figure of the replica-speed work, measured in one run.

    bench/speed_report.py [--quick] [--build DIR] [--python PY] [--s3 {auto,start,off}]
                          [--sweep-scales 0.25,1,2] [--sweep-rates 0.005,0.03,0.1]
                          [--json-out FILE]

Runs, one after the other on the same machine, each benchmark with the
baseline it measures in the same process (docs/benchmarks.md, "One run of
every figure"):

  - `deltasync bench --json` on 1 and 2 threads (full Qwen3-0.6B shapes,
    596M parameters; --quick: 2 layers): the replica's whole compact apply,
    its decode per core, the fused compact publish, gap_delta detect+encode
    and apply, each against memcpy of the model; and the floor of the
    compact decode and apply (the same delta's read, parse, output, hash,
    scatter and digest, each timed alone: what bounds them);
  - `deltasync bench --sweep --json` on 1 and 2 threads: the replica's
    compact apply over model sizes x change rates;
  - `bench/gap_apply_bench`: the gap_delta apply against memcpy and against
    its scatter floor (read each old value, write each new one);
  - `bench/diff_bench`: `deltasync diff` against `dd` of both inputs (warm
    page cache);
  - `bench/s3_bench`: S3Store downloads against `curl -o /dev/null` on the
    same object and server (--s3 start: a throwaway Ceph RGW from
    scripts/start-rgw.sh, stopped at the end; auto: only where
    AWS_ENDPOINT_URL is set; off);
  - `bench/python_publish_bench.py`: `Publisher.publish` against the
    TRL-style PyTorch path (needs torch in --python).

Prints one Markdown table (figure, measured, target, met) and the sweep
table, and writes every benchmark's raw JSON to --json-out (after each
benchmark, so a run stopped late keeps what it measured). It prints
figures and never fails on a ratio. Before any benchmark it checks that
the binaries are built and that --python imports torch and deltasync, and
stops (exit 2) naming what is missing. A benchmark that fails or prints no
result is reported as not run, the others still run, and the exit is 1.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(f"speed_report: [{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class BenchFailed(Exception):
    """One benchmark failed; the report goes on with the others."""


def run(cmd: list[str], env: dict | None = None) -> str:
    log(" ".join(cmd))
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    log(f"  {time.monotonic() - t0:.1f} s, exit {proc.returncode}")
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        # Name the script, not its interpreter.
        what = next((Path(c).name for c in cmd[:2] if c.endswith((".py", ".sh"))), Path(cmd[0]).name)
        raise BenchFailed(f"{what} failed (exit {proc.returncode})")
    return proc.stdout


def last_json(out: str, what: str):
    for line in reversed(out.strip().splitlines()):
        line = line.strip()
        if line.startswith("{") or line.startswith("["):
            return json.loads(line)
    raise BenchFailed(f"{what} printed no JSON result")


def preflight(build: Path, python: str) -> list[str]:
    """What the run would miss, found before any benchmark runs (a run takes
    20-30 minutes: a missing package found at its end would waste them)."""
    problems = []
    for exe in ("deltasync", "bench/gap_apply_bench", "bench/diff_bench", "bench/s3_bench"):
        if not os.access(build / exe, os.X_OK):
            problems.append(f"{build / exe} is not built (scripts/build.sh)")
    try:
        probe = subprocess.run([python, "-c", "import torch, deltasync"], capture_output=True, text=True)
        last = (probe.stderr.strip().splitlines() or ["?"])[-1] if probe.returncode != 0 else None
    except OSError as e:  # no such interpreter, not executable
        last = str(e)
    if last is not None:
        problems.append(f"{python} cannot import torch and deltasync ({last}); install the package into it: "
                        f"{python} -m pip install --no-build-isolation . (as scripts/test.sh does), or pass --python")
    return problems


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def s3_env(mode: str, stack: list) -> dict | None:
    """The environment for s3_bench, or None to skip it."""
    if mode == "off":
        return None
    if mode == "auto":
        return dict(os.environ) if os.environ.get("AWS_ENDPOINT_URL") else None
    env_file = run(["bash", str(ROOT / "scripts/start-rgw.sh")]).strip().splitlines()[-1]
    env = dict(os.environ)
    for line in Path(env_file).read_text().splitlines():
        m = re.match(r"\s*export\s+(\w+)=(.*)", line)
        if m:
            env[m.group(1)] = m.group(2).strip().strip("'\"")
    stack.append(env.get("DS_RGW_DIR", ""))
    return env


def parse_s3(out: str) -> dict:
    """s3_bench's report lines: what -> (S3Store s, curl s, ratio)."""
    rows = {}
    for line in out.splitlines():
        m = re.match(r"(.+?)\s+S3Store\s+([\d.]+) s .*\| curl\s+([\d.]+) s .*\| ratio ([\d.]+)", line)
        if m:
            rows[m.group(1).strip()] = {"s3store_s": float(m.group(2)), "curl_s": float(m.group(3)),
                                        "ratio": float(m.group(4))}
    if not rows:
        raise BenchFailed("s3_bench printed no figures")
    return rows


def parse_diff(out: str) -> dict:
    got = {}
    for key, pat in (("dd_a_s", r"dd A\s+([\d.]+) s"), ("dd_b_s", r"dd B\s+([\d.]+) s"),
                     ("diff_s", r"diff A B\s+([\d.]+) s"), ("ratio", r"ratio diff / \(dd A \+ dd B\) = ([\d.]+)")):
        m = re.search(pat, out)
        if not m:
            raise BenchFailed("diff_bench printed no figures")
        got[key] = float(m.group(1))
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small models everywhere (a smoke run; figures mean little)")
    ap.add_argument("--build", default=str(ROOT / "build"), help="the CMake build directory (default: build)")
    ap.add_argument("--python", default=str(ROOT / ".venv/bin/python"), help="a Python with torch and deltasync")
    ap.add_argument("--s3", choices=["auto", "start", "off"], default="auto")
    ap.add_argument("--sweep-scales", default=None, help="default 0.25,1,2 (--quick: 0.02)")
    ap.add_argument("--sweep-rates", default="0.005,0.03,0.1")
    ap.add_argument("--threads", default="1,2", help="thread counts for bench and the sweep (default 1,2)")
    ap.add_argument("--json-out", default=None, help="write every benchmark's raw JSON here")
    args = ap.parse_args()
    build = Path(args.build)
    ds = str(build / "deltasync")
    threads = [int(t) for t in args.threads.split(",")]
    scales = args.sweep_scales or ("0.02" if args.quick else "0.25,1,2")
    quick = ["--quick"] if args.quick else []
    problems = preflight(build, args.python)
    if problems:
        for msg in problems:
            print(f"speed_report: {msg}", file=sys.stderr)
        return 2
    raw: dict = {"load_average_start": load_average(), "cpu": cpu_name(), "nproc": os.cpu_count(),
                 "free_2mib_blocks_gb_start": free_2mib_blocks_gb(), "failed": {}}

    def save() -> None:
        # After every benchmark, so that a run stopped or failing late keeps what it measured.
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(raw, indent=1) + "\n")

    def step(key: str, measure) -> None:
        try:
            raw[key] = measure()
        except BenchFailed as e:
            log(f"  {key}: {e}; going on with the others")
            raw["failed"][key] = str(e)
        save()

    for t in threads:
        step(f"bench_t{t}", lambda: last_json(run([ds, "bench", "--json", "--threads", str(t)] + quick), "bench"))
        step(f"sweep_t{t}", lambda: last_json(run([ds, "bench", "--sweep", "--json", "--threads", str(t), "--scales",
                                                   scales, "--rates", args.sweep_rates]), "bench --sweep"))
    top = max(threads)
    gap = [str(build / "bench/gap_apply_bench"), "--threads", str(top), "--reps", "2" if args.quick else "3"]
    step("gap_apply", lambda: last_json(run(gap + (["--scale", "0.05"] if args.quick else [])), "gap_apply_bench"))
    step("diff", lambda: parse_diff(run([str(build / "bench/diff_bench"), "--runs", "3"] + quick)))
    rgw: list = []
    try:
        env = None
        try:
            env = s3_env(args.s3, rgw)
        except BenchFailed as e:
            raw["failed"]["s3"] = str(e)  # "start-rgw.sh failed (exit N)"
        if env is not None:
            step("s3", lambda: parse_s3(run([str(build / "bench/s3_bench"), "--mib", "128" if args.quick else "1024",
                                             "--runs", "3"], env)))
    finally:
        for d in rgw:
            subprocess.run(["bash", str(ROOT / "scripts/stop-rgw.sh"), d], cwd=ROOT, capture_output=True)
    step("python_publish", lambda: last_json(run([args.python, str(ROOT / "bench/python_publish_bench.py"), "--json"]
                                                 + quick), "python_publish_bench"))
    raw["load_average_end"] = load_average()
    save()
    print_report(raw, threads)
    for key, msg in raw["failed"].items():
        print(f"speed_report: {key}: {msg}", file=sys.stderr)
    return 1 if raw["failed"] else 0


def free_2mib_blocks_gb() -> str:
    """Free memory in blocks of 2 MiB or more (/proc/buddyinfo orders >= 9),
    in GB: what transparent huge pages can get without compaction. The
    figures move with it (a fragmented machine gives 4 KiB pages, more TLB
    misses and page faults: the gap_delta apply measured 2x slower here)."""
    try:
        total = 0
        for line in Path("/proc/buddyinfo").read_text().splitlines():
            counts = [int(x) for x in line.split()[4:]]
            total += sum(c << order for order, c in enumerate(counts) if order >= 9)
        return f"{total * 4096 / 1e9:.1f}"
    except (OSError, ValueError):
        return "?"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def print_report(raw: dict, threads: list[int]) -> None:
    top = max(threads)
    b = raw.get(f"bench_t{top}")
    rows = []  # figure, measured, target, met

    def row(figure: str, value: float, unit: str, target: float | None, fmt: str = "{:.3f}") -> None:
        met = "" if target is None else ("yes" if value >= target else "no")
        rows.append((figure, fmt.format(value) + unit, "" if target is None else f">= {target:g}{unit}", met))

    print(f"# One run of every replica-speed figure ({raw['cpu']}, {raw['nproc']} cores; load average "
          f"{raw['load_average_start']} at the start, {raw['load_average_end']} at the end; "
          f"{raw.get('free_2mib_blocks_gb_start', '?')} GB free in blocks of 2 MiB or more at the start)\n")
    if b is None:
        rows.append((f"`deltasync bench` on {top} threads", "not run: " + raw["failed"].get(f"bench_t{top}", "?"), "", ""))
    else:
        print(f"Model: {b['model']}, {b['model_bytes'] / 1e9:.2f} GB bf16, {100 * b['changed_fraction']:.1f}% changed; "
              f"memcpy {b['memcpy_gbps']:.2f} GB/s on {top} threads; SIMD route {b.get('simd_target', '?')}.\n")
        row(f"whole compact apply / memcpy ({top} thread{'s' if top > 1 else ''})", b["apply_compact_vs_memcpy"], "x", 0.5)
        for t in threads:
            bt = raw.get(f"bench_t{t}")
            if bt is None:
                continue
            row(f"compact decode per core ({t} thread{'s' if t > 1 else ''})", bt["decode_compact_gbps_per_core"], " GB/s", 5.0,
                "{:.2f}")
        if "apply_floor_vs_memcpy" in b:
            # The same delta's required stages, each timed alone (bench_decode_floor.h): what bounds the two above.
            row(f"  its floor: {top}-thread read with the scatter + (digest + parse + hash) / {top}, / memcpy",
                b["apply_floor_vs_memcpy"], "x", None)
            row("  compact decode floor per core: read + parse + output (bounds the decode per core)",
                b["decode_floor_gbps_per_core"], " GB/s", None, "{:.2f}")
            stages = ", ".join(f"{k} {b[f'floor_{k}_ns_per_change']:.2f}" for k in
                               ("read", "parse", "output", "hash", "scatter", "read_scatter", "digest", "decode_library"))
            rows.append(("  the floor's stages, ns per change (1 thread)", stages + f"; {100 * b['floor_blocks_with_change']:.1f}% "
                         f"of 1024-blocks, {100 * b['floor_words_with_change']:.1f}% of 64-words hold a change", "", ""))
        row(f"fused compact publish / memcpy ({top} threads)", b["publish_compact_vs_memcpy"], "x", 0.5)
        if "publish_read_floor_vs_memcpy" in b:
            row("  the trainer's read floor (fp32 masters + bf16 state, read only) / memcpy",
                b["publish_read_floor_vs_memcpy"], "x", None)
            row("  fused compact publish / that floor", b["publish_compact_vs_floor"], "x", None)
        row(f"gap_delta detect+encode / memcpy ({top} threads)", b["detect_encode_vs_memcpy"], "x", 0.5)
        if "detect_encode_vs_memcpy_paired" in b:
            row("  the same, timed in turns with memcpy (median of the rounds)", b["detect_encode_vs_memcpy_paired"], "x", 0.5)
        if "detect_encode_vs_floor" in b:
            row("  gap_delta detect+encode / the read floor", b["detect_encode_vs_floor"], "x", None)
        if "publish_gap_delta_vs_memcpy" in b:
            row(f"gap_delta publish (Publisher, detect+apply in one pass, upload) / memcpy ({top} threads)",
                b["publish_gap_delta_vs_memcpy"], "x", 0.5)
        row(f"gap_delta apply / memcpy ({top} threads, bench)", b["apply_vs_memcpy"], "x", 1.0)
        if "apply_vs_memcpy_paired" in b:
            row("  the same, timed in turns with memcpy (median of the rounds)", b["apply_vs_memcpy_paired"], "x", 1.0)
    if "gap_apply" in raw:
        g = raw["gap_apply"]
        row(f"gap_delta apply / memcpy (gap_apply_bench, {g['threads']} threads)", g["apply_vs_memcpy"], "x", 1.0)
        row("  its scatter floor / memcpy", g["scatter_floor_vs_memcpy"], "x", None)
    if "diff" in raw:
        d = raw["diff"]
        rows.append(("`deltasync diff` / (dd A + dd B), warm page cache", f"{d['ratio']:.2f}x "
                     f"({d['diff_s']:.3f} s vs {d['dd_a_s']:.3f} + {d['dd_b_s']:.3f} s)", "<= 2.5x",
                     "yes" if d["ratio"] <= 2.5 else "no"))
    if "s3" in raw:
        for what, key in (("S3 download, reused pages / curl -o /dev/null", "download (curl->null)"),
                          ("S3 download, fresh pages / curl -o /dev/null", "first download (fresh pages) vs curl->null"),
                          ("S3 upload / curl", "upload")):
            if key in raw["s3"]:
                s = raw["s3"][key]
                rows.append((what, f"{s['ratio']:.2f}x ({s['s3store_s']:.2f} s vs {s['curl_s']:.2f} s)",
                             ">= 1x" if "download" in key and "fresh" not in key else "",
                             ("yes" if s["ratio"] >= 1.0 else "no") if "download" in key and "fresh" not in key else ""))
    else:
        rows.append(("S3 download / curl -o /dev/null", "not run: " + raw["failed"].get("s3", "no S3 endpoint (--s3 start)"), ">= 1x", ""))
    if "python_publish" in raw:
        p = raw["python_publish"]
        rows.append((f"Python publish vs TRL-style PyTorch path, best vs best ({100 * p['changed_fraction']:.1f}% changed)",
                     f"{p['speedup_best']:.2f}x ({p['deltasync_min_s']:.3f} s vs {p['trl_style_min_s']:.3f} s)", ">= 5x",
                     "yes" if p["speedup_best"] >= 5.0 else "no"))
        rows.append(("  the same, median vs median", f"{p['speedup']:.2f}x", "", ""))
    for key, msg in raw["failed"].items():
        if key not in (f"bench_t{top}", "s3"):  # those two have their own rows above
            rows.append((f"`{key}`", "not run: " + msg, "", ""))
    print("| figure | measured | target | met |\n|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    for t in (t for t in threads if f"sweep_t{t}" in raw):
        print(f"\nThe replica's compact apply over model sizes and change rates ({t} thread{'s' if t > 1 else ''}; "
              "`deltasync bench --sweep`):\n")
        print("| scale | model GB | changed | delta MB | apply s | apply / memcpy | decode GB/s per core | apply s per GB of model "
              "| decode floor GB/s per core | apply floor / memcpy |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for s in raw[f"sweep_t{t}"]:
            gb = s["model_bytes"] / 1e9
            per = s["apply_compact_s"] / gb
            print(f"| {s['scale']:g}x | {gb:.2f} | {100 * s['rate']:.1f}% | {s['delta_bytes'] / 1e6:.1f} | "
                  f"{s['apply_compact_s']:.3f} | {s['apply_compact_vs_memcpy']:.3f}x | "
                  f"{s['decode_compact_gbps_per_core']:.2f} | {per:.3f} | "
                  f"{s.get('decode_floor_gbps_per_core', float('nan')):.2f} | {s.get('apply_floor_vs_memcpy', float('nan')):.3f}x |")


if __name__ == "__main__":
    sys.exit(main())
