"""Reading the ``deltasync serve --shm`` region (docs/shm.md, layout version 1) from Python.

The node follower of ``deltasync.vllm``: one daemon per node downloads,
decodes and verifies every version once and keeps it in a POSIX
shared-memory object; each worker maps it read-only and copies out, inside
one seqlock bracket, only what it needs: the changed indices and values of
the newest move when the region moved from the version the worker holds
(``base_version``, ``changes_complete``), else whole tensors. A copy counts
only when the sequence counter was the same even value before and after it;
nothing read inside a failed bracket is ever used.

Linux (``/dev/shm``). The seqlock's loads are plain aligned 8-byte loads,
which x86-64 orders as the protocol needs (acquire on every load).
"""
from __future__ import annotations

import mmap
import os
import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ._elements import take_elements
from ._errors import CorruptionError, FailedPreconditionError, NotFoundError

__all__ = ["Region", "Taken"]

_LAYOUT_VERSION = 1
_HEADER_BYTES = 256
_ENTRY_BYTES = 128
# header fields (byte offsets), docs/shm.md
_SEQ, _VERSION, _HASH_HI, _HASH_LO, _BASE = 16, 24, 32, 40, 48
_COMPLETE, _FLAGS, _REGION_BYTES, _COUNT, _TABLE = 56, 60, 72, 80, 88
_CHANGES_OFF, _CHANGES_CAP, _WRITER_PID = 128, 136, 152
_FLAG_CLOSED = 1
_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8,
           "BOOL": torch.bool}


@dataclass
class Taken:
    """One consistent copy out of the region at ``version``.

    ``changes`` None: ``src`` holds every tensor whole (a dense copy).
    Otherwise ``changes[name]`` are the flat indices (int64, ascending) that
    differ from ``base_version`` and ``values[name]`` their new values; ``src``
    then holds whole copies only when asked (``full``), else shape-only
    ``meta`` tensors (reading their contents fails loudly).
    """

    version: int
    state_hash: str
    base_version: int
    src: dict[str, torch.Tensor]
    changes: dict[str, np.ndarray] | None
    values: dict[str, torch.Tensor] | None
    retries: int = 0
    planned: dict[str, int] | None = None  # a plan's tensors: elements taken into its buffers


