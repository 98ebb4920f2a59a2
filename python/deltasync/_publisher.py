"""deltasync.Publisher: the trainer's side, over the native C++ Publisher.

Its arguments checked and converted for the native side in ``_publish_args.py``,
its background queue in ``_publish_queue.py``.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Union

import numpy as np

from . import _native
from ._errors import FailedPreconditionError, InvalidArgumentError
from ._publish_args import (
    _as_indices,
    _as_native,
    _as_values,
    _bucket_url,
    _check_version,
    _copy_array,
    _items,
    _views,
)
from ._publish_queue import PublishQueue, _Job

__all__ = ["Publisher", "PublishResult"]

_ENCODINGS = ("compact", "gap_delta", "raw")


@dataclasses.dataclass(frozen=True)
class PublishResult:
    """What publishing one version did (``deltasync::PublishStats``)."""

    version: int
    wrote_anchor: bool
    wrote_delta: bool
    total_elements: int
    # Elements that differ from the previous version; None for a recovered version.
    changed_elements: int | None
    delta_bytes: int
    anchor_bytes: int
    cumulative_bytes: int
    state_hash: str  # 32 hex digits: the manifest's hash of the full state after this version
    detect_encode_ms: float
    upload_ms: float
    full_bytes: int = 0  # bytes of the whole published (bf16) state
    gap_delta_bytes: int = 0  # with measure_gap_delta=True: the delta's size as TRL gap_delta
    # Published by a degraded publisher (``Publisher.degraded``): an anchor only,
    # no delta; changed_elements is None (not known).
    recovered: bool = False


def _result(stats: dict) -> PublishResult:
    return PublishResult(**{f.name: stats[f.name] for f in dataclasses.fields(PublishResult)})


class Publisher(PublishQueue):
    """Publishes successive weight states of a trainer into a bucket.

    ``bucket`` is a directory (a leading ``~`` is expanded), ``file:///abs/dir``
    or ``s3://bucket/prefix``; anything else that looks like a URL (``s3:/x``)
    is refused. Opening a bucket that already holds versions rebuilds the
    newest state from it (verified), so a new process continues where the
    last stopped. When that state cannot be rebuilt because objects of the
    bucket are damaged or missing (and no route avoids them), the publisher
    opens *degraded* (``degraded`` names the objects; a RuntimeWarning says
    so): the next ``publish()`` of the full weights commits an anchor-only
    version (its result has ``recovered=True``), after which it publishes
    normally; ``publish_changes()`` raises FailedPreconditionError until then.
    A store failure (StoreIOError) still fails the constructor.

    ``encoding``, ``anchor_interval``, ``cumulative_interval`` and
    ``anchor_max_fraction`` are the bucket's settings, stored in its
    manifest: None (the default) uses the stored value (compact, 10, 0, 0.0
    for a new bucket); a different value raises FailedPreconditionError
    unless ``change_settings=True``, which stores it with the next version.
    Versions above 2**53-1, or more than 1,000,000 past the newest, are
    refused (InvalidArgumentError) unless ``allow_version_jump=True`` (for
    the jump).

    ``publish(..., background=True)`` hands the version to one worker thread
    and returns a ``concurrent.futures.Future``; at most ``max_pending``
    versions are outstanding (queued or running) and further publish() calls
    block until one completes. A background publish takes the published
    (bf16) form of the arrays before it returns, so the caller may change
    them right away (extra memory: at most ``max_pending`` bf16 copies of the
    model); a synchronous one reads them in place, zero-copy. A background
    failure is raised by the next publish()/publish_changes() or flush(),
    whichever comes first (once).
    """

    def __init__(self, bucket: str, *, anchor_interval: int | None = None, encoding: str | None = None,
                 cumulative_interval: int | None = None, anchor_max_fraction: float | None = None,
                 change_settings: bool = False, allow_version_jump: bool = False, threads: int = 0,
                 allow_nonfinite: bool = False, create_bucket: bool = False,
                 notify: Sequence[str] = (), notify_token: str = "", max_pending: int = 2,
                 measure_gap_delta: bool = False) -> None:
        if encoding is not None and encoding not in _ENCODINGS:
            raise InvalidArgumentError(f"encoding must be one of {', '.join(_ENCODINGS)}, got {encoding!r}")
        if isinstance(notify, str):
            notify = [notify]
        for name, value in (("anchor_interval", anchor_interval), ("cumulative_interval", cumulative_interval),
                            ("anchor_max_fraction", anchor_max_fraction), ("threads", threads)):
            if value is not None and value < 0:
                raise InvalidArgumentError(f"{name} must not be negative, got {value}")
        if max_pending < 1:
            raise InvalidArgumentError(f"max_pending must be at least 1, got {max_pending}")
        self.bucket = _bucket_url(bucket)
        self.max_pending = int(max_pending)
        # As given (None: the bucket's stored value), for deltasync.torch.attach's parted route.
        self._options = dict(anchor_interval=anchor_interval, encoding=encoding,
                             cumulative_interval=cumulative_interval, anchor_max_fraction=anchor_max_fraction,
                             change_settings=bool(change_settings), allow_version_jump=bool(allow_version_jump),
                             threads=int(threads), allow_nonfinite=bool(allow_nonfinite),
                             create_bucket=bool(create_bucket), notify=[str(u) for u in notify],
                             notify_token=str(notify_token), measure_gap_delta=bool(measure_gap_delta))
        self._opened = None  # the native publisher, once the bucket is opened
        self._open_lock = threading.Lock()
        self._parted = None  # the ShardedHandle when attach() publishes this publisher's model as parts
        # Opening rebuilds the bucket's newest state: under torch.distributed
        # every rank constructs its Publisher, and N full rebuilds of the
        # model would defeat sharding. There the bucket is opened at first
        # direct use; attach() never opens it (every rank publishes a part).
        if distributed_world_size() <= 1:
            self._open(stacklevel=3)
        self._cond = threading.Condition()
        self._queue: list[_Job] = []
        self._outstanding = 0  # queued + running
        self._worker: threading.Thread | None = None
        self._failures: list[BaseException] = []  # background failures not yet re-raised by flush()
        # The version of a failure the caller has not been told of yet (raise_failure/flush clear it):
        # publish_changes queued behind it never runs (_publish_queue.py).
        self._failed_version: int | str | None = None
        self._closed = False

    def _refuse_if_parted(self) -> None:
        if self._parted is not None:
            raise FailedPreconditionError(
                f"publisher for {self.bucket} is attached to a model under torch.distributed, whose ranks publish "
                "it as parts: use the handle attach() returned (handle.flush(), handle.remove()); to publish from "
                "this rank alone, open another Publisher")

    def _open(self, stacklevel: int) -> Any:
        with self._open_lock:
            if self._opened is None:
                o = self._options

                def opt(value, kind):
                    return None if value is None else kind(value)

                native = _native.Publisher(
                    self.bucket, opt(o["anchor_interval"], int), o["encoding"], opt(o["cumulative_interval"], int),
                    opt(o["anchor_max_fraction"], float), o["change_settings"], o["allow_version_jump"],
                    o["threads"], o["allow_nonfinite"], o["create_bucket"], o["notify"], o["notify_token"],
                    o["measure_gap_delta"])
                reason = native.degraded_reason
                if reason:
                    warnings.warn(f"deltasync: {reason}", RuntimeWarning, stacklevel=stacklevel + 1)
                self._opened = native
            return self._opened

    @property
    def _native(self) -> Any:
        self._refuse_if_parted()
        return self._opened if self._opened is not None else self._open(stacklevel=3)

    @_native.setter
    def _native(self, native: Any) -> None:  # tests wrap the native publisher
        self._opened = native

    # ------------------------------------------------------------------ info

    @property
    def settings(self) -> dict[str, Any]:
        """The bucket settings this publisher uses: encoding, anchor_interval, cumulative_interval,
        anchor_max_fraction (the options given, else the bucket's stored ones, else the defaults)."""
        return self._native.settings

    @property
    def changed_settings(self) -> list[str]:
        """With change_settings=True: each stored setting this publisher changes ("encoding compact ->
        gap_delta"); they are stored with the next version."""
        return list(self._native.changed_settings)

    @property
    def latest_version(self) -> int:
        """The newest committed version (0 when none)."""
        return self._native.latest_version

    @property
    def degraded(self) -> str | None:
        """None, or why the newest version could not be rebuilt (the objects that block it).

        While set, the next publish() must be the full weights and commits a
        recovered, anchor-only version; publish_changes() is refused.
        """
        return self._native.degraded_reason or None

    def state_tensors(self) -> dict[str, np.ndarray]:
        """Read-only numpy views of the published snapshot (bf16 as ml_dtypes.bfloat16).

        They share the publisher's memory: their contents change when a later
        version is committed. Call flush() first to see the newest one.
        """
        return _views(self._native.state_tensors("numpy"))

    # --------------------------------------------------------------- publish

    def publish(self, version: int, tensors: Mapping[str, Any] | Iterable[tuple[str, Any]], *,
                background: bool = False) -> Union[PublishResult, "concurrent.futures.Future[PublishResult]"]:
        """Publishes the full weights ``tensors`` as ``version``.

        Arrays: numpy float32 (rounded to bf16, nearest even), ml_dtypes.bfloat16,
        other numpy dtypes (carried bitwise; F32 tensors whose names end with
        ``e_score_correction_bias`` stay F32), or torch CPU tensors (read in
        place through DLPack). Every array must be C-contiguous: a
        non-contiguous one is refused with InvalidArgumentError naming it
        (nothing is copied behind your back). CUDA tensors: deltasync.torch.publish.
        """
        return self._publish(version, tensors, background, None)

    def _publish(self, version: int, tensors, background: bool,
                 unchanged: Callable[[], str | None] | None) -> Any:
        """publish(); ``unchanged`` (None, or a check returning why the arrays
        changed while they were read) refuses the version before anything is
        committed (deltasync.torch.publish checks its tensors with it)."""
        version = _check_version(version)
        items = [(name, *_as_native(name, arr)) for name, arr in _items(tensors)]
        if background:
            # The trainer goes on changing its tensors: take their published
            # (bf16) form now, in this thread; the worker publishes that.
            snapshot = self._native.snapshot(items)
            del items
            why = unchanged() if unchanged is not None else None
            if why is not None:
                raise FailedPreconditionError(why)

            def run() -> PublishResult:
                return _result(self._native.publish_snapshot(version, snapshot))
        elif unchanged is not None:
            def run() -> PublishResult:
                return _result(self._native.publish(version, items, unchanged))
        else:
            def run() -> PublishResult:
                return _result(self._native.publish(version, items))

        return self._submit(run, background, version)

    def publish_dir(self, version: int, path: str | os.PathLike) -> PublishResult:
        """Publishes a Hugging Face model folder as ``version``; waits for the commit.

        ``path`` holds ``model.safetensors``, or the shards named by
        ``model.safetensors.index.json`` (its weight_map is checked against
        them), or other ``*.safetensors`` files. They are read in place
        (mapped, zero-copy). Its side files (config.json, tokenizer files,
        chat templates, ...; docs/format.md "Model folders") travel with the
        version. A single shard or the index file itself is refused
        (InvalidArgumentError saying to pass the folder).
        """
        version = _check_version(version)
        path = os.fspath(path)

        def run() -> PublishResult:
            return _result(self._native.publish_dir(version, path))

        return self._submit(run, False, version)

    def publish_changes(self, version: int, changes: Mapping[str, tuple[Any, Any]], *,
                        background: bool = False) -> Union[PublishResult, "concurrent.futures.Future[PublishResult]"]:
        """Publishes ``version`` as the last published state with ``changes`` applied.

        ``changes`` maps tensor names to ``(indices, values)``: flat row-major
        element indices (uint64 or non-negative int64, strictly ascending)
        and their new values in the published dtype (bf16 as
        ml_dtypes.bfloat16 or uint16 bits; float32 values for a bf16 tensor are
        rounded to bf16). Tensors without changes are left out. The index and
        value arrays are copied when the publish runs. The first version must
        come through publish() (FailedPreconditionError otherwise). Queued
        behind a version that failed, it is not run (FailedPreconditionError):
        its changes assume that version's state.
        """
        version = _check_version(version)
        if not isinstance(changes, Mapping):
            changes = dict(changes)
        entries: list[tuple[str, Any, Any]] = []
        for name, pair in changes.items():
            if not isinstance(name, str):
                raise InvalidArgumentError(f"tensor names must be str, got {name!r:.80}")
            try:
                indices, values = pair
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"tensor '{name}': changes must be (indices, values) pairs") from None
            if background:  # the caller may reuse its arrays as soon as this returns
                indices, values = _copy_array(indices), _copy_array(values)
            entries.append((name, indices, values))

        def run() -> PublishResult:
            published = self._native.published_dtypes()
            items = []
            for name, indices, values in sorted(entries, key=lambda e: e[0]):
                items.append((name, _as_indices(name, indices), _as_values(name, values, published.get(name))))
            return _result(self._native.publish_changes(version, items))

        return self._submit(run, background, version, relative=True)

    def __enter__(self) -> "Publisher":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            # Do not hide the exception in flight behind a publish failure.
            try:
                self.close()
            except Exception:  # noqa: BLE001
                pass

    def __repr__(self) -> str:
        if self._opened is None:
            return f"deltasync.Publisher({self.bucket!r}, not opened)"
        return f"deltasync.Publisher({self.bucket!r}, latest_version={self.latest_version})"


def distributed_world_size() -> int:
    """torch.distributed's world size when it is initialised (1 otherwise); never imports torch."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_world_size())
    except (RuntimeError, ValueError):
        pass
    return 1
