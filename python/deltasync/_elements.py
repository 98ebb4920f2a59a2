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
from ._torch_common import bits_view

__all__ = ["put_elements", "take_elements"]


def _threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def take_elements(src: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    """``src[idx]`` for a flat contiguous CPU tensor and int64 indices (IndexError when one is out of range)."""
    out = torch.empty(len(idx), dtype=src.dtype)
    # On the bit patterns: the native call cannot take F8 tensors (no DLPack dtype for them).
    _native.gather_elements(bits_view(src), idx, bits_view(out), _threads())
    return out


def put_elements(dst: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor, *, offset: int = 0, cols: int = 1,
                 c0: int = 0, k: int | None = None) -> None:
    """Writes ``vals`` at the ascending flat indices ``idx`` (of a row-major source of ``cols``
    columns) into the flat contiguous ``dst``: at ``idx - offset``, or, with ``k`` < ``cols``,
    only the columns ``[c0, c0 + k)``, into a destination of ``k`` columns (a row-parallel shard).
    Nothing is written when an index falls outside ``dst`` (IndexError)."""
    k = cols if k is None else k
    if dst.device.type == "cpu" and vals.device.type == "cpu" and idx.device.type == "cpu":
        _native.scatter_elements(bits_view(dst), idx.contiguous(), bits_view(vals.contiguous()), offset, cols, c0, k,
                                 _threads())
        return
    _put_with_torch(dst, idx, vals, offset, cols, c0, k)


def _put_with_torch(dst: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor, offset: int, cols: int, c0: int,
                    k: int) -> None:
    """put_elements through torch's own ops, on ``dst``'s device: on the bit patterns (signed
    integers of the element's width), since torch has no ``index_copy_`` for F8 and the unsigned
    dtypes on some devices (session 51)."""
    idx, vals = idx.to(dst.device), bits_view(vals.to(dst.device))
    dst = bits_view(dst)
    if k != cols:
        j = idx - offset
        c = j % cols
        keep = (c >= c0) & (c < c0 + k)
        j, c, vals = j[keep], c[keep], vals[keep]
        dst.index_copy_(0, (j // cols) * k + (c - c0), vals)
    else:
        dst.index_copy_(0, idx - offset if offset else idx, vals)
