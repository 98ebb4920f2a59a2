"""PyTorch integration: publish from an optimizer, load replicas into models.

Trainer side:

    handle = deltasync.torch.attach(model, optimizer, publisher)
    ...  # every optimizer.step() now publishes the next version
    handle.flush()   # waits for the queued publishes, re-raises a failure
    handle.remove()

Replica side:

    replica.update()
    deltasync.torch.load_into(replica, model.state_dict())  # all elements first,
                                                            # then only changed ones

Tensors on a CUDA device never cross PCIe whole after the first version: a
:class:`DeviceTracker` keeps a bf16 snapshot of what was published on the
device, finds the changed elements there (``new != snapshot`` on the bit
patterns), and copies only their indices and values to the host for
``Publisher.publish_changes``.
"""
from __future__ import annotations

import re
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ml_dtypes
import numpy as np
import torch

from . import _native, _sharded
from ._publisher import Publisher, distributed_world_size
from ._sharded import ShardedPublisher
from ._errors import FailedPreconditionError, InvalidArgumentError

__all__ = [
    "AttachHandle",
    "ShardedPublisher",
    "DeviceTracker",
    "attach",
    "load_into",
    "publish",
    "tensors",
    "tracker_for",
    "to_publishable",
]

# Float32 parameters published as float32 (bitwise) rather than rounded to
# bf16: PublisherOptions::keep_fp32_suffixes' default in the C++ library.
KEEP_FP32_SUFFIXES = ("e_score_correction_bias",)

_NUMPY_OF_TORCH = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.bool: np.bool_,
}

# Wrapper prefixes that do not belong to a parameter's checkpoint name:
# DistributedDataParallel / Accelerate ("module."), torch.compile ("_orig_mod.").
_WRAPPER_PREFIX = re.compile(r"^(?:module\.|_orig_mod\.)+")


def strip_wrapper_prefix(name: str) -> str:
    """``module.model.layers.0.weight`` -> ``model.layers.0.weight``."""
    return _WRAPPER_PREFIX.sub("", name)


def _published_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype a trainer tensor is published as (what the C++ publisher does)."""
    if dtype == torch.float32 and not name.endswith(KEEP_FP32_SUFFIXES):
        return torch.bfloat16
    return dtype


# --------------------------------------------------------------------------
# host tensors -> numpy views


def _numpy_view(name: str, t: torch.Tensor) -> np.ndarray:
    """A zero-copy numpy view of a contiguous CPU tensor (bf16 as ml_dtypes.bfloat16)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    np_dtype = _NUMPY_OF_TORCH.get(t.dtype)
    if np_dtype is None:
        raise InvalidArgumentError(f"tensor {name}: dtype {t.dtype} cannot be published")
    return t.numpy()


def to_publishable(tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], *,
                   contiguous: bool = False) -> dict[str, np.ndarray]:
    """Turns CPU torch tensors into arrays ``Publisher.publish`` takes, without copying.

    The arrays share memory with the tensors: a synchronous ``publish`` reads
    them in place; one with ``background=True`` takes their bf16 form before
    it returns.

    A non-contiguous tensor is refused with ``InvalidArgumentError`` naming it,
    unless ``contiguous=True``: then it is copied with ``Tensor.contiguous()``
    (the only case that copies). CUDA tensors are refused too: publish them
    with :func:`publish` or a :class:`DeviceTracker`, which sends only the
    changed elements across PCIe.
    """
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    out: dict[str, np.ndarray] = {}
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"tensor {name}: expected a torch.Tensor, got {type(t).__name__}")
        t = t.detach()
        if t.device.type != "cpu":
            raise InvalidArgumentError(
                f"tensor {name} is on {t.device}: to_publishable takes CPU tensors; publish device "
                "tensors with deltasync.torch.publish() or a DeviceTracker")
        if not t.is_contiguous():
            if not contiguous:
                raise InvalidArgumentError(
                    f"tensor {name} is not contiguous (shape {tuple(t.shape)}, strides {t.stride()}): "
                    "pass contiguous=True to copy it, or call .contiguous() first")
            t = t.contiguous()
        out[name] = _numpy_view(name, t)
    return out


def _host_snapshot(name: str, t: torch.Tensor) -> torch.Tensor:
    """A private copy of ``t`` in its published dtype (bf16 for fp32 weights), on the host."""
    return t.detach().to(device="cpu", dtype=_published_dtype(name, t.dtype), copy=True).contiguous()


# --------------------------------------------------------------------------
# device-side change detection


