#!/usr/bin/env python3
"""One optimizer step of a Qwen3-0.6B-shaped model, published two ways, from Python.

- deltasync: ``Publisher.publish(version, fp32 torch CPU tensors)`` to a local
  bucket (zero-copy; fp32->bf16, change detection, encoding and the write of
  the delta object and manifest all inside the call).
- TRL-style pure PyTorch (TRL's v1 trainer path): a new CPU bf16 snapshot
  ``w.to(torch.bfloat16).cpu().clone()``, ``new != old``, ``nonzero``, gather
  the values, gap_delta indices (uint16, uint32 per tensor when a gap does not
  fit), ``safetensors.torch.save_file`` of the sparse patch, and the new
  snapshot replaces the old.

fp32 masters ~N(0, 0.02) (norm weights 1.0) are moved like AdamW at lr 3e-6
would: w += 3e-6 * N(0, 1), which changes a few % of the bf16 values. Each
path runs in its own process; peak extra memory is the growth of the
resident set during the timed call (VmHWM after, reset through
/proc/self/clear_refs, minus VmRSS before). Figures only, never pass/fail.

    python bench/python_publish_bench.py            # 28 layers, ~0.6B parameters (~6 GB RAM per process)
    python bench/python_publish_bench.py --quick    # 2 layers, 8k vocab: seconds
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def qwen3_shapes(layers: int, vocab: int) -> dict[str, tuple[int, ...]]:
    hidden, inter, heads, kv_heads, head_dim = 1024, 3072, 16, 8, 128
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}  # tied with lm_head
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": (head_dim,),
            p + "self_attn.k_norm.weight": (head_dim,),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
        })
    shapes["model.norm.weight"] = (hidden,)
    return shapes


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def worker(args) -> None:
    import torch

    torch.manual_seed(args.seed)
    shapes = qwen3_shapes(args.layers, args.vocab)
    weights = {}
    for name, shape in shapes.items():
        weights[name] = torch.ones(shape) if len(shape) == 1 else torch.randn(shape) * 0.02
    gen = torch.Generator().manual_seed(args.seed + 1)

    def adamw_like_step():
        with torch.no_grad():
            for w in weights.values():
                w.add_(torch.randn(w.shape, generator=gen), alpha=args.lr)

    tmp = tempfile.mkdtemp(prefix="ds-pybench-", dir=args.tmp)
    times, cpu, peaks, changed, out_bytes, detail = [], [], [], [], [], []

    def cpu_s() -> float:  # user + system CPU seconds of this process (all threads)
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    reset_ok = True
    if args.worker == "deltasync":
        import deltasync
        import deltasync.torch as dt

        pub = deltasync.Publisher(os.path.join(tmp, "bucket"), anchor_interval=1_000_000, encoding=args.encoding)
        pub.publish(1, dt.to_publishable(weights))  # the anchor (untimed): the previous step's state
        for r in range(args.repeats):
            adamw_like_step()
            arrays = dt.to_publishable(weights)  # zero-copy views
            reset_ok &= _reset_peak()
            rss0 = _status_kb("VmRSS")
            c0, t0 = cpu_s(), time.perf_counter()
            res = pub.publish(2 + r, arrays)
            times.append(time.perf_counter() - t0)
            cpu.append(cpu_s() - c0)
            peaks.append(_status_kb("VmHWM") - rss0)
            changed.append(res.changed_elements / res.total_elements)
            out_bytes.append(res.delta_bytes)
            detail.append({"detect_encode_s": res.detect_encode_ms / 1e3, "upload_s": res.upload_ms / 1e3})
        pub.close()
    else:
        from safetensors.torch import save_file

        snapshot = {n: w.to(torch.bfloat16).cpu().clone() for n, w in weights.items()}  # previous step's
        total = sum(w.numel() for w in weights.values())
        for r in range(args.repeats):
            adamw_like_step()
            reset_ok &= _reset_peak()
            rss0 = _status_kb("VmRSS")
            c0, t0 = cpu_s(), time.perf_counter()
            patch, new_snapshot, n_changed = {}, {}, 0
            for name, w in weights.items():
                new = w.detach().to(torch.bfloat16).cpu().clone()
                idx = (new != snapshot[name]).view(-1).nonzero().squeeze(1)
                if idx.numel():
                    vals = new.view(-1)[idx]
                    gaps = torch.diff(idx, prepend=idx.new_tensor([-1])) - 1
                    patch[f"{name}.idx"] = gaps.to(torch.uint16 if int(gaps.max()) <= 0xFFFF else torch.uint32)
                    patch[f"{name}.val"] = vals
                    n_changed += idx.numel()
                new_snapshot[name] = new
            path = os.path.join(tmp, f"step_{2 + r:06d}.safetensors")
            save_file(patch, path, metadata={
                "format": "sparse_weight_patch", "version": "1", "sparse": "True", "model_version": str(2 + r),
                "num_changed_params": str(len(patch) // 2), "total_changed_elements": str(n_changed),
                "total_elements": str(total), "sparsity": str(1 - n_changed / total), "encoding": "gap_delta"})
            snapshot = new_snapshot
            del new_snapshot, patch
            times.append(time.perf_counter() - t0)
            cpu.append(cpu_s() - c0)
            peaks.append(_status_kb("VmHWM") - rss0)
            changed.append(n_changed / total)
            out_bytes.append(os.path.getsize(path))
    shutil.rmtree(tmp, ignore_errors=True)  # the bucket holds a full anchor: ~0.8-1.7 GB per process
    print(json.dumps({"path": args.worker, "times_s": times, "cpu_s": cpu, "peak_extra_kb": peaks, "changed_fraction": changed,
                      "bytes": out_bytes, "detail": detail, "params": sum(w.numel() for w in weights.values()),
                      "threads": __import__("torch").get_num_threads(), "peak_reset": reset_ok}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 layers, 8192-token vocabulary (CI)")
    ap.add_argument("--layers", type=int, default=None, help="default 28 (Qwen3-0.6B), 2 with --quick")
    ap.add_argument("--vocab", type=int, default=None, help="default 151936, 8192 with --quick")
    ap.add_argument("--lr", type=float, default=3e-6)
    ap.add_argument("--repeats", type=int, default=None, help="timed steps per path (default 3, 2 with --quick)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="process pairs, alternating which path runs first (default 2, 1 with --quick)")
    ap.add_argument("--encoding", default="compact", choices=["compact", "gap_delta", "raw"],
                    help="deltasync's delta encoding (default: the Publisher's default, compact)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tmp", default=None, help="directory for the bucket and patch files (default: $TMPDIR)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--worker", choices=["deltasync", "trl"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.layers = args.layers if args.layers is not None else (2 if args.quick else 28)
    args.vocab = args.vocab if args.vocab is not None else (8192 if args.quick else 151936)
    args.repeats = args.repeats if args.repeats is not None else (2 if args.quick else 3)
    args.rounds = args.rounds if args.rounds is not None else (1 if args.quick else 2)
    if args.worker:
        worker(args)
        return 0

    # Alternate the two processes (a fresh pair per round) so that load from
    # other work on the machine hits both paths alike.
    results: dict[str, dict] = {}
    for rnd in range(args.rounds):
        for path in (("deltasync", "trl") if rnd % 2 == 0 else ("trl", "deltasync")):
            cmd = [sys.executable, __file__, "--worker", path, "--layers", str(args.layers), "--vocab",
                   str(args.vocab), "--lr", str(args.lr), "--repeats", str(args.repeats), "--encoding",
                   args.encoding, "--seed", str(args.seed + rnd)] + (["--tmp", args.tmp] if args.tmp else [])
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.stderr.write(proc.stderr)
                print(f"python_publish_bench: the {path} process failed (exit {proc.returncode})", file=sys.stderr)
                return 1
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            if path not in results:
                results[path] = got
            else:
                for key in ("times_s", "cpu_s", "peak_extra_kb", "changed_fraction", "bytes", "detail"):
                    results[path][key] += got[key]
                results[path]["peak_reset"] &= got["peak_reset"]
    ds, trl = results["deltasync"], results["trl"]
    t_ds, t_trl = statistics.median(ds["times_s"]), statistics.median(trl["times_s"])
    summary = {
        "params": ds["params"], "layers": args.layers, "vocab": args.vocab, "threads": ds["threads"],
        "changed_fraction": statistics.mean(ds["changed_fraction"]),
        "deltasync_s": t_ds, "trl_style_s": t_trl, "speedup": t_trl / t_ds,
        "deltasync_min_s": min(ds["times_s"]), "trl_style_min_s": min(trl["times_s"]),
        "speedup_best": min(trl["times_s"]) / min(ds["times_s"]),
        "deltasync_cpu_s": statistics.median(ds["cpu_s"]), "trl_style_cpu_s": statistics.median(trl["cpu_s"]),
        "cpu_ratio": statistics.median(trl["cpu_s"]) / statistics.median(ds["cpu_s"]),
        "deltasync_peak_extra_mb": max(ds["peak_extra_kb"]) / 1024, "trl_style_peak_extra_mb": max(trl["peak_extra_kb"]) / 1024,
        "deltasync_delta_bytes": statistics.mean(ds["bytes"]), "trl_style_patch_bytes": statistics.mean(trl["bytes"]),
        "encoding": args.encoding, "steps_timed": len(ds["times_s"]), "peak_reset": ds["peak_reset"] and trl["peak_reset"],
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"one step of a Qwen3-0.6B-shaped model: {summary['params'] / 1e6:.1f}M parameters "
          f"({args.layers} layers, vocab {args.vocab}), {summary['changed_fraction'] * 100:.2f}% of bf16 values "
          f"changed (lr {args.lr:g}), {ds['threads']} threads, {len(ds['times_s'])} timed steps per path")
    print(f"  {'path':<34}{'median':>9}{'best':>9}{'CPU':>9}{'peak extra RSS':>17}{'bytes written':>16}")
    print(f"  {'deltasync Publisher.publish (' + args.encoding + ')':<34}{t_ds:>8.3f}s{min(ds['times_s']):>8.3f}s"
          f"{summary['deltasync_cpu_s']:>8.2f}s"
          f"{summary['deltasync_peak_extra_mb']:>14.1f} MB{summary['deltasync_delta_bytes'] / 1e6:>13.2f} MB")
    print(f"  {'TRL-style PyTorch + safetensors':<34}{t_trl:>8.3f}s{min(trl['times_s']):>8.3f}s"
          f"{summary['trl_style_cpu_s']:>8.2f}s"
          f"{summary['trl_style_peak_extra_mb']:>14.1f} MB{summary['trl_style_patch_bytes'] / 1e6:>13.2f} MB")
    print(f"  deltasync is {summary['speedup']:.1f}x faster (median; {summary['speedup_best']:.1f}x best "
          f"against best, {summary['cpu_ratio']:.1f}x less CPU time); peak extra memory "
          f"{summary['deltasync_peak_extra_mb']:.0f} MB vs {summary['trl_style_peak_extra_mb']:.0f} MB"
          + ("" if summary["peak_reset"] else " (VmHWM could not be reset: peaks include setup)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
