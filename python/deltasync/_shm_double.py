"""Double-buffered delivery for the node follower: the pause is a pointer swap.

Each worker keeps a shadow copy of every parameter its ``_shm_plan.Plan``
writes. Outside the pause (a background thread of the worker, or an explicit
``deltasync_prepare`` call), ``prepare`` copies this worker's changes of the
region's newest version out of the region (``Region.take`` with the plan:
the same seqlock bracket, nothing used unless the bracket held), scatters
them into the shadows and, with ``verify``, compares the shadows with a whole
consistent copy of that version. The update call then only swaps each
parameter's storage to its shadow (``param.data = shadow``: the same
Parameter object, so every module that holds it, tied weights included, sees
the new storage). After the swap, again outside the pause, the same changes
(still in the plan's buffers) are written into the old storage, now the
shadow, so both hold the new version.

Correctness: a shadow is swapped in only when it was prepared from exactly
the version the engine holds to exactly the version asked for, with every
tensor of the region in the plan, and (with ``verify``) compared equal to the
version; anything else (not prepared yet, the region moved on more than one
version, a verification that failed, another route that wrote the
parameters) leaves the shadows unused and the update takes the in-place
route. A shadow that is not known to hold a version is re-copied whole from
the parameters before it is used again.
"""
from __future__ import annotations

import time

import torch

__all__ = ["DoubleBuffer"]


