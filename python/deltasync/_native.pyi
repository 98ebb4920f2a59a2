# Type stubs for deltasync._native (python/native/*.cc, nanobind).
# The public API is deltasync.Publisher / deltasync.Replica; this module is
# their engine. Every method raises a deltasync.Error subclass (from
# deltasync._errors) carrying the C++ Status message on failure.
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

class Snapshot:
    @property
    def nbytes(self) -> int: ...

class Publisher:
    def __init__(
        self,
        bucket: str,
        # The bucket's settings: None = the stored value (or the default).
        anchor_interval: int | None,
        encoding: str | None,
        cumulative_interval: int | None,
        anchor_max_fraction: float | None,
        change_settings: bool,
        allow_version_jump: bool,
        threads: int,
        allow_nonfinite: bool,
        create_bucket: bool,
        notify: Sequence[str],
        notify_token: str,
        measure_gap_delta: bool,
    ) -> None: ...
    # items: (name, array, dtype override such as "BF16" for uint16 bits, or "" to
    # take the array's own dtype). Arrays: CPU, C-contiguous, read zero-copy (numpy
    # buffer protocol or DLPack). Returns deltasync::PublishStats as a dict.
    # Releases the GIL while it publishes.
    # unchanged: called (with the GIL) after every array was read, before
    # anything is uploaded; a string it returns refuses the version.
    def publish(self, version: int, items: Sequence[tuple[str, Any, str]],
                unchanged: Callable[[], str | None] | None = None) -> dict[str, Any]: ...
    # The published (bf16) form of the arrays, owned (deltasync::Publisher::
    # Snapshot); does not wait for a publish in progress.
    def snapshot(self, items: Sequence[tuple[str, Any, str]]) -> Snapshot: ...
    # Publishes a snapshot taken earlier. Releases the GIL.
    def publish_snapshot(self, version: int, snapshot: Snapshot) -> dict[str, Any]: ...
    # items: (name, 1-D uint64 flat indices, values of the published dtype's width).
    def publish_changes(self, version: int, items: Sequence[tuple[str, Any, Any]]) -> dict[str, Any]: ...
    # A Hugging Face model folder (deltasync::ReadHfFolder + PublishFolder):
    # shards mapped zero-copy, side files as the version's set. Releases the GIL.
    def publish_dir(self, version: int, path: str) -> dict[str, Any]: ...
    @property
    def latest_version(self) -> int: ...
    # deltasync::Publisher::degraded_reason(): "" unless the newest version
    # could not be rebuilt (the next publish() is then a recovered anchor).
    @property
    def degraded_reason(self) -> str: ...
    # {"encoding", "anchor_interval", "cumulative_interval", "anchor_max_fraction"}
    # in use (deltasync::Publisher::settings).
    @property
    def settings(self) -> dict[str, Any]: ...
    # "encoding compact -> gap_delta" per stored setting this publisher changes.
    @property
    def changed_settings(self) -> list[str]: ...
    # {name: "BF16" | "F32" | ...} of the published state.
    def published_dtypes(self) -> dict[str, str]: ...
    # [(name, dtype name, read-only view)]; numpy: bf16 as uint16, fp8 as uint8;
    # torch: bf16 as torch.bfloat16. The views keep the publisher alive.
    def state_tensors(self, framework: str = "numpy") -> list[tuple[str, str, Any]]: ...

class Replica:
    def __init__(self, bucket: str, threads: int) -> None: ...
    # Moves to `version` (newest when None); returns deltasync::UpdateStats as a
    # dict. Releases the GIL while it downloads and applies.
    def update(self, version: int | None = None) -> dict[str, Any]: ...
    @property
    def version(self) -> int: ...
    @property
    def state_hash(self) -> str: ...
    # deltasync::Replica::bad_objects(): [{key, version, kind, reason}].
    @property
    def bad_objects(self) -> list[dict[str, Any]]: ...
    def latest_available(self) -> int: ...
    # [(name, dtype name, read-only zero-copy view)]; numpy: bf16 as uint16, fp8
    # as uint8; torch: bf16 as torch.bfloat16. The views keep the replica alive
    # and keep their address across updates (contents change in place).
    def tensors(self, framework: str = "numpy") -> list[tuple[str, str, Any]]: ...
    # Recomputes the held state's hash (deltasync::Replica::Verify); raises
    # IntegrityError (and holds version 0) when the memory was changed.
    def verify(self) -> None: ...
    # (everything, {name: sorted uint64 flat indices}) = Replica::TakeChanges().
    def take_changes(self) -> tuple[bool, dict[str, npt.NDArray[np.uint64]]]: ...
    # The held version as a model folder (deltasync::WriteReplicaFolder);
    # max_shard_bytes 0 keeps the published sharding. Releases the GIL.
    def save_hf_dir(self, path: str, max_shard_bytes: int, force: bool) -> None: ...

# Parts (include/deltasync/part_publisher.h): tensors [(name, dtype, shape)],
# parts [[(tensor index, offset, shape)]]; receipts travel as strings.
class PartPublisher:
    def __init__(
        self, bucket: str, tensors: Sequence[tuple[str, str, Sequence[int]]],
        parts: Sequence[Sequence[tuple[int, Sequence[int], Sequence[int]]]], part: int,
        anchor_interval: int | None, threads: int, allow_nonfinite: bool, allow_version_jump: bool,
        create_bucket: bool,
    ) -> None: ...
    def publish(self, version: int, items: Sequence[tuple[str, Any, str]]) -> str: ...
    def finish(self, committed: bool, manifest_token: str | None = None) -> None: ...
    @property
    def latest_version(self) -> int: ...
    @property
    def part_hash(self) -> str: ...

class PartCommitter:
    def __init__(
        self, bucket: str, tensors: Sequence[tuple[str, str, Sequence[int]]],
        parts: Sequence[Sequence[tuple[int, Sequence[int], Sequence[int]]]], anchor_interval: int | None,
        allow_version_jump: bool, create_bucket: bool,
    ) -> None: ...
    def commit(self, version: int, receipts: Sequence[str]) -> dict[str, Any]: ...
    @property
    def latest_version(self) -> int: ...
    @property
    def manifest_token(self) -> str | None: ...

def _raise(code: str, message: str) -> None: ...
def describe_tensor_set_diff(base: Sequence[str], current: Sequence[str]) -> str: ...
def dtype_size(name: str) -> int: ...