class DeviceTracker:
    """Publishes device tensors by sending only their changed elements to the host.

    Keeps, on the tensors' own device, a snapshot of each tensor as last
    published (bf16 for fp32 weights). For every version after the first:
    ``mask = new != snapshot`` (16-bit patterns, so -0.0 vs 0.0 counts),
    ``indices = mask.nonzero()``, ``values = new[indices]`` on the device; only
    indices (8 B) and values (2 B) per changed element are copied to the host,
    the snapshot is updated in place, and ``Publisher.publish_changes`` does
    the rest. The first version goes through ``Publisher.publish`` with a full
    host copy.

    Works with CPU tensors too (the same code path, without a PCIe
    transfer): tests use that to check it against the dense path bit for bit.
    The snapshot costs 2 bytes per parameter of device memory.
    """

    def __init__(self) -> None:
        self._snapshots: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()
        # Set from the publisher's thread when a background publish fails
        # (plain flags: a done-callback must never wait for the lock, which a
        # publish() blocked on a full queue may hold).
        self._dirty = False   # the snapshots may differ from the published state
        self._reset = False   # the first version failed: there is no base

    @property
    def initialized(self) -> bool:
        return bool(self._snapshots)

    def _watch(self, future, keep, first: bool) -> None:
        def done(f, keep=keep):  # `keep` holds the host arrays until the publish is over
            if f.cancelled() or f.exception() is not None:
                if first:
                    self._reset = True
                self._dirty = True
        future.add_done_callback(done)

    def _resync(self, publisher) -> None:
        """Rebuilds the snapshots from the publisher's published state (after a failed publish).

        Waits for the queued publishes first; ``flush()`` re-raises their failure
        (the caller sees it once), after which the next call resyncs.
        """
        publisher.flush()
        state = publisher.state_tensors()
        for name, snap in self._snapshots.items():
            arr = np.ascontiguousarray(state[name])
            host = torch.from_numpy(arr.view(_int_view_dtype(arr.dtype)).copy())
            _bits(snap).copy_(host.reshape(snap.shape))
        self._dirty = False

    def publish(self, publisher, version: int, tensors, *, background: bool = False):
        """Publishes ``tensors`` (name -> tensor on any one device) as ``version``.

        Returns what the publisher returns: a PublishResult, or a Future of one
        with ``background=True``.
        """
        items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)
        with self._lock:
            if self._reset:
                publisher.flush()  # re-raises the first version's failure once
                self._snapshots, self._reset, self._dirty = {}, False, False
            if not self._snapshots:
                return self._publish_first(publisher, version, items, background)
            if self._dirty:
                self._resync(publisher)
            return self._publish_changes(publisher, version, items, background)

    def _publish_first(self, publisher, version, items, background):
        host = {name: _host_snapshot(name, t) for name, t in items}
        snaps = {name: t.detach().to(dtype=_published_dtype(name, t.dtype), copy=True).contiguous()
                 for name, t in items}
        result = publisher.publish(version, to_publishable(host), background=background)
        if background:
            self._watch(result, host, first=True)
        self._snapshots = snaps
        return result

    def _publish_changes(self, publisher, version, items, background):
        names = {name for name, _ in items}
        if names != set(self._snapshots):
            raise InvalidArgumentError(
                f"version {version}: the tensors differ from the first version's: "
                f"{_native.describe_tensor_set_diff(list(self._snapshots), list(names))}")
        found: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        for name, t in items:
            snap = self._snapshots[name]
            t = t.detach()
            if tuple(t.shape) != tuple(snap.shape):
                raise InvalidArgumentError(
                    f"tensor {name}: shape {tuple(t.shape)} differs from the published {tuple(snap.shape)}")
            new = t.to(device=snap.device, dtype=snap.dtype).reshape(-1)
            bits_new, bits_old = _bits(new), _bits(snap.view(-1))
            idx = torch.nonzero(bits_new != bits_old).squeeze(1)
            if idx.numel() == 0:
                continue
            vals = new.index_select(0, idx)
            found.append((name, idx, vals))
        # Copy the sparse parts to the host (one transfer per tensor), then
        # update the device snapshots: only once every tensor was read.
        changes = {}
        for name, idx, vals in found:
            changes[name] = (idx.cpu().numpy(), _numpy_view(name, vals.cpu()))
        for name, idx, vals in found:
            self._snapshots[name].view(-1).index_copy_(0, idx, vals)
        try:
            result = publisher.publish_changes(version, changes, background=background)
        except BaseException:
            self._dirty = True
            raise
        if background:
            self._watch(result, changes, first=False)
        return result


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns as integers (compares NaN/-0.0 bitwise)."""
    size = t.element_size()
    if not t.is_floating_point():
        return t
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[size])


def _int_view_dtype(dtype: np.dtype):
    return {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[np.dtype(dtype).itemsize]


_side_tables: dict[str, "weakref.WeakKeyDictionary[Any, Any]"] = {}
_side_fallback: dict[tuple[str, int], Any] = {}


def _side_get(obj, key: str, default=None):
    """Per-object state kept by this module (an attribute, else a weak side table)."""
    attr = "_deltasync_torch_" + key
    try:
        return getattr(obj, attr)
    except AttributeError:
        pass
    table = _side_tables.get(key)
    try:
        return table[obj] if table is not None else default
    except (KeyError, TypeError):
        return _side_fallback.get((key, id(obj)), default)


def _side_set(obj, key: str, value) -> None:
    try:
        setattr(obj, "_deltasync_torch_" + key, value)
        return
    except (AttributeError, TypeError):
        pass
    try:
        _side_tables.setdefault(key, weakref.WeakKeyDictionary())[obj] = value
    except TypeError:  # neither attributes nor weak references: keyed by id
        _side_fallback[(key, id(obj))] = value


def tracker_for(publisher) -> "DeviceTracker":
    """The DeviceTracker that :func:`publish` uses for ``publisher`` (created on first use)."""
    tracker = _side_get(publisher, "tracker")
    if tracker is None:
        tracker = DeviceTracker()
        _side_set(publisher, "tracker", tracker)
    return tracker


def publish(publisher, version: int, tensors, *, background: bool = False, sparse: bool | None = None):
    """Publishes torch tensors as ``version``, choosing the path by device.

    CPU tensors (``sparse`` None/False) go to ``Publisher.publish`` zero-copy
    (see :func:`to_publishable`; with ``background=True`` the publisher takes
    their bf16 form before returning, so the caller may modify them at once).
    Tensors on an accelerator, or any tensors with
    ``sparse=True``, go through the publisher's :class:`DeviceTracker`.
    """
    items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)
    on_device = any(t.device.type != "cpu" for _, t in items)
    if sparse is None:
        sparse = on_device
    if sparse:
        return tracker_for(publisher).publish(publisher, version, items, background=background)
    if on_device:
        raise InvalidArgumentError("sparse=False with device tensors: only CPU tensors publish densely")
    # background=True: Publisher.publish takes the bf16 form of the tensors
    # before it returns (C++ Publisher::Snapshot), so the next optimizer step
    # may change them at once.
    # (A non-contiguous tensor is then copied once with .contiguous().)
    return publisher.publish(version, to_publishable(items, contiguous=background), background=background)


# --------------------------------------------------------------------------
# attach: publish after every optimizer step


def _storage_key(t: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))


def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 names: Mapping[str, str] | Callable[[str], str | None] | None,
                 sharded: bool = False) -> list[tuple[str, torch.Tensor]]:
    # DTensors have no storage of their own to compare: matched by identity.
    def key_of(p: torch.Tensor):
        return id(p) if sharded or callable(getattr(p, "full_tensor", None)) else _storage_key(p)

    by_storage: dict[Any, str] = {}
    for raw_name, p in model.named_parameters():
        by_storage.setdefault(key_of(p), raw_name)
    out: list[tuple[str, torch.Tensor]] = []
    seen: dict[str, str] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            raw = by_storage.get(key_of(p))
            if raw is None:
                raise InvalidArgumentError(
                    f"an optimizer parameter of shape {tuple(p.shape)} is not a parameter of the model "
                    "(attach() needs the model that owns the optimizer's parameters)")
            if callable(names):
                name = names(raw)
            elif names is not None:
                stripped = strip_wrapper_prefix(raw)
                name = names[raw] if raw in names else names.get(stripped, stripped)
            else:
                name = strip_wrapper_prefix(raw)
            if name is None:
                continue
            if name in seen:
                raise InvalidArgumentError(f"parameters {seen[name]} and {raw} both publish as {name}")
            if not sharded and callable(getattr(p, "full_tensor", None)):
                raise InvalidArgumentError(
                    f"parameter {raw} is sharded (a DTensor, e.g. FSDP2): pass a deltasync.torch.ShardedPublisher "
                    "to attach() on every rank (each rank publishes its own part), or gather with full_tensor() "
                    "and call deltasync.torch.publish() on rank 0")
            seen[name] = raw
            out.append((name, p))
    if not out:
        raise InvalidArgumentError("attach(): the optimizer has no parameters to publish")
    return out


class AttachHandle:
    """What :func:`attach` returns. ``remove()`` stops publishing; ``flush()`` waits."""

    def __init__(self, publisher, params, start_version: int, background: bool, sparse: bool | None):
        self.publisher = publisher
        self.params = params  # [(name, parameter)]
        self.next_version = start_version
        self.background = background
        self.sparse = sparse
        self.last_result = None  # PublishResult or Future of the newest version
        self._hook = None

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.params]

    def publish_now(self):
        """Publishes the current parameters as the next version (what the hook does).

        A background publish that failed since the last call is raised here
        first (from ``optimizer.step()``), and the version is not consumed:
        the next step publishes it again.
        """
        self.publisher.raise_failure()
        version = self.next_version
        result = publish(self.publisher, version, self.params, background=self.background, sparse=self.sparse)
        self.next_version = version + 1
        self.last_result = result
        return result

    def _on_step(self, optimizer, args, kwargs) -> None:
        with torch.no_grad():
            self.publish_now()

    def flush(self) -> None:
        """Waits for every queued publish; re-raises the first failure."""
        self.publisher.flush()

    def remove(self) -> None:
        """Unhooks the optimizer (queued publishes still complete; call flush() to wait)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


