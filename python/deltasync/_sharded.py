"""Sharded trainers: every rank publishes its own part (docs/format.md, "Parts").

``deltasync.torch.attach(model, optimizer, ShardedPublisher(bucket))`` (or
the single-process call with a ``deltasync.Publisher``, see
:func:`from_publisher`) on every rank of a ``torch.distributed`` job: each parameter's local block is
derived from its DTensor placements (FSDP2 ``Shard(0)``, ``Shard(k)``, HSDP
where only the replica group at coordinate 0 publishes, FSDP2+TP's even
``_StridedShard`` row ranges, sub-mesh replicas published once; a plain
tensor is published whole by rank 0), the layout is exchanged once at attach, and after
every ``optimizer.step()`` each rank publishes its part in the background and
rank 0 commits the version. Receipts and the outcome travel on a dedicated
gloo group created at attach, never on the trainer's own group.
"""
from __future__ import annotations

import hashlib
import math
import os
import queue
import threading
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from . import _native
from ._errors import FailedPreconditionError, InvalidArgumentError
from ._torch_common import _published_dtype as _published_torch_dtype

__all__ = ["ShardedHandle", "ShardedPublisher", "attach"]

_DTYPE_NAME = {
    torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16", torch.float64: "F64",
    torch.int8: "I8", torch.uint8: "U8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
    torch.bool: "BOOL",
}


class ShardedPublisher:
    """Where and how the ranks of a sharded trainer publish (opened at :func:`attach`).

    The same on every rank. Parted buckets are compact, with the fixed anchor
    cadence (cumulative deltas and adaptive anchors are refused).
    """

    def __init__(self, bucket: Any, *, anchor_interval: int | None = None, threads: int = 0,
                 allow_nonfinite: bool = False, allow_version_jump: bool = False, create_bucket: bool = False,
                 max_pending: int = 2):
        self.bucket = os.path.expanduser(os.fspath(bucket) if isinstance(bucket, os.PathLike) else str(bucket))
        self.anchor_interval = anchor_interval
        self.threads = threads
        self.allow_nonfinite = allow_nonfinite
        self.allow_version_jump = allow_version_jump
        self.create_bucket = create_bucket
        self.max_pending = max_pending


# Publisher settings that parted publishing does not have: (option, test, why).
_PARTED_REFUSES = (
    ("encoding", lambda v: v not in (None, "compact"), "parts are compact only (TRL encodings stay single-part)"),
    ("cumulative_interval", lambda v: bool(v), "cumulative deltas keep a second copy of every block"),
    ("anchor_max_fraction", lambda v: bool(v), "adaptive anchors keep a second copy of every block"),
    ("change_settings", lambda v: v, "the ranks cannot change the bucket's stored settings"),
    ("notify", lambda v: bool(v), "the committing rank does not notify replicas"),
    ("measure_gap_delta", lambda v: v, "parts do not measure the TRL gap_delta size"),
)


def from_publisher(publisher, world: int) -> ShardedPublisher:
    """The parted form of a deltasync.Publisher's bucket and settings (attach under torch.distributed).

    Settings parted publishing does not support are refused, naming the setting.
    """
    o = publisher._options
    for option, refused, why in _PARTED_REFUSES:
        if refused(o[option]):
            raise InvalidArgumentError(
                f"attach: under torch.distributed (world size {world}) every rank publishes its own part of each "
                f"version, and parts do not support Publisher({option}={o[option]!r}): {why}; leave {option} out, "
                "or gather the full weights and publish them from one rank with deltasync.torch.publish()")
    return ShardedPublisher(publisher.bucket, anchor_interval=o["anchor_interval"], threads=o["threads"],
                            allow_nonfinite=o["allow_nonfinite"], allow_version_jump=o["allow_version_jump"],
                            create_bucket=o["create_bucket"], max_pending=publisher.max_pending)


def _published_dtype(name: str, dtype: torch.dtype) -> str:
    if dtype not in _DTYPE_NAME:
        raise InvalidArgumentError(f"attach: parameter '{name}' has dtype {dtype}, which cannot be published")
    return _DTYPE_NAME[_published_torch_dtype(name, dtype)]  # the one rule (fp32 -> BF16 unless kept)


