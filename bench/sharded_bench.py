#!/usr/bin/env python3
"""Parted publishing with real processes (docs/format.md, "Parts"; issue 13's benchmark).

P ranks run as separate processes (torch.multiprocessing, gloo on CPU), each
holding only its Shard(0) row range of a Qwen3-0.6B-shaped model: fp32
masters ~N(0, 0.02) (norm weights 1.0) moved by AdamW (lr 3e-6, weight decay
0.01, log-normal per-row gradient scales: the synthetic trainer of the demo
and bench/parts_bench, tools/deltasync/synthetic_model.cc), with its AdamW
moments on the rank too (12 bytes per local parameter). Each version, timed
per rank:

- publish: this rank's PartPublisher (fp32 -> bf16, fused detect, compact
  encode, upload of its part) on its own rows, with cores / P threads;
- exchange: the receipts gathered to rank 0 over gloo (gather_object) and the
  outcome broadcast back; its bytes are the traffic between ranks;
- commit: rank 0's PartCommitter (checks the receipts, rewrites the manifest);
- bytes read and written by each rank while it publishes (and by rank 0 while
  it commits), from /proc/self/io (rchar/wchar: what crossed read()/write()
  to the bucket, a local directory);

and, in the same run, the gather-to-one-rank route: every tensor cast to bf16
and all-gathered over gloo (timed), then one Publisher on rank 0 with every
core publishes the full model to a second bucket. Both routes must reach the
same state hash (checked each version). The first version (the anchor) is
not timed. Figures only, never pass/fail.

    python bench/sharded_bench.py                       # 28 layers (596M parameters), P = 1, 2, 4
    python bench/sharded_bench.py --layers 2 --vocab 8192 --procs 1,2 --steps 3 --json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import resource
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_publish_bench import qwen3_shapes  # noqa: E402

LR, WEIGHT_DECAY, B1, B2, EPS = 3e-6, 0.01, 0.9, 0.999, 1e-8
ANCHOR_INTERVAL = 1000  # one anchor (version 1), deltas after it


def _proc_io() -> tuple[int, int]:
    with open("/proc/self/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return int(fields["rchar"]), int(fields["wchar"])


_a, _b = _proc_io(), _proc_io()
_IO_SELF = (_b[0] - _a[0], _b[1] - _a[1])  # what reading /proc/self/io itself counts


def io_bytes() -> tuple[int, int]:
    """(bytes read, bytes written) through read()/write() by this process so far (less our own reads of it)."""
    r, w = _proc_io()
    io_bytes.calls += 1
    return r - io_bytes.calls * _IO_SELF[0], w - io_bytes.calls * _IO_SELF[1]


io_bytes.calls = 0


def cpu_ms() -> float:
    """User + system CPU time of this process (all its threads), in ms: less sensitive to other load than wall time."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime + r.ru_stime) * 1e3


def row_range(rows: int, rank: int, world: int) -> tuple[int, int]:
    """FSDP2 Shard(0): torch.chunk's split (ceil(rows / world) per rank, the last ones shorter or empty)."""
    chunk = math.ceil(rows / world)
    begin = min(rows, rank * chunk)
    return begin, min(rows, begin + chunk)


class ShardTrainer:
    """The synthetic trainer's AdamW on this rank's rows only."""

    def __init__(self, torch, shapes: dict, rank: int, world: int, seed: int = 1234):
        self.torch = torch
        self.step_count = 0
        self.params = {}  # name -> [w, m, v, row scales, first row]
        gen = torch.Generator().manual_seed(seed * 1000 + rank)
        self.gen = gen
        for i, (name, shape) in enumerate(sorted(shapes.items())):
            begin, end = row_range(shape[0], rank, world)
            local = (end - begin, *shape[1:])
            if len(shape) == 1:
                w = torch.ones(local)
                scale = torch.full((1,), 1e-3)
            else:
                w = torch.randn(local, generator=gen) * 0.02
                # Gradient magnitudes differ by orders of magnitude between rows.
                scale = (1e-3 * torch.exp(1.5 * torch.randn((end - begin, 1), generator=gen)))
            self.params[name] = [w, torch.zeros(local), torch.zeros(local), scale, begin]

    def step(self) -> None:
        torch = self.torch
        self.step_count += 1
        c1, c2 = 1 - B1 ** self.step_count, 1 - B2 ** self.step_count
        with torch.no_grad():
            for w, m, v, scale, _ in self.params.values():
                g = torch.randn(w.shape, generator=self.gen).mul_(scale)
                m.mul_(B1).add_(g, alpha=1 - B1)
                v.mul_(B2).addcmul_(g, g, value=1 - B2)
                update = (m / c1).div_((v / c2).sqrt_().add_(EPS))
                w.sub_(update.add_(w, alpha=WEIGHT_DECAY).mul_(LR))


