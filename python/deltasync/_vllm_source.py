"""Where an update of ``deltasync.vllm.DeltaSyncEngine`` takes its weights from.

``UpdateSourceMixin`` gives the engine its two sources: this worker's own
:class:`deltasync.Replica` (``_prepare_replica``: download, decode, verify) or the node
follower's ``deltasync serve --shm`` region (``_prepare_shm``: exactly the version asked
for, copied out of one seqlock bracket; the daemon woken with its token when behind), each
returning a ``_Prepared`` update for the engine to deliver; and the whole tensors of the
version the engine holds (``_held_source``, for ``deltasync_verify``). The vLLM glue
(``_vllm_worker.py``) overrides ``_needs_full_source`` and ``_shm_plan``.
"""
from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from . import torch as _dtorch
from ._vllm_info import DeltaSyncUpdateInfo

__all__ = ["UpdateSourceMixin"]


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


class UpdateSourceMixin:
    """The engine's sources of an update (the replica's or the node follower's); state set by
    ``DeltaSyncEngine._setup``."""

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
            if self._shm_from != (region, region.generation):
                # Another region, or the name mapped again (a restarted daemon, maybe of another
                # bucket): its change lists "from the engine's version" need not start from what the
                # engine holds. Everything, once, from the region (still no download).
                self._force_full = True
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

    def newest_version(self, bucket: str = "") -> int:
        """The version an update without one would move to now: the node follower's region's, else
        the bucket's newest (re-reads the manifest). The driver asks every TP worker and sends the
        largest as an explicit version (``update_llm``, ``request_update``): workers that each took
        "the newest" on their own could move to different versions while the trainer publishes."""
        with self._lock:
            if self.init_info.shm:
                from ._shm import Region

                if self._region is None:
                    self._region = Region(self.init_info.shm)
                self._region.check_alive()
                return self._region.version
            return self._replica_for(bucket).latest_available()

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