def _local_block(name: str, p: torch.Tensor, rank: int):
    """(offset, shape, local tensor, publishes) of the block this rank holds, or None.

    ``publishes`` is False for a copy that another rank publishes: a plain
    tensor off rank 0, a replica group off coordinate 0 (HSDP)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard
    if not isinstance(p, DTensor):
        # Replicated on every rank (DDP, or not wrapped): rank 0 publishes it.
        return (0,) * p.dim(), tuple(p.shape), p.detach(), rank == 0
    mesh, placements = p.device_mesh, p.placements
    for pl in placements:
        # Partial holds sums, not values.
        if type(pl) is not Shard and type(pl) is not Replicate and not _is_strided(pl):
            raise InvalidArgumentError(
                f"attach: parameter '{name}' has placement {pl!r}, which deltasync cannot map to a block "
                "(it knows Shard(k), Replicate() and FSDP2+TP's _StridedShard); publish it gathered instead")
    if any(_is_strided(pl) for pl in placements):
        _check_strided(name, p.shape, mesh, placements)
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None
    # Another replica group publishes it (HSDP).
    publishes = not any(type(pl) is Replicate and coordinate[i] != 0 for i, pl in enumerate(placements))
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    shape, offset = compute_local_shape_and_global_offset(p.shape, mesh, placements)
    local = p.to_local().detach()
    if tuple(local.shape) != tuple(shape):
        raise InvalidArgumentError(
            f"attach: parameter '{name}': its local shard is {tuple(local.shape)} but its placements "
            f"{placements} give {tuple(shape)}; deltasync cannot tell which elements it holds")
    if math.prod(shape) == 0:
        return None
    return tuple(int(o) for o in offset), tuple(int(s) for s in shape), local, publishes


def _may_be_copied(p: torch.Tensor, world: int) -> bool:
    """Whether other ranks may hold the same block: a plain tensor, a Replicate placement, a sub-mesh."""
    from torch.distributed.tensor import DTensor, Replicate
    return (not isinstance(p, DTensor) or p.device_mesh.size() < world
            or any(type(pl) is Replicate for pl in p.placements))


def _digest(name: str, t: torch.Tensor) -> str:
    """A digest of the block as it would be published (fp32 rounded to bf16)."""
    t = t.detach().to("cpu", dtype=_published_torch_dtype(name, t.dtype), copy=True).contiguous()
    return hashlib.blake2b(t.reshape(-1).view(torch.uint8).numpy(), digest_size=16).hexdigest()


def _check_copies_agree(copies_of_everyone) -> None:
    """Ranks holding one block (replica groups, data-parallel or tensor-parallel copies) must hold the
    same values: only one of them publishes it, so a disagreement would go unnoticed. Raised on every rank."""
    first: dict = {}
    for r, copies in enumerate(copies_of_everyone):
        for name, offset, shape, digest in copies:
            r0, d0 = first.setdefault((name, offset, shape), (r, digest))
            if d0 != digest:
                raise InvalidArgumentError(
                    f"attach: parameter '{name}': ranks {r0} and {r} hold different values for its block at "
                    f"offset {list(offset)}, shape {list(shape)}, which both hold a copy of (replica groups, "
                    "data-parallel or tensor-parallel copies) and only one would publish; initialize or load "
                    "them identically (the same seed, or a broadcast) before attach")


def _is_strided(pl) -> bool:
    from torch.distributed.tensor.placement_types import _StridedShard
    return isinstance(pl, _StridedShard)


def _check_strided(name: str, shape, mesh, placements) -> None:
    """FSDP2 over a tensor-parallel parameter: ``(_StridedShard(d, sf), Shard(d))`` on a 2-D mesh.

    Each rank then holds one row range of the full tensor (the FSDP chunk of
    its TP chunk), which torch's ``compute_local_shape_and_global_offset``
    gives exactly when every split of dim d is even; anything else is
    refused, naming the parameter (an uneven strided split is not one block
    torch describes reliably).
    """
    from torch.distributed.tensor import Shard
    strided = [(i, pl) for i, pl in enumerate(placements) if _is_strided(pl)]
    if mesh.ndim != 2 or len(strided) != 1:
        raise InvalidArgumentError(
            f"attach: parameter '{name}' has placements {tuple(placements)} on a {mesh.ndim}-D mesh; deltasync maps "
            "_StridedShard only as FSDP2+TP makes it (one _StridedShard on a 2-D mesh); publish it gathered instead")
    dim = strided[0][1].dim
    splits = math.prod(mesh.size(i) for i, pl in enumerate(placements) if isinstance(pl, Shard) and pl.dim == dim)
    if shape[dim] % splits:
        raise InvalidArgumentError(
            f"attach: parameter '{name}' (shape {tuple(shape)}) is split {splits} ways along dim {dim} by FSDP2+TP "
            f"({tuple(placements)}), and {shape[dim]} does not divide by {splits}: deltasync maps FSDP2+TP shards "
            "only when they are even; pad that dimension to a multiple of the data- x tensor-parallel size, or "
            "publish it gathered")


def _refuse_fsdp1(model) -> None:
    """FSDP1 (FullyShardedDataParallel) flattens parameters into per-rank shards: with
    use_orig_params each parameter is a 1-D piece of its flat shard (the same shape on every
    rank when the pieces are even), not a block deltasync can place in the tensor."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        raise InvalidArgumentError(
            "attach: the model is wrapped in FSDP1 (FullyShardedDataParallel), whose parameters are flattened "
            "per-rank pieces deltasync cannot place in their tensors; shard it with FSDP2's fully_shard, or "
            "gather the full state dict on rank 0 and publish it with deltasync.torch.publish()")


