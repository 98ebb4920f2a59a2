"""Changed elements by flat index, for the node follower's pause (deltasync.vllm).

CPU tensors go through ``_native.gather_elements`` / ``scatter_elements``
(no GIL, every core the process may run on: the engine is paused while they
run); other devices through torch's ``index_select`` / ``index_copy_``.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from . import _native

__all__ = ["put_elements", "take_elements"]


def _threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def take_elements(src: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    """``src[idx]`` for a flat contiguous CPU tensor and int64 indices (IndexError when one is out of range)."""
    out = torch.empty(len(idx), dtype=src.dtype)
    _native.gather_elements(src, idx, out, _threads())
    return out


def put_elements(dst: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor, *, offset: int = 0, cols: int = 1,
                 c0: int = 0, k: int | None = None) -> None:
    """Writes ``vals`` at the ascending flat indices ``idx`` (of a row-major source of ``cols``
    columns) into the flat contiguous ``dst``: at ``idx - offset``, or, with ``k`` < ``cols``,
    only the columns ``[c0, c0 + k)``, into a destination of ``k`` columns (a row-parallel shard).
    Nothing is written when an index falls outside ``dst`` (IndexError)."""
    k = cols if k is None else k
    if dst.device.type == "cpu" and vals.device.type == "cpu" and idx.device.type == "cpu":
        _native.scatter_elements(dst, idx.contiguous(), vals.contiguous(), offset, cols, c0, k, _threads())
        return
    idx, vals = idx.to(dst.device), vals.to(dst.device)
    if k != cols:
        j = idx - offset
        c = j % cols
        keep = (c >= c0) & (c < c0 + k)
        j, c, vals = j[keep], c[keep], vals[keep]
        dst.index_copy_(0, (j // cols) * k + (c - c0), vals)
    else:
        dst.index_copy_(0, idx - offset if offset else idx, vals)
