"""Publishing torch tensors (``deltasync.torch.publish``): CPU tensors densely, zero-copy; device
tensors (or any, with ``sparse=True``) through the publisher's :class:`DeviceTracker`, which finds
the changed elements on the device and copies only them to the host. Re-exported by
``deltasync.torch``, their public home.
"""
from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np
import torch

from . import _native
from ._errors import InvalidArgumentError
from ._torch_common import _host_snapshot, bits_view, _numpy_view, _published_dtype, _side_get, _side_set, to_publishable


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
            bits_view(snap).copy_(host.reshape(snap.shape))
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
            bits_new, bits_old = bits_view(new), bits_view(snap.view(-1))
            idx = torch.nonzero(bits_new != bits_old).squeeze(1)
            if idx.numel() == 0:
                continue
            vals = bits_new.index_select(0, idx).view(new.dtype)
            found.append((name, idx, vals))
        # Copy the sparse parts to the host (one transfer per tensor), then
        # update the device snapshots: only once every tensor was read.
        changes = {}
        for name, idx, vals in found:
            changes[name] = (idx.cpu().numpy(), _numpy_view(name, vals.cpu()))
        for name, idx, vals in found:
            bits_view(self._snapshots[name].view(-1)).index_copy_(0, idx, bits_view(vals))
        try:
            result = publisher.publish_changes(version, changes, background=background)
        except BaseException:
            self._dirty = True
            raise
        if background:
            self._watch(result, changes, first=False)
        return result


def _int_view_dtype(dtype: np.dtype):
    return {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[np.dtype(dtype).itemsize]


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
    # The tensors are read without the GIL: one that another thread resizes,
    # replaces or writes meanwhile refuses the version (_HeldTensors).
    arrays = to_publishable(items, contiguous=background)  # refuses what is not a CPU tensor
    held = _HeldTensors(items, version)
    return publisher._publish(version, arrays, background, held.changed)


class _HeldTensors:
    """What each tensor of a publish was when it began, to refuse the version if a trainer thread
    changed one while the publisher read it without the GIL: ``resize_`` (a shape that no longer
    matches, or storage reallocated under the read), ``set_`` (another storage), or an in-place
    write (``t._version``: the version would mix two states). Writes that bypass the version
    counter are not seen: through ``t.data`` (a detached alias with a counter of its own), through
    a numpy view, or to an inference tensor (which has no counter). Holds each storage, so that memory
    ``set_`` lets go of stays valid while it is read; a ``resize_`` that grows a storage frees its
    memory at once, which nothing outside torch can prevent (the read may crash before this
    check refuses the version)."""

    def __init__(self, items, version: int) -> None:
        self._version = version
        self._was = [(name, t, t.untyped_storage(), self._now(t)) for name, t in items]

    @staticmethod
    def _now(t: torch.Tensor):
        # An inference tensor (made under torch.inference_mode()) has no version counter: its
        # in-place writes cannot be seen, only a new storage or shape.
        written = None if t.is_inference() else t._version
        return (t.untyped_storage().data_ptr(), t.data_ptr(), tuple(t.shape), t.stride(), written)

    def changed(self) -> str | None:
        for name, t, _storage, was in self._was:
            now = self._now(t)
            if now == was:
                continue
            if now[:2] != was[:2]:
                how = "its storage was replaced or reallocated (set_, resize_)"
            elif now[2:4] != was[2:4]:
                how = f"its shape went from {list(was[2])} to {list(now[2])} (resize_)"
            else:
                how = "it was written in place"
            return (f"tensor {name} changed while version {self._version} was read from it ({how}); "
                    "the version could mix two states of it and is not published: change the tensors only "
                    "once publish() returns (with background=True it returns once it has copied them)")
        return None
