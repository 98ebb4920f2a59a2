"""Double-buffered delivery of the node follower inside the vLLM engine (``init_info`` ``double_buffer``).

``DoubleBufferMixin`` gives ``deltasync.vllm.DeltaSyncEngine`` its preparing
thread, ``prepare_next`` and the swap inside the pause around a
``_shm_double.DoubleBuffer``; ``build_for_model`` decides, for one vLLM
model, whether a swap is known to take effect (docs/vllm.md, "Double-buffered
delivery") and builds the DoubleBuffer over the worker's plan.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Any

import torch

__all__ = ["DoubleBufferMixin", "build_for_model"]


class DoubleBufferMixin:
    """The engine's side of the double buffer. Every delivery and every prepare holds ``_lock``."""

    def _db_setup(self) -> None:
        self._lock = threading.RLock()
        self._db = None          # the DoubleBuffer, when this engine can swap
        self._db_off = ""        # why it cannot (said once on stderr, and in last_update)
        self._db_state = ""      # the last prepare's outcome
        self._db_thread = None
        self._db_stop = threading.Event()
        self._db_wake = threading.Event()

    def prepare_next(self) -> dict[str, Any]:
        """One prepare of the double buffer, outside the pause (what the preparing thread runs
        every ``double_buffer_poll_s``): the region's newest version into the shadows, checked.
        Returns the double buffer's state (``double_buffer_status``)."""
        with self._lock:
            self._db_step()
            return self.double_buffer_status()

    def double_buffer_status(self) -> dict[str, Any]:
        db = self._db
        st: dict[str, Any] = {"enabled": bool(self.init_info.shm and self.init_info.double_buffer),
                              "state": self._db_off or self._db_state}
        if db is not None:
            st.update(shadow_version=db.version, prepared_version=db.prepared["version"] if db.prepared else 0,
                      pending=db.pending, swaps=db.swaps, shadow_bytes=db.shadow_bytes, last_error=db.last_error)
            if db.prepared:
                st["prepare_s"] = db.prepared["prepare_s"]
        return st

    def _db_start(self) -> None:
        if self._db_thread is not None and self._db_thread.is_alive():
            return
        self._db_stop.clear()
        self._db_thread = threading.Thread(target=self._db_loop, name="deltasync-double-buffer", daemon=True)
        self._db_thread.start()

    def _db_loop(self) -> None:
        while not self._db_stop.is_set():
            self._db_wake.wait(max(self.init_info.double_buffer_poll_s, 0.001))
            self._db_wake.clear()
            if self._db_stop.is_set() or not self.init_info.double_buffer_poll_s:
                break
            try:
                with self._lock:
                    self._db_step()
            except Exception as e:  # said in the status; the updates take the in-place route meanwhile
                self._db_state = f"error: {type(e).__name__}: {e}"
                self._db_stop.wait(1.0)

    def _db_step(self) -> None:
        """Called with the lock held: brings the shadows to the region's newest version."""
        from ._errors import NotFoundError
        from ._shm import Region

        if not (self.init_info.shm and self.init_info.double_buffer):
            return
        if self._region is None:
            try:
                self._region = Region(self.init_info.shm)
            except NotFoundError as e:
                self._db_state = str(e)
                return
        region = self._region
        region.check_alive()
        have = 0 if self._force_full or self._shm_from != (region, region.generation) else self._engine_version
        if have == 0:
            self._db_state = "the engine holds no known version yet (the first update delivers in place)"
            return
        db = self._db_ensure(region)
        if db is None:
            return
        verify = None
        if self.init_info.verify:
            override = {id(p): sh for p, sh in zip(db.params, db.shadows)}
            verify = self._db_verify(override)
        self._db_state = db.prepare(region, have, verify)

    def _db_ensure(self, region):
        """The DoubleBuffer over the current plan, (re)built when the plan or the parameters moved;
        None (and ``_db_off`` says why, once on stderr) where a swap cannot be known to take effect."""
        plan = self._shm_plan(region)
        db = self._db
        if db is not None and db.plan is plan and db.live():
            return db
        self._db = None
        db, why = (None, "the deliveries go through the caller's callbacks: no parameters to swap") \
            if plan is None else self._db_build(region, plan)
        if db is None:
            if why != self._db_off:
                print(f"deltasync.vllm: warning: double buffer off: {why}; updates scatter in place inside the "
                      "pause", file=sys.stderr, flush=True)
            self._db_off = why
            return None
        self._db, self._db_off = db, ""
        return db

    def _db_build(self, region, plan):
        """(DoubleBuffer, "") or (None, why not)."""
        return None, "double buffering needs the vLLM engine's parameters"

    def _db_verify(self, override):
        return None

    def _db_swap(self, info, load_weights, t0: float):
        """Inside the pause: swaps the prepared shadows in when they hold exactly the version asked
        for, moved from the one the engine holds. None when swapped; else why not (the in-place
        route runs, and the shadows are left to be re-prepared)."""
        from ._errors import FailedPreconditionError

        if load_weights is not None and load_weights != self._default_load_weights():
            return "not swapped: the caller's callbacks deliver"
        db = self._db
        if db is None:
            return "not swapped: " + (self._db_off or self._db_state or "no shadows prepared yet")
        region = self._region
        if region is not None:
            try:
                region.check_alive()  # re-maps a region a restarted daemon created under the name
            except FailedPreconditionError:
                pass  # no writer now, none new: the shadows are still of this mapping
        if region is None or db.plan.generation != region.generation or \
                self._shm_from != (region, region.generation):
            # A daemon (maybe of another bucket) took the region's name since the shadows were
            # prepared, or since the engine's version was delivered: what they hold is the old
            # region's, whatever its number. The in-place route delivers the new region's whole.
            db.invalidate("the --shm region was mapped anew")  # its version numbers are not the new region's
            return "not swapped: the --shm region was mapped anew since the shadows were prepared"
        want = info.version if info.version is not None else region.version
        have = 0 if self._force_full else self._engine_version
        t1 = time.perf_counter()
        p = db.swap(want, have)
        if p is None:
            prepared = f", prepared {db.prepared['version']}" if db.prepared else ""
            why = (f"not swapped: the shadows hold version {db.version}{prepared}; asked {want}, the engine "
                   f"holds {have} ({self._db_state or 'not prepared yet'})")
            db.before_other_route()
            return why
        t2 = time.perf_counter()
        self._db_swapped()
        before = self._engine_version
        self._engine_version, self._force_full, self.last_error = want, False, ""
        self._replica = None
        self.last_update = {
            "from_version": before, "version": want, "kind": "swap", "tensors": p["tensors"],
            "elements": p["elements"], "update_s": t1 - t0, "deliver_s": time.perf_counter() - t1,
            "swap_s": t2 - t1, "verify_s": 0.0, "verified_tensors": p["verified"],
            "verified_before_swap": p["verified"] > 0,
            "source": "shm", "downloaded_bytes": 0, "double_buffer": "swapped",
            "prepare_s": p["prepare_s"], "prepare_read_s": p["read_s"], "prepare_scatter_s": p["scatter_s"],
            "prepare_verify_s": p["verify_s"],
        }
        return None

    def _db_swapped(self) -> None:
        """After a swap: the parameters' storage moved (the plan was retargeted with them)."""