class DoubleBuffer:
    """The shadows of one worker's planned parameters and what they hold.

    ``plan``: the worker's Plan; ``params``: the distinct parameters it
    writes; ``owner[i]``: the index into ``params`` of plan tensor ``i``
    (``plan.names[i]``), whose flat data is the plan's destination ``i``.
    Not thread-safe: the caller holds one lock around every call and every
    other write into the parameters.
    """

    def __init__(self, plan, params: list[torch.Tensor], owner: list[int]) -> None:
        self.plan, self.params, self.owner = plan, params, owner
        self.shadows = [torch.empty_like(p.data, memory_format=torch.contiguous_format) for p in params]
        self.version = 0      # the version the shadows hold; 0: not known (re-copied from the parameters first)
        self.pending = None   # (from, to): the plan's buffers hold the move the shadows still need (after a swap)
        self.prepared = None  # the shadows hold a prepared, checked next version: its figures
        self.swaps = 0
        self.declined = None  # (version, from, why): not tried again until the region or the engine moves
        self.last_error = ""
        self.shadow_bytes = sum(s.numel() * s.element_size() for s in self.shadows)

    # --- state ----------------------------------------------------------------------------
    def _shadow_dst(self) -> list[torch.Tensor]:
        return [self.shadows[j].view(-1) for j in self.owner]

    def live(self) -> bool:
        """Whether the plan still writes the parameters' current storage (nothing re-made them)."""
        return all(self.plan._dst[i].data_ptr() == self.params[j].data_ptr() and
                   self.plan._dst[i].numel() == self.params[j].numel() for i, j in enumerate(self.owner))

    def invalidate(self, why: str = "") -> None:
        """The shadows hold no known version (re-copied before the next prepare)."""
        self.version, self.pending, self.prepared = 0, None, None
        if why:
            self.last_error = why

    def before_other_route(self) -> None:
        """Called before the in-place route writes the parameters and reuses the plan's buffers: a
        move still pending for the shadows is lost with the buffers."""
        if self.pending is not None:
            self.invalidate()
        self.prepared = None

    # --- outside the pause ----------------------------------------------------------------
    def catch_up(self) -> int:
        """Writes a swap's pending move into the shadows (the old storage); elements written."""
        if self.pending is None:
            return 0
        frm, to = self.pending
        if self.version != frm:
            self.invalidate(f"the shadows held {self.version}, the pending move starts at {frm}")
            return 0
        self.pending = None
        try:
            n = self.plan.scatter(dst=self._shadow_dst())
        except Exception:
            self.invalidate("a catch-up scatter failed")
            raise
        self.version = to
        return n

    @torch.no_grad()
    def sync(self, version: int) -> None:
        """Copies the parameters (which hold ``version``) whole into the shadows."""
        self.version, self.pending, self.prepared = 0, None, None
        for s, p in zip(self.shadows, self.params):
            s.copy_(p.data)
        self.version = version

    def prepare(self, region, have: int, verify=None) -> str:
        """Prepares the region's newest version into the shadows, from ``have`` (the engine's).

        ``verify(src)``: compares the shadows with ``src`` (whole tensors of
        the version), raising when they differ; returns the tensors checked.
        Returns "ready" or why not (nothing is swapped then).
        """
        t0 = time.perf_counter()
        if have <= 0:
            return "the engine holds no known version"
        self.catch_up()
        if self.prepared is not None:
            return "ready"
        want = region.version
        if self.declined is not None and self.declined[:2] == (want, have):
            return self.declined[2]
        if self.version != have:
            self.sync(have)
        if want <= have:
            return f"nothing newer than {have} in the region"
        if region.base_version != have or not region.changes_complete:
            return self._decline(want, have, f"the region holds {want} as a move from {region.base_version}"
                                 f"{'' if region.changes_complete else ' (change lists incomplete)'}, the engine "
                                 f"holds {have}")
        taken = region.take(want, have, full=False, plan=self.plan)
        if taken is None:
            return "the region moved during the read"
        if taken.changes is None:
            return "the region's change lists do not start at the engine's version"
        outside = [n for n, idx in taken.changes.items() if len(idx)]
        if outside:
            return self._decline(want, have, f"changes outside the plan ({', '.join(outside[:3])})")
        t_read = time.perf_counter()
        self.version = 0  # the shadows are between versions until the scatter is done
        try:
            elements = self.plan.scatter(dst=self._shadow_dst())
        except Exception:
            self.invalidate("the prepare scatter failed")
            raise
        self.version = want
        t_scatter = time.perf_counter()
        verified = 0
        if verify is not None:
            whole = region.take(want, None, full=True)
            if whole is None:
                self.invalidate()
                return f"the region moved past {want} before the shadows were verified"
            try:
                verified = verify(whole.src)
            except Exception as e:  # never swapped in: re-copied from the parameters before the next try
                self.invalidate(f"the shadows of version {want} failed verification: {type(e).__name__}: {e}")
                return self._decline(want, have, self.last_error)
        counts = self.plan.counts()
        self.prepared = {"version": want, "base": have, "elements": elements,
                         "tensors": sum(1 for c in counts.values() if c), "verified": verified,
                         "read_s": t_read - t0, "scatter_s": t_scatter - t_read,
                         "verify_s": time.perf_counter() - t_scatter, "prepare_s": time.perf_counter() - t0}
        self.last_error = ""
        return "ready"

    def _decline(self, want: int, have: int, why: str) -> str:
        self.declined = (want, have, why)
        return why

    # --- inside the pause -----------------------------------------------------------------
    def swap(self, want: int, have: int):
        """Swaps the parameters to the shadows when they hold ``want`` prepared from ``have``;
        returns the prepared figures, or None (nothing touched)."""
        p = self.prepared
        if p is None or p["version"] != want or p["base"] != have or self.version != want or not self.live():
            return None
        old = []
        try:
            with torch.no_grad():
                for param, shadow in zip(self.params, self.shadows):
                    old.append(param.data)
                    param.data = shadow
        except Exception:
            with torch.no_grad():
                for param, o in zip(self.params, old):
                    param.data = o
            self.invalidate("a swap failed (rolled back)")
            raise
        self.shadows = old
        self.plan.retarget([self.params[j].data.view(-1) for j in self.owner])
        self.pending, self.version, self.prepared = (have, want), have, None
        self.swaps += 1
        return p
