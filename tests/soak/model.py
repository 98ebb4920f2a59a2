"""The soak's synthetic trainer and its own ground truth.

The trainer is deterministic in (seed, version): version 1 is a random bf16
state, every later version replaces 0.5-3 % of each tensor's elements with new
values drawn from a generator seeded by (seed, version). Any process (the
harness, a publisher process) regenerates the same bytes, and the harness
hashes them with sha256 (`canon_hash`), independently of deltasync's state
hash. A replica's bytes (a `serve --out` file, a `--shm` region, a `pull`
output, a Python `Replica`'s views) are hashed the same way and compared.
"""
import hashlib
import json
import struct

import ml_dtypes
import numpy as np

# ~3.7 MB of bf16 weights with Qwen-like names.
TENSORS = [
    ("model.embed_tokens.weight", (1024, 512)),
    ("model.layers.0.mlp.up_proj.weight", (512, 1024)),
    ("model.layers.0.mlp.down_proj.weight", (1024, 512)),
    ("model.layers.1.self_attn.q_proj.weight", (512, 512)),
    ("model.norm.weight", (512,)),
]


def _bf16_bits(values):
    return values.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


class Trainer:
    """state(v) -> {name: uint16 array of bf16 bits}; cheap for increasing v."""

    def __init__(self, seed):
        self.seed = seed
        self._version = 0
        self._state = None

    def state(self, version):
        if version < 1:
            raise ValueError("versions start at 1")
        if self._state is None or version < self._version:
            rng = np.random.default_rng([self.seed, 0])
            self._state = {n: _bf16_bits(rng.standard_normal(int(np.prod(s))) * 0.02) for n, s in TENSORS}
            self._version = 1
        while self._version < version:
            self._version += 1
            rng = np.random.default_rng([self.seed, self._version])
            for name, _ in TENSORS:
                flat = self._state[name]
                count = max(1, int(flat.size * rng.uniform(0.005, 0.03)))
                flat[rng.integers(0, flat.size, count)] = _bf16_bits(rng.standard_normal(count) * 0.02)
        return self._state

    def tensors(self, version):
        """The state as shaped ml_dtypes.bfloat16 arrays (views; copy to keep)."""
        shapes = dict(TENSORS)
        return {n: a.view(ml_dtypes.bfloat16).reshape(shapes[n]) for n, a in self.state(version).items()}


def canon_hash(named_bytes):
    """sha256 over the tensors sorted by name: name, NUL, the raw bytes."""
    h = hashlib.sha256()
    for name in sorted(named_bytes):
        h.update(name.encode() + b"\0")
        h.update(memoryview(named_bytes[name]).cast("B"))
    return h.hexdigest()


def state_hash(state):
    return canon_hash({n: a.tobytes() for n, a in state.items()})


def write_safetensors(path, state, version):
    shapes = dict(TENSORS)
    header, offset, blobs = {"__metadata__": {"format": "pt", "model_version": str(version)}}, 0, []
    for name in sorted(state):
        data = state[name].tobytes()
        header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for b in blobs:
            f.write(b)


def read_safetensors_hash(path):
    """(metadata dict, canon_hash of its tensors) of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    named = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        named[name] = data[base + a:base + b]
    return meta, canon_hash(named)