def build_for_model(model, device, vllm_config, region, plan):
    """(DoubleBuffer, "") or (None, why not) for a vLLM model. A swap takes effect only where the
    forward pass reads the Parameter objects afresh at every step: plain CPU tensors, an
    uncompiled model, no other tensor on their storage."""
    from ._shm_double import DoubleBuffer
    from ._vllm_layout import EngineLayout

    if torch.device(device).type != "cpu":
        return None, (f"parameters on {device}: a swap is not known to reach what runs "
                      "(CUDA graphs keep the addresses they captured)")
    mode = getattr(getattr(vllm_config, "compilation_config", None), "mode", None)
    if mode is None or int(mode) != 0:
        return None, (f"the model is compiled (compilation mode {mode!s}): a swap is not known to reach "
                      "the compiled graph; serve with --enforce-eager to double-buffer")
    planned = set(plan.names)
    outside = [n for n in region.tensors if n not in planned]
    if outside:
        more = f" and {len(outside) - 3} more" if len(outside) > 3 else ""
        return None, (f"{', '.join(outside[:3])}{more} of the region are not plain tensors this worker "
                      "writes in place (packed for the CPU kernels, quantized, or not in the model)")
    layout = EngineLayout(model)
    params, owner, index = [], [], {}
    for i, name in enumerate(plan.names):
        t = layout.targets[name]
        p = getattr(t.module, t.param)
        if p.device.type != "cpu" or not p.is_contiguous() or p.data_ptr() != plan._dst[i].data_ptr():
            return None, f"{name}: its parameter is not the plan's contiguous CPU storage"
        if id(p) not in index:
            index[id(p)] = len(params)
            params.append(p)
        owner.append(index[id(p)])
    alias = storage_alias(model, params)
    if alias:
        return None, alias
    return DoubleBuffer(plan, params, owner), ""


def storage_alias(model, params) -> str:
    """Another tensor on a swapped parameter's storage (a view kept by a module, or two parameters
    sharing one buffer) would keep the old weights after a swap: named, or ""."""
    owners = {}
    for p in params:
        ptr = p.untyped_storage().data_ptr()
        name = next(n for n, q in model.named_parameters() if q is p)
        if ptr in owners:
            return f"two parameters share one storage ({owners[ptr][0]} and {name}): a swap would split them"
        owners[ptr] = (name, p)
    for mname, m in model.named_modules():
        for key, v in vars(m).items():
            items = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, (list, tuple)) \
                else [(None, v)]
            for sub, t in items:
                if not isinstance(t, torch.Tensor) or t.is_meta:
                    continue
                try:
                    ptr = t.untyped_storage().data_ptr()
                except (RuntimeError, NotImplementedError):
                    continue
                if ptr in owners and t is not owners[ptr][1]:
                    where = f"{mname}.{key}" + ("" if sub is None else f"[{sub!r}]")
                    return (f"{where} shares storage with the parameter {owners[ptr][0]}: a swap would "
                            "leave it on the old weights")
    return ""
