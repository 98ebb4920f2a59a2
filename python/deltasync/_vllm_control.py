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
