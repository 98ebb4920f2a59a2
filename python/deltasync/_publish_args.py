"""What ``deltasync.Publisher`` hands the native publisher, checked and converted: bucket URLs,
versions, tensors (numpy, torch CPU tensors, DLPack; bf16/fp8 as unsigned integers of their
width plus the deltasync dtype name), changes' indices and values; and the native side's
(name, dtype, array) views back as numpy arrays (``_views``).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from ._errors import InvalidArgumentError

# numpy dtypes the C++ core knows but numpy's buffer protocol does not carry:
# they cross as unsigned integers of the same width plus the deltasync name.
_BITWISE_DTYPES = {
    np.dtype(ml_dtypes.bfloat16): (np.uint16, "BF16"),
    np.dtype(ml_dtypes.float8_e4m3fn): (np.uint8, "F8_E4M3"),
    np.dtype(ml_dtypes.float8_e5m2): (np.uint8, "F8_E5M2"),
}


def _bucket_url(bucket: Any) -> str:
    """A bucket argument as the native side takes it: str, with a leading ``~`` expanded.

    The shell expands ``~`` for the CLI; Python does not, and ``"~/b"`` would
    otherwise become a directory named ``~``. Malformed URLs (``s3:/x``) are
    refused by the native side, as for the CLI.
    """
    return os.path.expanduser(os.fspath(bucket) if isinstance(bucket, os.PathLike) else str(bucket))


_MAX_VERSION = 2**53 - 1  # deltasync::kMaxPublishVersion


def _check_version(version: Any) -> int:
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
        raise InvalidArgumentError(f"version must be a positive integer, got {version!r}")
    version = int(version)
    if version <= 0:
        raise InvalidArgumentError(f"version must be a positive integer, got {version}")
    if version > _MAX_VERSION:
        raise InvalidArgumentError(f"version {version} is above 2**53-1 ({_MAX_VERSION}), the largest integer "
                                   "every JSON reader of the manifest keeps exact")
    return version


def _is_torch_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "detach")


def _as_native(name: str, array: Any) -> tuple[Any, str]:
    """(object the native module reads zero-copy, dtype override or "")."""
    if isinstance(array, np.ndarray):
        if not array.dtype.isnative:
            raise InvalidArgumentError(f"tensor '{name}': byte order {array.dtype.str} is not the machine's; "
                                       "convert with .astype(dtype.newbyteorder('='))")
        bitwise = _BITWISE_DTYPES.get(array.dtype)
        if bitwise is not None:
            return array.view(bitwise[0]), bitwise[1]
        return array, ""
    if _is_torch_tensor(array):
        device = getattr(array, "device", None)
        if device is not None and getattr(device, "type", "cpu") != "cpu":
            raise InvalidArgumentError(
                f"tensor '{name}' is on {device}: Publisher.publish reads CPU memory; publish device tensors "
                "with deltasync.torch.publish(publisher, version, tensors), which copies only changed elements "
                "to the host")
        # DLPack refuses tensors that require grad; the bytes are the same.
        return array.detach(), ""
    if hasattr(array, "__dlpack__") or hasattr(array, "__array_interface__") or isinstance(array, memoryview):
        return array, ""
    raise InvalidArgumentError(
        f"tensor '{name}': expected a numpy array or a CPU tensor (DLPack), got {type(array).__name__}")


def _copy_array(array: Any) -> Any:
    """An owned copy of a numpy array or torch tensor (anything else as it is)."""
    if _is_torch_tensor(array):
        return array.detach().clone()
    if isinstance(array, np.ndarray):
        return array.copy()
    return array


def _items(tensors: Any) -> list[tuple[str, Any]]:
    items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)
    seen: set[str] = set()
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2):
            raise InvalidArgumentError(f"tensors must be a mapping or (name, array) pairs, got an item {item!r:.80}")
        if not isinstance(item[0], str):
            raise InvalidArgumentError(f"tensor names must be str, got {item[0]!r:.80}")
        if item[0] in seen:
            raise InvalidArgumentError(f"tensor '{item[0]}' is given twice")
        seen.add(item[0])
    return items


def _as_indices(name: str, indices: Any) -> np.ndarray:
    if _is_torch_tensor(indices):
        indices = indices.detach().cpu().numpy()
    idx = np.asarray(indices)
    if idx.dtype.kind not in "iu":
        raise InvalidArgumentError(f"tensor '{name}': change indices must be integers, got {idx.dtype}")
    idx = idx.reshape(-1)
    if idx.dtype.kind == "i" and idx.size and idx.min() < 0:
        raise InvalidArgumentError(f"tensor '{name}': negative change index {int(idx.min())}")
    return np.ascontiguousarray(idx.astype(np.uint64, copy=False))


def _as_values(name: str, values: Any, published: str | None) -> np.ndarray:
    if _is_torch_tensor(values):
        values = values.detach()
        import torch  # only reached with torch tensors

        if values.dtype == torch.bfloat16:
            values = values.cpu().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        else:
            values = values.cpu().numpy()
    vals = np.asarray(values).reshape(-1)
    if published == "BF16" and vals.dtype == np.float32:
        vals = vals.astype(ml_dtypes.bfloat16)  # round to nearest even, like Publisher.publish
    bitwise = _BITWISE_DTYPES.get(vals.dtype)
    if bitwise is not None:
        vals = vals.view(bitwise[0])
    return np.ascontiguousarray(vals)


def _views(items: list[tuple[str, str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Native (name, dtype, array) views -> {name: numpy array}, bf16/fp8 as ml_dtypes types."""
    out: dict[str, np.ndarray] = {}
    for name, dtype, array in items:
        if dtype == "BF16":
            array = array.view(ml_dtypes.bfloat16)
        elif dtype == "F8_E4M3":
            array = array.view(ml_dtypes.float8_e4m3fn)
        elif dtype == "F8_E5M2":
            array = array.view(ml_dtypes.float8_e5m2)
        out[name] = array
    return out
