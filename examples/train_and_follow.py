#!/usr/bin/env python3
"""Train a tiny model with AdamW and keep a replica process in step with it, bit for bit.

The trainer publishes every optimizer step to a local bucket
(deltasync.torch.attach, background publishing). A separate replica process
follows the bucket version by version, loads each one into its own bf16
copy of the model (deltasync.torch.load_into: everything once, then only
changed elements), and compares that copy with a SHA-256 of the trainer's
bf16 weights, which the trainer writes beside the bucket. Exit status 0
when every version matched, 1 on any mismatch or failure.

    python examples/train_and_follow.py [--steps 20] [--bucket DIR]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import deltasync
import deltasync.torch as dt

VOCAB, DIM, CONTEXT = 512, 64, 16


class TinyLM(torch.nn.Module):
    """Embedding, one residual MLP block, a norm and a head: ~0.1M parameters."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.up = torch.nn.Linear(DIM, 4 * DIM)
        self.down = torch.nn.Linear(4 * DIM, DIM)
        self.norm = torch.nn.LayerNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = h + self.down(torch.nn.functional.gelu(self.up(h)))
        return self.head(self.norm(h))


def bf16_digest(named_tensors) -> str:
    """SHA-256 over (name, bf16 bytes) in name order: independent of deltasync's own hashes."""
    h = hashlib.sha256()
    for name, t in sorted(named_tensors, key=lambda kv: kv[0]):
        h.update(name.encode() + b"\0")
        h.update(t.detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
    return h.hexdigest()


def train(args) -> int:
    work = Path(args.bucket) if args.bucket else Path(tempfile.mkdtemp(prefix="deltasync-example-"))
    bucket, expected = work / "bucket", work / "expected"
    expected.mkdir(parents=True, exist_ok=True)
    follower = subprocess.Popen([sys.executable, __file__, "--follow", str(bucket), "--expected", str(expected),
                                 "--steps", str(args.steps)])

    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    publisher = deltasync.Publisher(str(bucket), anchor_interval=args.anchor_interval)
    handle = dt.attach(model, opt, publisher)  # publishes version 1, 2, ... after every step
    data = torch.Generator().manual_seed(1)
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        # Toy objective: predict the next token of a fixed-offset sequence.
        tokens = torch.randint(0, VOCAB, (32, CONTEXT), generator=data)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), ((tokens[:, :-1] * 3 + 1) % VOCAB).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()  # the hook snapshots the weights (bf16) and queues version `step`
        digest = bf16_digest(model.named_parameters())
        (expected / f"{step}.tmp").write_text(json.dumps({"version": step, "sha256": digest}))
        (expected / f"{step}.tmp").rename(expected / f"{step}.json")
        if step % 5 == 0 or step == 1:
            result = handle.last_result.result()
            wrote = " + ".join(k for k, on in (("anchor", result.wrote_anchor), ("delta", result.wrote_delta)) if on)
            changed = "?" if result.changed_elements is None else result.changed_elements  # None: recovered
            print(f"trainer: version {step:3d} loss {loss.item():.4f} changed {changed:>6}/"
                  f"{result.total_elements} wrote {wrote} ({result.anchor_bytes + result.delta_bytes} B)", flush=True)
    handle.flush()
    handle.remove()
    publisher.close()
    print(f"trainer: {args.steps} versions published in {time.perf_counter() - t0:.2f}s", flush=True)
    try:
        rc = follower.wait(timeout=60)
    except subprocess.TimeoutExpired:
        follower.kill()
        print("trainer: the replica did not finish in 60 s", file=sys.stderr)
        return 1
    if rc != 0:
        print(f"trainer: the replica process failed (exit {rc})", file=sys.stderr)
        return 1
    print("trainer: the replica was bit-exact at every version")
    return 0


def follow(args) -> int:
    bucket, expected = args.follow, Path(args.expected)
    model = TinyLM().to(torch.bfloat16)  # the replica's own weights (an inference copy)
    targets = model.state_dict()
    replica = None
    deadline = time.monotonic() + 50
    version = 0
    while version < args.steps:
        if time.monotonic() > deadline:
            print(f"replica: timed out at version {version}", file=sys.stderr)
            return 1
        if replica is None:
            if not (Path(bucket) / "manifest.json").exists():
                time.sleep(0.05)
                continue
            replica = deltasync.Replica(bucket)
        if replica.latest_available() <= version:
            time.sleep(0.02)
            continue
        version = replica.update(version + 1)  # every version in turn, verified
        copied = dt.load_into(replica, targets)
        want_file = expected / f"{version}.json"
        while not want_file.exists():
            time.sleep(0.01)
        want = json.loads(want_file.read_text())["sha256"]
        got = bf16_digest(model.named_parameters())
        if got != want:
            print(f"replica: MISMATCH at version {version}: {got} != {want}", file=sys.stderr)
            return 1
        if version % 5 == 0 or version == 1:
            print(f"replica: version {version:3d} bit-exact (copied {copied} elements)", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-6)
    ap.add_argument("--anchor-interval", type=int, default=10)
    ap.add_argument("--bucket", help="work directory (default: a new temporary one)")
    ap.add_argument("--follow", help=argparse.SUPPRESS)    # internal: run as the replica process
    ap.add_argument("--expected", help=argparse.SUPPRESS)
    args = ap.parse_args()
    try:
        return follow(args) if args.follow else train(args)
    except deltasync.Error as e:
        print(f"{'replica' if args.follow else 'trainer'}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