def _drop_replicated_blocks(everyone):
    """Blocks that several ranks hold identically (a DTensor on a sub-mesh, e.g. FSDP2+TP's
    parameters that only FSDP shards: replicas across the TP dimension) are kept on the lowest
    rank only. Returns per rank the set of (name, offset, shape) it does not publish."""
    owner, dropped = {}, [set() for _ in everyone]
    for r, entries in enumerate(everyone):
        for e in entries:
            if e[3] is None:
                continue
            key = (e[0], tuple(e[3]), tuple(e[4]))
            if key in owner:
                dropped[r].add(key)
            else:
                owner[key] = r
    return dropped


def _local(p: torch.Tensor) -> torch.Tensor:
    """A parameter's local shard (the tensor itself when it is not a DTensor)."""
    to_local = getattr(p, "to_local", None)
    return (to_local() if callable(to_local) else p).detach()


def _host_array(name: str, t: torch.Tensor) -> tuple[np.ndarray, str]:
    """A private host copy of a local block, as the native side takes it."""
    t = t.detach().to("cpu", copy=True).contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), "BF16"
    return t.numpy(), ""


class ShardedHandle:
    """What :func:`attach` returns for a sharded trainer. ``flush()`` waits, ``remove()`` stops."""

    def __init__(self, publisher: ShardedPublisher, blocks, layout, part, group, start_version: int,
                 background: bool):
        self.publisher = publisher
        self._blocks = blocks  # [(name, parameter)] whose local block this rank publishes
        self._layout = layout
        self._part = part      # this rank's part index, or None
        self._group = group
        self._rank = dist.get_rank()
        self.next_version = start_version
        self._background = background
        self._error: BaseException | None = None
        self._hook = None
        self._native = None
        self._committer = None
        self.last_stats: dict | None = None   # rank 0: the last commit's stats
        self.fail_next_publish = False         # tests: this rank's next part fails
        tensors, parts = layout
        if part is not None:
            self._native = _native.PartPublisher(
                publisher.bucket, tensors, parts, part, publisher.anchor_interval, publisher.threads,
                publisher.allow_nonfinite, publisher.allow_version_jump, publisher.create_bucket)
        if self._rank == 0:
            self._committer = _native.PartCommitter(publisher.bucket, tensors, parts, publisher.anchor_interval,
                                                    publisher.allow_version_jump, publisher.create_bucket)
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, int(publisher.max_pending)))
        self._thread = None
        if background:
            self._thread = threading.Thread(target=self._worker, name="deltasync-sharded", daemon=True)
            self._thread.start()

    # -- on the training thread ------------------------------------------
    def _on_step(self, optimizer, args, kwargs) -> None:
        # Every step is queued on every rank, even one that then raises an
        # earlier version's failure: the ranks see a failure at different
        # steps (each at its first step after the outcome), and a step queued
        # on one rank but not on another would pair different steps' parts
        # in every later version. A snapshot that fails here is queued as
        # this rank's failed part, so every rank refuses that version.
        try:
            job = [(name, *_host_array(name, _local(p))) for name, p in self._blocks]
        except Exception as e:  # noqa: BLE001 - reported as this rank's part of the version
            job = e
        # The version is taken when the job runs, not here: with jobs queued
        # the worker has not yet advanced next_version past the ones ahead.
        if self._background:
            self._queue.put(job)
        else:
            self._run(job)
        self._raise_pending()

    def flush(self) -> None:
        """Waits until every queued version is committed or refused; raises a failure."""
        if self._background:
            self._queue.join()
        self._raise_pending()

    def remove(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        try:
            self.flush()
        finally:
            if self._thread is not None:
                self._queue.put(None)
                self._thread.join()
                self._thread = None

    def _raise_pending(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    # -- on the publishing thread ----------------------------------------
    def _worker(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._run(job)
            finally:
                self._queue.task_done()

    def _run(self, items) -> None:
        # Every rank runs the same jobs in the same order and gets the same
        # outcome, so their next_version stays the same: a committed version
        # advances it, a refused one leaves it for the next job to publish.
        version = self.next_version
        receipt = None
        if self._native is not None:
            try:
                if isinstance(items, BaseException):
                    raise items
                if self.fail_next_publish:
                    self.fail_next_publish = False
                    raise RuntimeError(f"injected failure of part {self._part}")
                receipt = self._native.publish(version, items)
            except Exception as e:  # reported to the committer: the version must not commit
                receipt = ("error", self._part, f"{type(e).__name__}: {e}")
        gathered = [None] * dist.get_world_size() if self._rank == 0 else None
        dist.gather_object(receipt, gathered, dst=0, group=self._group)
        outcome = [None, None]  # (failure, the committed manifest's token)
        if self._rank == 0:
            receipts, failure = [], None
            for r in gathered:
                if isinstance(r, tuple):
                    failure = failure or f"part {r[1]} failed: {r[2]}"
                elif r is not None:
                    receipts.append(r)
            if failure is None:
                try:
                    self.last_stats = self._committer.commit(version, receipts)
                except Exception as e:
                    failure = f"{type(e).__name__}: {e}"
            outcome = [failure, self._committer.manifest_token if failure is None else None]
        dist.broadcast_object_list(outcome, src=0, group=self._group)
        failure, token = outcome
        if self._native is not None:
            # With the token the next publish checks for another job's commit
            # with a HEAD of the manifest instead of reading all of it.
            self._native.finish(failure is None, token)
        if failure is None:
            self.next_version = version + 1
        else:
            self._error = FailedPreconditionError(
                f"version {version} was not committed to {self.publisher.bucket} (every rank rolled back): {failure}")


def _on_every_rank(group, fn):
    """fn() on every rank of `group`; when it raises on any rank, it raises on every rank.

    The ranks exchange one short error text (or None) afterwards, so that a
    rank that failed alone (a bucket it cannot open, say) does not leave the
    others waiting in the next collective until the gloo timeout.
    """
    try:
        result, error = fn(), None
    except Exception as e:  # noqa: BLE001 - re-raised below, on every rank
        result, error = None, e
    texts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(texts, None if error is None else f"{type(error).__name__}: {error}", group=group)
    if error is not None:
        raise error
    for r, text in enumerate(texts):
        if text is not None:
            raise FailedPreconditionError(f"attach failed on rank {r}: {text}")
    return result


def attach(model, optimizer, publisher: ShardedPublisher, params, *, start_version: int | None,
           background: bool) -> ShardedHandle:
    if not dist.is_available() or not dist.is_initialized():
        raise FailedPreconditionError("attach() with a ShardedPublisher needs torch.distributed initialized on every rank")
    _refuse_fsdp1(model)
    rank = dist.get_rank()
    # A dedicated gloo group: receipts cross it from the publishing thread
    # without racing the trainer's own collectives.
    group = dist.new_group(backend="gloo")

    def map_blocks():
        mine = []     # (name, published dtype, global shape, offset, shape, torch dtype)
        blocks = []   # (name, parameter)
        copies = []   # (name, offset, shape, digest) of blocks other ranks may hold too
        for name, p in params:
            block = _local_block(name, p, rank)
            dtype = _published_dtype(name, p.dtype)
            entry = (name, dtype, tuple(int(d) for d in p.shape))
            if block is not None and _may_be_copied(p, dist.get_world_size()):
                copies.append((name, block[0], block[1], _digest(name, block[2])))
            if block is not None and block[3]:
                mine.append(entry + (block[0], block[1], str(p.dtype)))
                blocks.append((name, p))
            else:
                mine.append(entry + (None, None, str(p.dtype)))
        return mine, blocks, copies

    mine, blocks, copies = _on_every_rank(group, map_blocks)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (mine, copies), group=group)
    everyone = [entries for entries, _ in gathered]
    # Every rank must hold the same parameters (pipeline stages holding
    # disjoint layers cannot be mapped to one model).
    names = {e[0]: e for e in mine}
    for r, entries in enumerate(everyone):
        theirs = {e[0]: e for e in entries}
        for name in sorted(set(names) ^ set(theirs)):
            raise InvalidArgumentError(
                f"attach: parameter '{name}' is on rank {r if name in theirs else rank} but not on rank "
                f"{rank if name in theirs else r}; every rank must hold (a shard of) every parameter "
                "(pipeline stages cannot be published as parts)")
        for name, e in theirs.items():
            # The torch dtypes too: fp32 on one rank and bf16 on another both publish as BF16,
            # but then the ranks do not hold one tensor.
            if (e[1], e[2], e[5]) != (names[name][1], names[name][2], names[name][5]):
                ours = names[name]
                raise InvalidArgumentError(f"attach: parameter '{name}' is {ours[5]} {ours[2]} on rank {rank} "
                                           f"but {e[5]} {e[2]} on rank {r}; every rank must hold its shard of "
                                           "one tensor, in one dtype and shape")
    _check_copies_agree([theirs for _, theirs in gathered])
    ordered = sorted(names)
    index = {n: i for i, n in enumerate(ordered)}
    tensors = [(n, names[n][1], list(names[n][2])) for n in ordered]
    dropped = _drop_replicated_blocks(everyone)
    if dropped[rank]:
        kept = {e[0] for e in mine if e[3] is not None and (e[0], tuple(e[3]), tuple(e[4])) not in dropped[rank]}
        blocks = [(name, p) for name, p in blocks if name in kept]
    parts, part_of_rank = [], {}
    for r, entries in enumerate(everyone):
        part = sorted((index[e[0]], list(e[3]), list(e[4])) for e in entries
                      if e[3] is not None and (e[0], tuple(e[3]), tuple(e[4])) not in dropped[r])
        if part:
            part_of_rank[r] = len(parts)
            parts.append(part)
    # Opening reads the bucket (and rebuilds this rank's blocks): it can fail
    # on one rank alone, and the others must not wait for it in a collective.
    handle = _on_every_rank(group, lambda: ShardedHandle(publisher, sorted(blocks, key=lambda b: b[0]),
                                                         (tensors, parts), part_of_rank.get(rank), group, 0,
                                                         background))
    latest = [handle._committer.latest_version if rank == 0 else None]
    dist.broadcast_object_list(latest, src=0, group=group)
    if start_version is None:
        start_version = latest[0] + 1
    elif start_version <= latest[0]:
        raise InvalidArgumentError(f"attach(start_version={start_version}): {publisher.bucket} already holds "
                                   f"version {latest[0]}; leave start_version out to continue at {latest[0] + 1}")
    handle.next_version = start_version
    handle._hook = optimizer.register_step_post_hook(handle._on_step)
    return handle
