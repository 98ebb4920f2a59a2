"""deltasync.Replica: the inference side, over the native C++ Replica."""
from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from . import _native
from ._errors import FailedPreconditionError, InvalidArgumentError
from ._publisher import _bucket_url, _views

__all__ = ["Replica", "UpdateResult"]


@dataclasses.dataclass(frozen=True)
class UpdateResult:
    """What the last update() did (``deltasync::UpdateStats``)."""

    from_version: int
    to_version: int
    anchors_applied: int
    deltas_applied: int
    bytes_downloaded: int
    download_ms: float
    apply_ms: float
    # Compact deltas applied in place (a parted delta's parts one each),
    # those of them that started every chunk from the class totals the
    # replica held (no look-back), and those that found the held totals
    # wrong and were redone exactly. Once the changes have been taken
    # (load_into(), the vLLM engine), updates record the next ones: they
    # apply a compact delta by a decode and a scatter instead, and count 0
    # here.
    compact_applies: int
    held_applies: int
    stale_applies: int


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def _byte_size(size: int | str | None) -> int:
    """0 for None; bytes for an int or "5GB" / "500MB" / "2GiB" (as the CLI's --max-shard-size)."""
    if size is None:
        return 0
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool) and 0 < int(size) < 2**64:
        return int(size)
    if isinstance(size, str):
        m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", size)
        if m and m.group(2).lower() in _UNITS and int(m.group(1)) > 0:
            value = int(m.group(1)) * _UNITS[m.group(2).lower()]
            if value < 2**64:
                return value
    raise InvalidArgumentError(f"max_shard_size must be a positive byte count or a size such as '5GB', got {size!r}")


class Replica:
    """Follows a bucket: loads the nearest anchor, replays deltas, verifies everything.

    Bit-exact or loud: update() either reaches the target version with a
    state whose hash matches the manifest, or raises (IntegrityError,
    CorruptionError, NotFoundError, ...) naming the version and the reason,
    and the replica stays on the last version it fully verified. A damaged
    or missing object is routed around (another chain, a later anchor) and
    listed in ``bad_objects``; update() raises only when no route is left.
    """

    def __init__(self, bucket: str, *, threads: int = 0) -> None:
        if threads < 0:
            raise InvalidArgumentError(f"threads must not be negative, got {threads}")
        self.bucket = _bucket_url(bucket)
        # Opening checks that the bucket exists (NotFoundError otherwise);
        # nothing is downloaded before update().
        self._native = _native.Replica(self.bucket, int(threads))
        self.last_update: UpdateResult | None = None

    def update(self, version: int | None = None) -> int:
        """Moves to ``version`` (default: the newest published); returns the version now held.

        Releases the GIL while it downloads and applies. Arrays from
        tensors() stay valid (same memory) and show the new contents after
        it returns.
        """
        if version is not None:
            if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or not 0 < int(version) < 2**64:
                raise InvalidArgumentError(f"version must be a positive integer or None, got {version!r}")
            version = int(version)
        stats = self._native.update(version)
        self.last_update = UpdateResult(**stats)
        return self._native.version

    @property
    def version(self) -> int:
        """The version held, 0 before the first update()."""
        return self._native.version

    @property
    def state_hash(self) -> str:
        """32 hex digits: the verified hash of the held state (the manifest's for this version)."""
        return self._native.state_hash

    @property
    def bad_objects(self) -> list[dict[str, Any]]:
        """The bucket objects update() found damaged or missing and routes around.

        ``[{"key", "version", "kind", "reason"}]`` in the order found; ``kind``
        is "integrity", "not_found" or "corruption". An object stays listed (and
        is not fetched again) while the manifest lists it with the same content.
        """
        return self._native.bad_objects

    def latest_available(self) -> int:
        """Re-reads the manifest; the newest published version (0 when none). Does not move."""
        return self._native.latest_available()

    def verify(self) -> None:
        """Recomputes the held state's hash from its memory and checks it against the manifest.

        O(model) (about 0.1 s per GB per thread). Catches writes into the
        state behind the replica's back, e.g. through the torch tensors of
        ``tensors(framework="torch")``, which cannot be made read-only. On a
        mismatch raises IntegrityError and the replica holds version 0: the
        next update() reloads the state from an anchor (into the same memory).
        """
        self._native.verify()

    def tensors(self, framework: str = "numpy") -> dict[str, Any]:
        """The held weights as read-only, zero-copy arrays: ``{name: array}``.

        numpy (default): bf16 as ml_dtypes.bfloat16, other dtypes as numpy's.
        The arrays keep this Replica alive and share its memory; update()
        changes their contents in place (copy what must stay fixed).
        ``framework="torch"``: torch CPU tensors sharing the memory
        (deltasync.torch.tensors; needs torch).
        """
        if framework == "numpy":
            return _views(self._native.tensors("numpy"))
        if framework == "torch":
            from . import torch as _dtorch  # lazily: torch is optional

            return _dtorch.tensors(self)
        raise InvalidArgumentError(f"framework must be 'numpy' or 'torch', got {framework!r}")

    def load_into(self, state_dict: Mapping[str, Any]) -> int:
        """Copies the weights into ``state_dict``'s torch tensors; returns the elements copied.

        The first call copies everything, later ones only what changed since
        the previous load_into (deltasync.torch.load_into; needs torch).
        """
        from . import torch as _dtorch  # lazily: torch is optional

        return _dtorch.load_into(self, state_dict)

    def save_hf_dir(self, path: str | os.PathLike, *, max_shard_size: int | str | None = None,
                    force: bool = False) -> str:
        """Writes the held version as a Hugging Face model folder at ``path``; returns the path.

        The weights (bf16 as published) keep the published folder's sharding
        and ``model.safetensors.index.json`` (or one ``model.safetensors``),
        unless ``max_shard_size`` (bytes, or "5GB", "500MB", "2GiB") shards
        them afresh; every shard carries ``{"format": "pt"}``. The version's
        side files (config.json, tokenizer files, ...) are fetched and
        verified. The folder appears whole (built beside, then renamed); an
        existing non-empty ``path`` is refused (FailedPreconditionError)
        unless ``force``; a ``path`` that is the local bucket's directory, lies
        inside it or holds it is refused whatever ``force`` says
        (InvalidArgumentError). Load it with ``from_pretrained(path)``.
        """
        if self.version == 0:
            raise FailedPreconditionError("the replica holds no version yet; call update() first")
        self._native.save_hf_dir(os.fspath(path), _byte_size(max_shard_size), bool(force))
        return os.fspath(path)

    def _take_changes(self) -> tuple[bool, dict[str, np.ndarray]]:
        """(everything, {name: sorted flat uint64 indices}) changed since the previous call.

        ``everything`` is True on the first call and after an anchor was
        loaded from scratch: treat every element as changed. Resets the record.
        """
        everything, changes = self._native.take_changes()
        return bool(everything), dict(changes)

    def __repr__(self) -> str:
        return f"deltasync.Replica({self.bucket!r}, version={self.version})"
