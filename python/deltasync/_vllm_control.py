"""The driving side of ``deltasync.vllm``'s control plane: ``update_llm`` (an offline
``vllm.LLM``: every worker moved with one ``collective_rpc``, the prefix cache reset) and
``request_update`` (the trainer asking a vLLM server over HTTP: pause, the three weight-update
routes, resume). Re-exported by ``deltasync.vllm``, their public home.
"""
from __future__ import annotations

import json
import urllib.request
from typing import Any

__all__ = ["request_update", "update_llm"]


def update_llm(llm, version: int | None = None, *, bucket: str = "") -> list[dict[str, Any]]:
    """Offline ``vllm.LLM``: moves every worker to ``version`` and resets the prefix cache.

    ``start_weight_update`` / ``update_weights`` / ``finish_weight_update`` in every worker
    (one ``collective_rpc`` of ``deltasync_update_weights``, so that a failure in one TP
    worker does not leave the others' replies queued), then ``llm.reset_prefix_cache()``
    (cached blocks were computed with the old weights). ``version`` None: the newest, resolved
    once for all workers first (``deltasync_newest``: the largest any worker sees), so that TP
    ranks never move to different versions while the trainer publishes. Raises RuntimeError
    naming each failed worker's error, or when a worker reports another version afterwards;
    returns each worker's ``deltasync_status``.
    """
    if version is None:  # one version for every TP worker, resolved before any moves
        version = _newest(llm.collective_rpc("deltasync_newest", kwargs={"bucket": bucket}))
    info: dict[str, Any] = {"version": int(version)}
    if bucket:
        info["bucket"] = bucket
    try:
        errors = llm.collective_rpc("deltasync_update_weights", kwargs={"update_info": info})
    finally:
        llm.reset_prefix_cache()
    failed = [f"worker {i}: {e}" for i, e in enumerate(errors) if e]
    if failed:
        raise RuntimeError("deltasync update failed on " + "; ".join(failed))
    status = llm.collective_rpc("deltasync_status")
    held = [s.get("version") for s in status]
    if any(h != info["version"] for h in held):
        raise RuntimeError(f"deltasync update to version {info['version']}: the workers hold versions {held}")
    return status


def _newest(replies) -> int:
    """The largest of the workers' ``deltasync_newest`` replies; RuntimeError naming a worker that
    could not tell, or when none holds a version yet."""
    failed = [f"worker {i}: {r.get('error') if isinstance(r, dict) else r!r}"
              for i, r in enumerate(replies) if not isinstance(r, dict) or "version" not in r]
    if failed:
        raise RuntimeError("deltasync: cannot resolve the newest version on " + "; ".join(failed))
    newest = max((int(r["version"]) for r in replies), default=0)
    if newest < 1:
        raise RuntimeError("deltasync: no version to move to yet (the bucket or the --shm region holds none)")
    return newest


def request_update(server_url: str, version: int | None = None, *, bucket: str = "", timeout: float = 600,
                   pause: str | None = "wait") -> None:
    """The trainer's side of the control plane: asks a vLLM server to move to ``version``.

    As TRL does: ``POST /pause?mode=<pause>`` (default "wait": in-flight requests
    finish first; the KV and prefix caches are cleared, so no cached block
    computed with the old weights is reused), then ``/start_weight_update``,
    ``/update_weights``, ``/finish_weight_update`` and, whatever happened,
    ``/resume``. ``pause=None`` skips pausing (the prefix cache then keeps
    stale blocks: reset it yourself). ``version`` None: the newest, resolved once for all
    workers first (``POST /collective_rpc`` of ``deltasync_newest``), as ``update_llm`` does.
    Afterwards every worker's ``deltasync_status`` (``/collective_rpc``) must report the version.
    Raises urllib's HTTPError on a failed request, RuntimeError when a worker holds another version.
    """
    def post(path: str, body: dict) -> bytes:
        req = urllib.request.Request(server_url.rstrip("/") + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.read()

    if version is None:  # one version for every TP worker (vLLM's dev-mode /collective_rpc route)
        reply = json.loads(post("/collective_rpc", {"method": "deltasync_newest", "kwargs": {"bucket": bucket}})
                           or b"{}")
        if not isinstance(reply, dict) or not isinstance(reply.get("results"), list):
            raise RuntimeError(f"deltasync: /collective_rpc deltasync_newest answered {reply!r}: is the server "
                               "started with --worker-extension-cls deltasync.vllm.DeltaSyncWorkerExtension?")
        version = _newest(reply["results"])
    info: dict[str, Any] = {"version": int(version)}
    if bucket:
        info["bucket"] = bucket
    if pause is not None:
        post(f"/pause?mode={pause}&clear_cache=true", {})
    try:
        post("/start_weight_update", {})
        post("/update_weights", {"update_info": info})
        post("/finish_weight_update", {})
        # Every worker must hold the version now (vLLM's executor stops reading replies at the first
        # failed worker: a rank's failure can surface one call late, or not in these three).
        reply = json.loads(post("/collective_rpc", {"method": "deltasync_status"}) or b"{}")
        held = [r.get("version") if isinstance(r, dict) else r
                for r in (reply.get("results") if isinstance(reply, dict) else None) or [None]]
        if any(h != info["version"] for h in held):
            raise RuntimeError(f"deltasync update to version {info['version']}: the workers hold versions {held} "
                               "(deltasync_status over /collective_rpc)")
    finally:
        if pause is not None:
            post("/resume", {})