def attach(model: torch.nn.Module, optimizer: torch.optim.Optimizer, publisher, *, start_version: int | None = None,
           names: Mapping[str, str] | Callable[[str], str | None] | None = None, background: bool = True,
           sparse: bool | None = None) -> AttachHandle:
    """Publishes the model's weights after every ``optimizer.step()``.

    Versions are ``start_version``, ``start_version + 1``, ... (one per step);
    by default ``start_version`` is one past the publisher's newest version
    (after its queued publishes), so a restarted trainer continues the
    bucket's numbering. A given ``start_version`` at or below it is refused
    (InvalidArgumentError).
    The optimizer's parameters are named after the model's parameters they
    share storage with, with ``module.``/``_orig_mod.`` prefixes (DDP,
    Accelerate, torch.compile) removed. ``names`` renames: a mapping from the
    model's (or the stripped) name to the published one (names it lacks keep
    the stripped name; a None value leaves the parameter out), or a callable
    taking the model's name and returning the published one or None.

    With ``background=True`` (the default) the step returns as soon as a
    private snapshot is taken (bf16 on the host for CPU parameters; only the
    changed elements for accelerator parameters) and the publisher encodes
    and uploads it on its own thread; at most ``max_pending`` versions queue
    up, then ``step()`` blocks. A background publish that failed is raised
    by the next ``step()`` (or ``handle.flush()``, whichever comes first),
    and that step publishes again. ``sparse`` as in :func:`publish` (None:
    by device).

    Under ``torch.distributed`` with world size > 1 the same call, made on
    every rank (a collective), publishes the model as parts: each rank its
    own blocks (DTensor placements; a plain parameter by rank 0), rank 0
    commits, with the Publisher's bucket and settings, as a
    ``ShardedPublisher`` would (docs/python.md, "Sharded trainers"). Settings
    parts do not support are refused (InvalidArgumentError naming them) and
    the Publisher itself is never opened; a ShardedHandle is returned.

    Needs PyTorch >= 2.1 (``Optimizer.register_step_post_hook``).
    """
    if not hasattr(optimizer, "register_step_post_hook"):
        raise FailedPreconditionError("attach() needs PyTorch >= 2.1 (Optimizer.register_step_post_hook)")
    if isinstance(publisher, ShardedPublisher):
        return _sharded.attach(model, optimizer, publisher, _param_names(model, optimizer, names, sharded=True),
                               start_version=start_version, background=background)
    world = distributed_world_size()
    if world > 1 and isinstance(publisher, Publisher):
        # Every rank publishes its own part, as with a ShardedPublisher of the same bucket and settings.
        if sparse is not None:
            raise InvalidArgumentError(f"attach(sparse={sparse}): under torch.distributed (world size {world}) "
                                       "every rank copies its own blocks to the host; leave sparse out")
        sharded = _sharded.from_publisher(publisher, world)
        handle = _sharded.attach(model, optimizer, sharded, _param_names(model, optimizer, names, sharded=True),
                                 start_version=start_version, background=background)
        publisher._parted = handle
        return handle
    params = _param_names(model, optimizer, names)
    publisher.flush()  # the queued versions count: start after them
    latest = publisher.latest_version
    if start_version is None:
        start_version = latest + 1
    elif start_version <= latest:
        raise InvalidArgumentError(
            f"attach(start_version={start_version}): {publisher.bucket} already holds version {latest}; "
            f"leave start_version out to continue at {latest + 1}")
    handle = AttachHandle(publisher, params, start_version, background, sparse)
    handle._hook = optimizer.register_step_post_hook(handle._on_step)
    return handle


