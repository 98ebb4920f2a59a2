"""The node follower's pause: this worker's changed elements, out of the ``--shm`` region and into its parameters.

A ``Plan`` knows, for each checkpoint tensor of the region whose parameter
this worker writes in place, which part of the tensor the worker holds
(``Place``: a flat range of whole rows, optionally only some columns of each
row for a row-parallel shard) and where that part starts in the parameter.
``read`` runs inside ``Region.take``'s seqlock bracket: one native call
(``_native.shm_take_jobs``, off the GIL, on the worker's cores) copies only
this worker's changed elements into buffers the plan keeps across updates,
each index already mapped to its place in the parameter; nothing else is
written. ``scatter`` writes the buffers into the parameters, after the
bracket held (``_native.shm_scatter_jobs``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import _native
from ._elements import _threads

__all__ = ["Place", "Plan"]

_TAKE_COLS = 11
_BAD = {1: "the change list of {!r} lies outside its area",
        2: "the change list of {!r} is not strictly ascending or names an element outside the tensor"}


@dataclass
class Place:
    """Where this worker's part of one checkpoint tensor (of ``shape``) lies in its parameter.

    ``dst`` is the parameter's flat contiguous data. The part is the flat
    range ``[lo, hi)`` of whole rows of ``cols`` columns; with ``k`` <
    ``cols`` only the columns ``[c0, c0 + k)`` of each row, packed as rows of
    ``k``. Element ``lo`` goes to ``dst[base]``.
    """

    dst: torch.Tensor
    shape: tuple
    lo: int
    hi: int
    cols: int = 1
    c0: int = 0
    k: int = 0
    base: int = 0


class Plan:
    """The take and scatter jobs of one worker over one region, with buffers reused across updates."""

    def __init__(self, region, places: dict[str, Place], threads: int | None = None) -> None:
        """Plans the tensors of ``places`` that the region holds with the same shape and dtype, on a CPU
        parameter of fewer than 2^32 elements; the rest (``unplanned``) go by the caller's route."""
        self.threads = threads or _threads()
        self.generation = region.generation
        self.names, self._dst, rows = [], [], []
        for name, pl in places.items():
            held = region.tensors.get(name)
            if held is None or pl.dst.device.type != "cpu" or not pl.dst.is_contiguous():
                continue
            e, view = held
            if tuple(view.shape) != tuple(pl.shape) or view.dtype != pl.dst.dtype or pl.dst.numel() >= 1 << 32:
                continue
            item = view.element_size()
            k = pl.k or pl.cols
            data_off = region.data_offsets[name]
            rows.append([e * 8, data_off, item, view.numel(), pl.lo, pl.hi, pl.cols, pl.c0, k, pl.base,
                         pl.dst.numel()])
            self.names.append(name)
            self._dst.append(pl.dst)
        self.jobs = np.array(rows, dtype=np.int64).reshape(-1, _TAKE_COLS)
        self.result = np.zeros((len(self.names), 3), dtype=np.int64)
        self.items = self.jobs[:, 2].copy()
        # Buffers sized for a complete change list spread evenly (the region's capacity times this
        # worker's share of the elements); grown, never shrunk, when an update needs more.
        share = float((self.jobs[:, 5] - self.jobs[:, 4]).sum()) / max(1, region.total_elements)
        self._idx = np.empty(0, np.uint32)
        self._val = np.empty(0, np.uint8)
        self._grow(int(region.changes_capacity * share), int(region.changes_capacity * share * 2) + 8 * len(rows))
        self.taken = False

    def _grow(self, slots: int, val_bytes: int) -> None:
        if slots > len(self._idx):
            self._idx = np.empty(slots, np.uint32)
            self._idx.fill(0)  # the pages now, not as faults inside the pause
        if val_bytes > len(self._val):
            self._val = np.empty(val_bytes, np.uint8)
            self._val.fill(0)

    def read(self, region) -> str | None:
        """Copies the planned changed elements of the region's current change lists into the
        buffers. Call only inside a seqlock bracket; the copy counts only when it held. Returns a
        description of a malformed change list (garbage when the bracket failed), None when done."""
        self.taken = False
        while True:
            code, bad, slots, val_bytes = _native.shm_take_jobs(
                region.raw, region.changes_lo, region.changes_hi, self.jobs, self._idx, self._val, self.result,
                self.threads)
            if code == 3:  # more changes than the buffers hold: grow them (a quarter more) and copy again
                self._grow(slots + slots // 4, val_bytes + val_bytes // 4)
                continue
            if code:
                return f"the --shm region {region.name!r}: " + _BAD[code].format(self.names[bad])
            self.taken = True
            return None

    def retarget(self, dst) -> None:
        """Makes ``dst`` (flat tensors, one per planned tensor, as ``scatter``'s) the parameters'
        storage from now on: after the double buffer swapped the parameters to their shadows."""
        self.scatter_check(dst)
        self._dst = list(dst)

    def scatter_check(self, dst) -> None:
        if len(dst) != len(self._dst) or any(
                d.numel() != o.numel() or d.dtype != o.dtype or d.device.type != "cpu" or not d.is_contiguous()
                for d, o in zip(dst, self._dst)):
            raise ValueError("deltasync: a scatter's other destinations must match the plan's, one for one")

    def counts(self) -> dict[str, int]:
        """Elements taken per planned tensor (this worker's part) by the last successful read."""
        return dict(zip(self.names, self.result[:, 0].tolist()))

    def scatter(self, skip=(), dst=None) -> int:
        """Writes the last read into the parameters (but not those of ``skip``); the elements written.

        ``dst``: other flat tensors to write into instead, one per planned tensor (``names``), each
        of the numel, dtype and device of the parameter's (the double buffer's shadows)."""
        if not self.taken:
            raise RuntimeError("deltasync: the node follower's scatter has no read to write")
        if dst is not None:
            self.scatter_check(dst)
        else:
            dst = self._dst
        keep = self.result[:, 0] > 0
        if skip:
            keep &= np.array([n not in skip for n in self.names], dtype=bool)
        sel = np.nonzero(keep)[0]
        jobs = np.empty((len(sel), 6), dtype=np.int64)
        jobs[:, 0] = [dst[i].data_ptr() for i in sel]
        jobs[:, 1] = self.jobs[sel, 10]
        jobs[:, 2] = self.items[sel]
        jobs[:, 3:6] = self.result[sel]
        _native.shm_scatter_jobs(jobs, self._idx, self._val, self.threads)
        return int(jobs[:, 3].sum())
