"""What the parts of ``deltasync.torch`` share: the dtype a trainer tensor is published as,
checkpoint names without wrapper prefixes, zero-copy numpy views of CPU tensors
(``to_publishable``, re-exported by ``deltasync.torch``, its public home) and the per-object
state the module keeps on publishers and replicas.
"""
from __future__ import annotations

import re
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

import ml_dtypes
import numpy as np
import torch

from ._errors import InvalidArgumentError

# Float32 parameters published as float32 (bitwise) rather than rounded to
# bf16: PublisherOptions::keep_fp32_suffixes' default in the C++ library.
KEEP_FP32_SUFFIXES = ("e_score_correction_bias",)

_NUMPY_OF_TORCH = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.bool: np.bool_,
    torch.uint16: np.uint16,
    torch.uint32: np.uint32,
    torch.uint64: np.uint64,
}
# torch dtypes numpy has no dtype of its own for: carried as ml_dtypes' (as the replica gives them).
_ML_DTYPES_OF_TORCH = {
    torch.bfloat16: ml_dtypes.bfloat16,
    torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
    torch.float8_e5m2: ml_dtypes.float8_e5m2,
}
_TORCH_OF_ML_DTYPES = {np.dtype(v): k for k, v in _ML_DTYPES_OF_TORCH.items()}
# By (kind, width): numpy has two names for some widths (the replica's U64 is numpy.ulonglong,
# which torch.from_numpy refuses, though it takes numpy.uint64).
_TORCH_OF_NUMPY = {(np.dtype(v).kind, np.dtype(v).itemsize): k for k, v in _NUMPY_OF_TORCH.items()}
# Signed integers of each width: the dtypes for which torch implements every comparison and
# index op (index_select/index_copy_ are missing for F8 and the unsigned dtypes).
_SIGNED_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_view(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bit patterns as signed integers of its width, for every dtype: compares NaN and
    -0.0 bitwise, and gives F8, BOOL and the unsigned dtypes the index ops torch lacks for them."""
    return t.view(_SIGNED_OF_SIZE[t.element_size()])


def torch_view(arr: np.ndarray) -> torch.Tensor:
    """A torch tensor sharing ``arr``'s memory, of the matching dtype (bf16 and F8 included)."""
    dtype = _TORCH_OF_ML_DTYPES.get(arr.dtype) or _TORCH_OF_NUMPY.get((arr.dtype.kind, arr.dtype.itemsize))
    if dtype is None:
        raise InvalidArgumentError(f"dtype {arr.dtype} has no torch dtype")
    return torch.from_numpy(arr.view(np.dtype(f"i{arr.dtype.itemsize}"))).view(dtype)

# Wrapper prefixes that do not belong to a parameter's checkpoint name:
# DistributedDataParallel / Accelerate ("module.", leading only: a model may
# have a submodule of that name), and torch's own wrapper components anywhere
# in the name: torch.compile ("_orig_mod.", also of one compiled layer:
# "layers.0._orig_mod.attn.weight"), activation checkpointing
# ("_checkpoint_wrapped_module.") and FSDP1 ("_fsdp_wrapped_module."), which
# torchtitan-style trainers put inside every block.
_WRAPPER_PREFIX = re.compile(r"^(?:module\.)+")
_WRAPPER_COMPONENT = re.compile(r"(?:^|(?<=\.))(?:_orig_mod|_checkpoint_wrapped_module|_fsdp_wrapped_module)\.")


def strip_wrapper_prefix(name: str) -> str:
    """``module.model.layers.0._checkpoint_wrapped_module.weight`` -> ``model.layers.0.weight``."""
    return _WRAPPER_PREFIX.sub("", _WRAPPER_COMPONENT.sub("", name))


def _published_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype a trainer tensor is published as (what the C++ publisher does)."""
    if dtype == torch.float32 and not name.endswith(KEEP_FP32_SUFFIXES):
        return torch.bfloat16
    return dtype


# --------------------------------------------------------------------------
# host tensors -> numpy views


def _numpy_view(name: str, t: torch.Tensor) -> np.ndarray:
    """A zero-copy numpy view of a contiguous CPU tensor (bf16 as ml_dtypes.bfloat16)."""
    if t.dtype in _ML_DTYPES_OF_TORCH:
        return bits_view(t).numpy().view(_ML_DTYPES_OF_TORCH[t.dtype])
    np_dtype = _NUMPY_OF_TORCH.get(t.dtype)
    if np_dtype is None:
        raise InvalidArgumentError(f"tensor {name}: dtype {t.dtype} cannot be published")
    return t.numpy()


def to_publishable(tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], *,
                   contiguous: bool = False) -> dict[str, np.ndarray]:
    """Turns CPU torch tensors into arrays ``Publisher.publish`` takes, without copying.

    The arrays share memory with the tensors: a synchronous ``publish`` reads
    them in place; one with ``background=True`` takes their bf16 form before
    it returns.

    A non-contiguous tensor is refused with ``InvalidArgumentError`` naming it,
    unless ``contiguous=True``: then it is copied with ``Tensor.contiguous()``
    (the only case that copies). CUDA tensors are refused too: publish them
    with :func:`publish` or a :class:`DeviceTracker`, which sends only the
    changed elements across PCIe.
    """
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    out: dict[str, np.ndarray] = {}
    for name, t in items:
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(f"tensor {name}: expected a torch.Tensor, got {type(t).__name__}")
        t = t.detach()
        if t.device.type != "cpu":
            raise InvalidArgumentError(
                f"tensor {name} is on {t.device}: to_publishable takes CPU tensors; publish device "
                "tensors with deltasync.torch.publish() or a DeviceTracker")
        if not t.is_contiguous():
            if not contiguous:
                raise InvalidArgumentError(
                    f"tensor {name} is not contiguous (shape {tuple(t.shape)}, strides {t.stride()}): "
                    "pass contiguous=True to copy it, or call .contiguous() first")
            t = t.contiguous()
        out[name] = _numpy_view(name, t)
    return out


def _host_snapshot(name: str, t: torch.Tensor) -> torch.Tensor:
    """A private copy of ``t`` in its published dtype (bf16 for fp32 weights), on the host."""
    return t.detach().to(device="cpu", dtype=_published_dtype(name, t.dtype), copy=True).contiguous()


_side_tables: dict[str, "weakref.WeakKeyDictionary[Any, Any]"] = {}
_side_fallback: dict[tuple[str, int], Any] = {}


def _side_get(obj, key: str, default=None):
    """Per-object state kept by this module (an attribute, else a weak side table)."""
    attr = "_deltasync_torch_" + key
    try:
        return getattr(obj, attr)
    except AttributeError:
        pass
    table = _side_tables.get(key)
    try:
        return table[obj] if table is not None else default
    except (KeyError, TypeError):
        return _side_fallback.get((key, id(obj)), default)


def _side_set(obj, key: str, value) -> None:
    try:
        setattr(obj, "_deltasync_torch_" + key, value)
        return
    except (AttributeError, TypeError):
        pass
    try:
        _side_tables.setdefault(key, weakref.WeakKeyDictionary())[obj] = value
    except TypeError:  # neither attributes nor weak references: keyed by id
        _side_fallback[(key, id(obj))] = value