# --------------------------------------------------------------------------
# replica side


def tensors(replica) -> dict[str, torch.Tensor]:
    """The replica's weights as torch CPU tensors sharing its memory (bf16 as torch.bfloat16).

    Read-only by contract (torch has no read-only tensors): writing into them
    corrupts the replica's verified state, which only ``replica.verify()``
    (a full recomputation of the state hash) detects. Valid until the next
    ``replica.update()``, which changes their contents in place; copy what
    must stay fixed.
    """
    out: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():
        # torch.from_numpy warns about read-only arrays; they are read-only by contract.
        warnings.filterwarnings("ignore", message=".*not writable.*")
        for name, arr in replica.tensors().items():
            if arr.dtype == ml_dtypes.bfloat16:
                out[name] = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
            else:
                out[name] = torch.from_numpy(arr)
    return out


def _fingerprint(targets: dict[str, torch.Tensor]) -> tuple:
    return tuple(sorted((name, t.data_ptr(), tuple(t.shape), t.dtype, str(t.device)) for name, t in targets.items()))


def _flat_put(target: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor) -> None:
    if target.is_contiguous():
        target.view(-1).index_copy_(0, idx, vals)
    else:
        target.index_put_(torch.unravel_index(idx, target.shape), vals)


def load_into(replica, state_dict: Mapping[str, torch.Tensor]) -> int:
    """Copies the replica's weights into ``state_dict``'s tensors; returns the elements copied.

    ``state_dict`` maps names (``module.`` prefixes are ignored) to tensors on
    any device (``model.state_dict()`` works: its tensors share the
    parameters' memory). Every replica tensor needs a target of the same
    shape and dtype (a bf16 model for bf16 weights); a mismatch is an
    InvalidArgumentError naming the tensor, raised before anything is copied.
    Targets the replica does not have (buffers) are left alone.

    The first call copies everything. Later calls into the same tensors copy
    only the elements that changed since the previous call (the replica
    records them across updates, even several versions apart), gathered on
    the host and scattered with ``index_copy_`` on the target's device. After
    the replica loads an anchor from scratch, or when the targets are not the
    ones filled last time, everything is copied again.
    """
    if replica.version == 0:
        raise FailedPreconditionError("load_into: the replica holds no version yet; call update() first")
    sources = tensors(replica)
    by_name: dict[str, torch.Tensor] = {}
    for key, t in state_dict.items():
        by_name.setdefault(strip_wrapper_prefix(key), t)
    targets: dict[str, torch.Tensor] = {}
    for name, src in sources.items():
        dst = by_name.get(name)
        if dst is None:
            raise InvalidArgumentError(f"load_into: tensor {name} has no target in the state dict")
        if tuple(dst.shape) != tuple(src.shape):
            raise InvalidArgumentError(
                f"load_into: tensor {name}: target shape {tuple(dst.shape)} != replica shape {tuple(src.shape)}")
        if dst.dtype != src.dtype:
            raise InvalidArgumentError(
                f"load_into: tensor {name}: target dtype {dst.dtype} != replica dtype {src.dtype}")
        targets[name] = dst
    everything, changes = replica._take_changes()
    fingerprint = _fingerprint(targets)
    if _side_get(replica, "loaded") != fingerprint:  # the targets the last load_into filled
        everything = True
    _side_set(replica, "loaded", None)  # until this load completes
    copied = 0
    with torch.no_grad():
        if everything:
            for name, src in sources.items():
                targets[name].copy_(src)
                copied += src.numel()
        else:
            for name, idx_np in changes.items():
                src = sources[name]
                dst = targets[name]
                idx = torch.from_numpy(np.asarray(idx_np).astype(np.int64, copy=False))
                vals = src.reshape(-1).index_select(0, idx)
                if dst.device.type != "cpu":
                    idx, vals = idx.to(dst.device, non_blocking=True), vals.to(dst.device, non_blocking=True)
                _flat_put(dst, idx, vals)
                copied += idx.numel()
    _side_set(replica, "loaded", fingerprint)
    return copied
