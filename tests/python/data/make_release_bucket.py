"""Writes a small bucket with this release's CLI, kept in the tree so that later releases prove they still read it.

    python tests/python/data/make_release_bucket.py BIN OUT_DIR

BIN is the `deltasync` binary of the release that writes the bucket; OUT_DIR gets `bucket/` (what `publish` wrote)
and `expected/vN.safetensors` (the state each version must pull to). Run once per release that changes what a
bucket holds (a stream, container or manifest version); the test (test_release_buckets.py) reads every such folder.
The versions exercise: anchors at the interval (1, 4), compact deltas (2, 3, 4; 3 changes enough elements for
stream version 3, the others are small enough for version 2), a settings change to gap_delta
with cumulative deltas (5, 6), a change back to compact (7), an unchanged version (8); bf16, fp16 and fp32 tensors,
one of them 0-d and one of 0 elements. `expected/` holds the
state as published (fp32 tensors rounded to bf16).
"""
import subprocess
import sys
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy)
import numpy as np
from safetensors.numpy import save_file

BF16 = ml_dtypes.bfloat16


def state(rng, prev, fraction=0.04):
    """The next version's tensors: `fraction` of each tensor's elements moved by a small random step."""
    if prev is None:
        return {
            "model.embed_tokens.weight": rng.standard_normal((128, 64)).astype(BF16),
            "model.layers.0.mlp.up_proj.weight": (rng.standard_normal((64, 32)) * 0.02).astype(BF16),
            "model.layers.0.input_layernorm.weight": np.ones(32, np.float32),
            "model.layers.0.self_attn.q_proj.weight": (rng.standard_normal((32, 32)) * 0.05).astype(np.float16),
            "model.scale": np.array(0.5, BF16),
            "model.empty": np.zeros((0, 4), BF16),
        }
    out = {}
    for name, t in prev.items():
        t = t.copy()
        if t.size:
            flat = t.reshape(-1)
            pick = rng.random(flat.size) < fraction
            wide = flat.astype(np.float32)
            wide[pick] += (rng.standard_normal(int(pick.sum())) * np.abs(wide[pick]) * 0.02).astype(np.float32)
            flat[:] = wide.astype(t.dtype)
        out[name] = t
    return out


def main(binary: str, out_dir: str) -> None:
    out = Path(out_dir)
    bucket, expected, inputs = out / "bucket", out / "expected", out / "inputs"
    for d in (expected, inputs):
        d.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(52)
    flags = {1: ["--anchor-interval", "4"], 5: ["--encoding", "gap_delta", "--cumulative-every", "2", "--change-settings"],
             7: ["--encoding", "compact", "--cumulative-every", "0", "--change-settings"]}
    tensors = None
    for v in range(1, 9):
        if v != 8:  # 8: the same weights as 7
            tensors = state(rng, tensors, 0.6 if v == 3 else 0.04)
        path = inputs / f"v{v}.safetensors"
        save_file(tensors, str(path))
        subprocess.run([binary, "publish", str(bucket), str(path), "--version", str(v), "--quiet", *flags.get(v, [])],
                       check=True)
        # As published: fp32 rounded to bf16 (to nearest, ties to even, as ml_dtypes rounds), the rest as it is.
        published = {k: t.astype(BF16) if t.dtype == np.float32 else t for k, t in tensors.items()}
        save_file(published, str(expected / f"v{v}.safetensors"))
    for p in inputs.iterdir():
        p.unlink()
    inputs.rmdir()
    print(subprocess.run([binary, "log", str(bucket)], check=True, capture_output=True, text=True).stdout)


if __name__ == "__main__":
    main(*sys.argv[1:3])