def layout(shapes: dict, world: int):
    names = sorted(shapes)
    tensors = [(n, "BF16", list(shapes[n])) for n in names]
    parts = []
    for r in range(world):
        part = []
        for t, n in enumerate(names):
            begin, end = row_range(shapes[n][0], r, world)
            if end > begin:
                part.append((t, [begin] + [0] * (len(shapes[n]) - 1), [end - begin, *shapes[n][1:]]))
        parts.append(part)
    return tensors, parts


def rank_main(rank: int, world: int, args, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    import deltasync
    from deltasync import _native

    threads = max(1, args.cores // world)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/init-{world}", rank=rank, world_size=world)
    shapes = qwen3_shapes(args.layers, args.vocab)
    trainer = ShardTrainer(torch, shapes, rank, world)
    tensors, parts = layout(shapes, world)
    parted_bucket = os.path.join(out_dir, f"parted-{world}")
    pub = _native.PartPublisher(parted_bucket, tensors, parts, rank, ANCHOR_INTERVAL, threads, False, False, False)
    committer = _native.PartCommitter(parted_bucket, tensors, parts, ANCHOR_INTERVAL, False, False) if rank == 0 else None
    single = (deltasync.Publisher(os.path.join(out_dir, f"single-{world}"), anchor_interval=ANCHOR_INTERVAL,
                                  threads=args.cores) if rank == 0 else None)
    names = sorted(shapes)
    rows = []
    for version in range(1, args.steps + 1):
        trainer.step()
        row = {"version": version}
        items = [(n, trainer.params[n][0].numpy(), "") for n in names if trainer.params[n][0].numel()]
        # -- parted route -------------------------------------------------
        dist.barrier()
        t0, cpu0 = time.perf_counter(), cpu_ms()
        io0 = io_bytes()
        receipt = pub.publish(version, items)
        io1 = io_bytes()
        t1, cpu1 = time.perf_counter(), cpu_ms()
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(receipt, gathered, dst=0)
        outcome = [None]
        if rank == 0:
            c0, cio0 = time.perf_counter(), io_bytes()
            stats = committer.commit(version, gathered)
            cio1, c1 = io_bytes(), time.perf_counter()
            row.update(commit_ms=(c1 - c0) * 1e3, commit_read=cio1[0] - cio0[0], commit_written=cio1[1] - cio0[1],
                       parted_hash=stats["state_hash"])
            outcome = [None]  # committed
        dist.broadcast_object_list(outcome, src=0)
        pub.finish(outcome[0] is None)
        t2 = time.perf_counter()
        row.update(publish_ms=(t1 - t0) * 1e3, publish_cpu_ms=cpu1 - cpu0, read=io1[0] - io0[0],
                   written=io1[1] - io0[1], version_ms=(t2 - t0) * 1e3, receipt_bytes=len(receipt),
                   exchange_bytes=len(pickle.dumps(receipt)) + len(pickle.dumps(outcome)))
        # -- gather-to-one-rank route -------------------------------------
        dist.barrier()
        g0 = time.perf_counter()
        full, received = {}, 0
        for n in names:
            local = trainer.params[n][0].to(torch.bfloat16)
            if world == 1:
                full[n] = local
                continue
            chunk = math.ceil(shapes[n][0] / world)
            padded = torch.zeros((chunk, *shapes[n][1:]), dtype=torch.bfloat16)
            padded[: local.shape[0]] = local
            pieces = [torch.empty_like(padded) for _ in range(world)]
            dist.all_gather(pieces, padded)
            received += sum(p.numel() * 2 for i, p in enumerate(pieces) if i != rank)
            if rank == 0:
                full[n] = torch.cat(pieces)[: shapes[n][0]]
            del pieces
        g1 = time.perf_counter()
        row.update(gather_ms=(g1 - g0) * 1e3, gather_received=received)
        if rank == 0:
            s0, scpu0 = time.perf_counter(), cpu_ms()
            result = single.publish(version, full)
            row.update(single_publish_ms=(time.perf_counter() - s0) * 1e3, single_publish_cpu_ms=cpu_ms() - scpu0,
                       single_hash=result.state_hash,
                       single_written=result.delta_bytes + result.anchor_bytes)
            if result.state_hash != row["parted_hash"]:
                raise SystemExit(f"version {version}: parted hash {row['parted_hash']} != one process's "
                                 f"{result.state_hash}")
        del full
        rows.append(row)
    with open(os.path.join(out_dir, f"result-{world}-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "threads": threads, "rows": rows,
                   "local_params": sum(p[0].numel() for p in trainer.params.values())}, f)
    dist.barrier()
    dist.destroy_process_group()


def summarize(world: int, results: list[dict], cores: int) -> dict:
    timed = lambda r: r["rows"][1:]  # noqa: E731 - versions after the anchor
    mean = lambda xs: statistics.fmean(xs) if xs else 0.0  # noqa: E731
    r0 = results[0]
    return {
        "procs": world,
        "threads_per_rank": r0["threads"],
        "oversubscribed": world > cores,
        "publish_ms_per_rank": [round(mean([x["publish_ms"] for x in timed(r)]), 1) for r in results],
        "publish_ms_max": round(mean([max(r["rows"][i]["publish_ms"] for r in results)
                                      for i in range(1, len(r0["rows"]))]), 1),
        "publish_cpu_ms_per_rank": [round(mean([x["publish_cpu_ms"] for x in timed(r)]), 1) for r in results],
        "version_ms": round(mean([x["version_ms"] for x in timed(r0)]), 1),
        "commit_ms": round(mean([x["commit_ms"] for x in timed(r0)]), 2),
        "commit_read_bytes": round(mean([x["commit_read"] for x in timed(r0)])),
        "commit_written_bytes": round(mean([x["commit_written"] for x in timed(r0)])),
        "written_bytes_per_rank": [round(mean([x["written"] for x in timed(r)])) for r in results],
        "read_bytes_per_rank": [round(mean([x["read"] for x in timed(r)])) for r in results],
        "receipt_bytes_per_rank": [round(mean([x["receipt_bytes"] for x in timed(r)])) for r in results],
        "exchange_bytes_per_rank": [round(mean([x["exchange_bytes"] for x in timed(r)])) for r in results],
        "gather_ms": round(mean([max(r["rows"][i]["gather_ms"] for r in results) for i in range(1, len(r0["rows"]))]), 1),
        "gather_received_bytes_per_rank": [round(mean([x["gather_received"] for x in timed(r)])) for r in results],
        "single_publish_ms": round(mean([x["single_publish_ms"] for x in timed(r0)]), 1),
        "single_publish_cpu_ms": round(mean([x["single_publish_cpu_ms"] for x in timed(r0)]), 1),
        "single_written_bytes": round(mean([x["single_written"] for x in timed(r0)])),
        "hashes_equal": all(x["parted_hash"] == x["single_hash"] for x in r0["rows"]),
        "local_params_per_rank": [r["local_params"] for r in results],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--steps", type=int, default=4, help="versions; the first (the anchor) is not timed")
    ap.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="total threads, split over the ranks")
    ap.add_argument("--procs", default="1,2,4", help="rank counts P")
    ap.add_argument("--dir", default=None, help="where the buckets go (removed afterwards)")
    ap.add_argument("--json", action="store_true", help="one JSON line per P instead of the table")
    args = ap.parse_args()
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first version is not timed)")
    import torch.multiprocessing as mp

    shapes = qwen3_shapes(args.layers, args.vocab)
    total = sum(math.prod(s) for s in shapes.values())
    base = tempfile.mkdtemp(prefix="ds-sharded-bench-", dir=args.dir)
    summaries = []
    try:
        for world in [int(p) for p in args.procs.split(",")]:
            out_dir = os.path.join(base, f"p{world}")
            os.makedirs(out_dir)
            mp.spawn(rank_main, args=(world, args, out_dir), nprocs=world, join=True)
            results = []
            for r in range(world):
                with open(os.path.join(out_dir, f"result-{world}-{r}.json")) as f:
                    results.append(json.load(f))
            summaries.append(summarize(world, results, args.cores))
            shutil.rmtree(out_dir, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        for s in summaries:
            print(json.dumps(s))
        return
    print(f"model: {args.layers} layers, vocab {args.vocab} ({total / 1e6:.0f}M parameters); {args.steps} versions "
          f"(first not timed); {args.cores} cores; load {os.getloadavg()[0]:.2f}")
    print(f"{'P':>3} {'thr':>4} {'publish ms/rank':>22} {'CPU ms/rank':>22} {'version ms':>11} {'commit ms':>10} {'MB written/rank':>22} "
          f"{'KB read':>8} {'exch B/rank':>12} {'gather ms':>10} {'1-rank pub ms (CPU)':>20}")
    for s in summaries:
        label = f"{s['procs']}{'*' if s['oversubscribed'] else ''}"
        pubs = "/".join(f"{x:.0f}" for x in s["publish_ms_per_rank"])
        cpus = "/".join(f"{x:.0f}" for x in s["publish_cpu_ms_per_rank"])
        written = "/".join(f"{x / 1e6:.2f}" for x in s["written_bytes_per_rank"])
        print(f"{label:>3} {s['threads_per_rank']:>4} {pubs:>22} {cpus:>22} {s['version_ms']:>11.0f} {s['commit_ms']:>10.2f} "
              f"{written:>22} {max(s['read_bytes_per_rank']) / 1e3:>8.1f} {max(s['exchange_bytes_per_rank']):>12} "
              f"{s['gather_ms']:>10.0f} {s['single_publish_ms']:>10.0f} ({s['single_publish_cpu_ms']:.0f})")
    print("* oversubscribed (more ranks than cores). Both routes reached the same state hash at every version: "
          + ("yes" if all(s["hashes_equal"] for s in summaries) else "NO"))


if __name__ == "__main__":
    main()
