"""The messages of ``deltasync.vllm``: ``init_info`` (:class:`DeltaSyncInitInfo`) and
``update_info`` (:class:`DeltaSyncUpdateInfo`) as vLLM 0.33.0's weight-transfer contract and TRL
hand them over, and the sparse patch (:class:`SparseWeightPatch`, ``apply_patches_to_state_dict``)
the engine delivers changed elements as. Re-exported by ``deltasync.vllm``, their public home.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from . import torch as _dtorch

__all__ = ["DeltaSyncInitInfo", "DeltaSyncUpdateInfo", "SparseWeightPatch", "apply_patches_to_state_dict"]

_STEP_FILE = re.compile(r"step_(\d+)\.safetensors$")


@dataclass
class DeltaSyncInitInfo:
    """``init_info`` of ``/init_weight_transfer_engine``."""

    bucket: str = ""   # the bucket URL (a directory, file://, s3://); else DELTASYNC_BUCKET
    threads: int = 0   # the replica's worker threads (0 = all cores)
    layerwise_reload: bool = True  # reload weights vLLM does not hold as plain tensors layerwise
    verify: bool = False  # read every delivered tensor back from the engine and compare
    shm: str = ""        # the node follower: read versions from this `deltasync serve --shm` region
    shm_url: str = ""    # that daemon's base URL, woken (POST /notify) when the region is behind
    shm_wait_s: float = 60.0  # how long an update waits for the region to reach its version
    shm_token_file: str = ""  # the daemon's --token-file (its bearer token for /notify); else DELTASYNC_SHM_TOKEN_FILE
    double_buffer: bool = False  # node follower: prepare the next version into shadow parameters, swap in the pause
    double_buffer_poll_s: float = 0.01  # the preparing thread's poll of the region (0: no thread, deltasync_prepare)


@dataclass
class DeltaSyncUpdateInfo:
    """``update_info`` of ``/update_weights``.

    ``version``: the version to move to (None: the newest in the manifest).
    TRL's keys are accepted too, so TRL's control plane can drive this
    engine: ``repo_id`` names the bucket and ``filename``
    (``deltas/step_000012.safetensors``) the version; ``update_kind``
    ("dense"/"sparse_flat") is checked but not needed: the replica knows
    whether it loaded an anchor or applied deltas.
    """

    version: int | None = None
    bucket: str = ""
    repo_id: str = ""
    filename: str = ""
    update_kind: str = ""

    def __post_init__(self) -> None:
        if self.update_kind not in ("", "dense", "sparse_flat"):
            raise ValueError(f"unsupported update_kind {self.update_kind!r} (dense, sparse_flat)")
        if self.version is None and self.filename:
            m = _STEP_FILE.search(self.filename)
            if m is None:
                raise ValueError(f"filename {self.filename!r} does not name a version (step_NNNNNN.safetensors)")
            self.version = int(m.group(1))
        if self.version is not None:
            self.version = int(self.version)
            if self.version < 1:
                raise ValueError(f"version must be >= 1, got {self.version}")
        if not self.bucket:
            self.bucket = self.repo_id


@dataclass
class SparseWeightPatch:
    """Changed elements of one weight, in checkpoint coordinates.

    The fields of vLLM 0.33.0's ``sparse_nccl_engine.SparseWeightPatch``:
    flat (row-major) ``indices`` (int64, ascending), ``values`` (1-D, the
    weight's dtype: absolute new values, not increments) and the weight's
    ``full_shape``.
    """

    name: str
    indices: torch.Tensor
    values: torch.Tensor
    full_shape: tuple[int, ...] = field(default_factory=tuple)


def apply_patches_to_state_dict(state_dict, patches: Iterable[SparseWeightPatch]) -> int:
    """Applies patches to plain torch tensors (no vLLM); returns the elements set."""
    n = 0
    with torch.no_grad():
        for p in patches:
            dst = state_dict[p.name]
            idx = p.indices.to(device=dst.device, dtype=torch.int64)
            _dtorch._flat_put(dst, idx, p.values.to(device=dst.device, dtype=dst.dtype))
            n += idx.numel()
    return n