class Region:
    """A read-only mapping of the ``--shm`` region ``name`` (``/dev/shm/NAME``)."""

    def __init__(self, name: str) -> None:
        self.name = name.lstrip("/")
        self.path = os.path.join("/dev/shm", self.name)
        self._mm = None
        self._open()

    def _open(self) -> None:
        label = f"the --shm region {self.name!r}"
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFoundError(f"{label} does not exist: start `deltasync serve BUCKET --shm {self.name}` on "
                                "this node (it creates the region when it holds its first version)") from None
        try:
            st = os.fstat(fd)
            if st.st_size < _HEADER_BYTES:
                raise NotFoundError(f"{label} is being created; retry")
            # MAP_POPULATE: the page-table entries now, not page faults inside the pause
            mm = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), mmap.PROT_READ)
        finally:
            os.close(fd)
        if bytes(mm[0:8]) == bytes(8):
            mm.close()
            raise NotFoundError(f"{label} is being created; retry")
        if bytes(mm[0:8]) != b"DSYNCSHM":
            mm.close()
            raise CorruptionError(f"{label}: bad magic; not a deltasync region")
        u32 = np.frombuffer(mm, dtype="<u4", count=_HEADER_BYTES // 4)
        u64 = np.frombuffer(mm, dtype="<u8", count=st.st_size // 8)
        if int(u32[2]) != _LAYOUT_VERSION:
            raise FailedPreconditionError(f"{label}: layout version {int(u32[2])}, this reader knows "
                                          f"{_LAYOUT_VERSION}: upgrade deltasync on the engine's side")
        size = st.st_size
        count, table = int(u64[_COUNT // 8]), int(u64[_TABLE // 8])
        changes_off, cap = int(u64[_CHANGES_OFF // 8]), int(u64[_CHANGES_CAP // 8])
        if (int(u32[3]) != _HEADER_BYTES or int(u64[_REGION_BYTES // 8]) > size
                or table + count * _ENTRY_BYTES > size or changes_off % 8 or changes_off + 8 * cap > size):
            raise CorruptionError(f"{label}: header sizes disagree with the layout or the object's size")
        self.changes_lo, self.changes_hi = changes_off // 8, changes_off // 8 + cap  # u64 slots
        self.changes_capacity = cap
        self.tensors: dict[str, tuple[int, torch.Tensor]] = {}  # name -> (entry u64 index, read-only view)
        self.data_offsets: dict[str, int] = {}
        self.raw = np.frombuffer(mm, dtype=np.uint8)  # the whole region, for _native.shm_take_jobs
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*not writable.*")  # read-only by contract
            raw = torch.from_numpy(self.raw)
        for i in range(count):
            e = table + i * _ENTRY_BYTES
            name_off, name_len, ndim = int(u64[e // 8]), int(u32_at(mm, e + 8)), int(u32_at(mm, e + 12))
            dtype_s = bytes(mm[e + 16:e + 24]).rstrip(b"\0").decode()
            data_off, data_bytes = int(u64[(e + 24) // 8]), int(u64[(e + 32) // 8])
            shape = [int(x) for x in u64[(e + 56) // 8:(e + 56) // 8 + ndim]]
            name = bytes(mm[name_off:name_off + name_len]).decode()
            dtype = _DTYPES.get(dtype_s)
            if dtype is None or ndim > 8 or data_off + data_bytes > size or \
                    int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != data_bytes:
                raise CorruptionError(f"{label}: tensor entry {i} ({name!r}, {dtype_s}) is malformed")
            view = raw[data_off:data_off + data_bytes].view(dtype).view(shape)
            self.tensors[name] = (e // 8, view)
            self.data_offsets[name] = data_off
        self.total_elements = sum(v.numel() for _, v in self.tensors.values())
        self.generation = getattr(self, "generation", 0) + 1  # a re-mapped region: plans over it are stale
        self._mm, self._u64, self._u32, self._ino = mm, u64, u32, st.st_ino

    # --- the header, unbracketed (a hint; take() decides) ------------------------------------
    def _seq(self) -> int:
        return int(self._u64[_SEQ // 8])

    @property
    def version(self) -> int:
        return int(self._u64[_VERSION // 8])

    @property
    def base_version(self) -> int:
        """The version the change lists start from (a hint, unbracketed; take() decides)."""
        return int(self._u64[_BASE // 8])

    @property
    def changes_complete(self) -> bool:
        """Whether the change lists hold the whole move from ``base_version`` (a hint)."""
        return int(self._u32[_COMPLETE // 4]) == 1

    def check_alive(self) -> None:
        """Raises FailedPreconditionError when the writer stopped (closed) or died; re-maps a
        region a restarted daemon created under the same name."""
        if int(self._u32[_FLAGS // 4]) & _FLAG_CLOSED or not _alive(int(self._u64[_WRITER_PID // 8])):
            try:
                replaced = os.stat(self.path).st_ino != self._ino
            except FileNotFoundError:
                replaced = False
            if replaced:
                self._open()
                return
            why = "was closed (its daemon stopped)" if int(self._u32[_FLAGS // 4]) & _FLAG_CLOSED else \
                f"has no writer (process {int(self._u64[_WRITER_PID // 8])} is gone)"
            raise FailedPreconditionError(
                f"the --shm region {self.name!r} {why}: restart `deltasync serve BUCKET --shm {self.name}` on "
                "this node; the engine keeps the version it holds")

    # --- one consistent copy ------------------------------------------------------------------
    def take(self, version: int, have: int | None, *, full: bool, timeout: float = 10, plan=None) -> Taken | None:
        """Copies ``version`` out of the region; None when the region holds another version.

        Sparse (indices and values of the changed elements) when the region
        moved from ``have`` and its change lists are complete, dense (every
        tensor whole) otherwise; ``full`` adds whole copies to a sparse take.
        Retries while the writer is inside or moved on during the copy;
        CorruptionError for a change list outside its area in a stable copy.
        A sparse take with a ``plan`` (``_shm_plan.Plan`` over this mapping)
        copies the planned tensors' changes into the plan's buffers
        (``Taken.planned``: elements per tensor), not into ``changes``.
        """
        if plan is not None and plan.generation != self.generation:
            raise RuntimeError("deltasync: a --shm plan of an earlier mapping of the region; plan again")
        deadline, retries = time.monotonic() + timeout, 0
        while True:
            s1 = self._seq()
            if s1 & 1 == 0:
                try:
                    got = self._copy(version, have, full, plan)
                except (IndexError, RuntimeError) as e:  # garbage read while the writer moved on
                    got = e
                if self._seq() == s1:  # the bracket held: the copy is one version's
                    if isinstance(got, Exception):
                        raise got
                    if isinstance(got, Taken):
                        got.retries = retries
                    if isinstance(got, str):
                        raise CorruptionError(got)
                    return got
            retries += 1
            if time.monotonic() > deadline:
                raise TimeoutError(f"the --shm region {self.name!r} stayed busy for {timeout} s (its writer "
                                   "was always inside a write); retry")
            time.sleep(0.0002)

    def _copy(self, version: int, have: int | None, full: bool, plan):
        u64 = self._u64
        if int(u64[_VERSION // 8]) != version:
            return None
        base = int(u64[_BASE // 8])
        state_hash = f"{int(u64[_HASH_HI // 8]):016x}{int(u64[_HASH_LO // 8]):016x}"
        sparse = have is not None and base == have and int(self._u32[_COMPLETE // 4]) == 1
        if not sparse:
            src = {n: v.clone() for n, (_, v) in self.tensors.items()}
            return Taken(version, state_hash, base, src, None, None)
        changes, values, planned = {}, {}, None
        if plan is not None:
            bad = plan.read(self)
            if bad:
                return bad
            planned = plan.counts()
        for name, (e, view) in self.tensors.items():
            if planned is not None and name in planned:
                continue
            off, cnt = int(u64[e + 5]), int(u64[e + 6])
            if off % 8 or off // 8 < self.changes_lo or off // 8 + cnt > self.changes_hi:
                return f"the --shm region {self.name!r}: the change list of {name!r} lies outside its area"
            idx = u64[off // 8:off // 8 + cnt].view(np.int64).copy()
            changes[name] = idx
            values[name] = take_elements(view.reshape(-1), idx)
        if full:
            src = {n: v.clone() for n, (_, v) in self.tensors.items()}
        else:
            src = {n: torch.empty(v.shape, dtype=v.dtype, device="meta") for n, (_, v) in self.tensors.items()}
        return Taken(version, state_hash, base, src, changes, values, planned=planned)


def u32_at(mm, off: int) -> int:
    return int.from_bytes(mm[off:off + 4], "little")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

