"""PyTorch integration: publish from an optimizer, load replicas into models.

Trainer side:

    handle = deltasync.torch.attach(model, optimizer, publisher)
    ...  # every optimizer.step() now publishes the next version
    handle.flush()   # waits for the queued publishes, re-raises a failure
    handle.remove()

Replica side:

    replica.update()
    deltasync.torch.load_into(replica, model.state_dict())  # all elements first,
                                                            # then only changed ones

Tensors on a CUDA device never cross PCIe whole after the first version: a
:class:`DeviceTracker` keeps a bf16 snapshot of what was published on the
device, finds the changed elements there (``new != snapshot`` on the bit
patterns), and copies only their indices and values to the host for
``Publisher.publish_changes``.

The parts, by role: what they share (``_torch_common.py``: published dtypes,
names, ``to_publishable``), publishing (``_torch_publish.py``: ``publish``,
:class:`DeviceTracker`), ``attach`` (``_torch_attach.py``) and the replica side
(here: ``tensors``, ``load_into``).
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np
import torch

from ._sharded import ShardedPublisher
from ._errors import FailedPreconditionError, InvalidArgumentError
from ._torch_attach import AttachHandle, attach
from ._torch_common import (KEEP_FP32_SUFFIXES, _side_get, _side_set, bits_view, strip_wrapper_prefix,  # noqa: F401
                            to_publishable, torch_view)
from ._torch_publish import DeviceTracker, publish, tracker_for
from ._torch_targets import check_disjoint

__all__ = [
    "AttachHandle",
    "ShardedPublisher",
    "DeviceTracker",
    "attach",
    "load_into",
    "publish",
    "tensors",
    "tracker_for",
    "to_publishable",
]


# --------------------------------------------------------------------------
# replica side


def tensors(replica) -> dict[str, torch.Tensor]:
    """The replica's weights as torch CPU tensors sharing its memory (bf16 as torch.bfloat16).

    Read-only by contract (torch has no read-only tensors): writing into them
    corrupts the replica's verified state, which only ``replica.verify()``
    (a full recomputation of the state hash) detects. Valid until the next
    ``replica.update()``, which changes their contents in place; copy what
    must stay fixed.
    """
    out: dict[str, torch.Tensor] = {}
    with warnings.catch_warnings():
        # torch.from_numpy warns about read-only arrays; they are read-only by contract.
        warnings.filterwarnings("ignore", message=".*not writable.*")
        for name, arr in replica.tensors().items():
            out[name] = torch_view(arr)
    return out


def _fingerprint(targets: dict[str, torch.Tensor]) -> tuple:
    return tuple(sorted((name, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device))
                        for name, t in targets.items()))


def _flat_put(target: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor) -> None:
    # On the bit patterns: torch has no index_copy_/index_put_ for F8 and the unsigned dtypes.
    target, vals = bits_view(target), bits_view(vals)
    if target.is_contiguous():
        target.view(-1).index_copy_(0, idx, vals)
    else:
        target.index_put_(torch.unravel_index(idx, target.shape), vals)


def _check_tied(sources: dict[str, torch.Tensor], targets: dict[str, torch.Tensor]) -> None:
    """Targets that are one tensor (tied weights: an embedding and the LM head) hold one value:
    the replica's tensors for them must be equal bit for bit, else the model would hold only
    one of them (silently). Raised before anything is copied."""
    first: dict[tuple, str] = {}
    for name, t in targets.items():
        key = (str(t.device), t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        other = first.setdefault(key, name)
        if other == name:
            continue
        if not torch.equal(bits_view(sources[other]), bits_view(sources[name])):  # -0.0, NaN: bitwise
            raise InvalidArgumentError(
                f"load_into: tensors {other} and {name} have one target (tied weights) but differ in the "
                "replica: the model cannot hold both; untie them in the model or publish them tied")


def load_into(replica, state_dict: Mapping[str, torch.Tensor]) -> int:
    """Copies the replica's weights into ``state_dict``'s tensors; returns the elements copied.

    ``state_dict`` maps names (wrapper prefixes as ``attach`` strips them are ignored) to tensors on
    any device (``model.state_dict()`` works: its tensors share the
    parameters' memory). Every replica tensor needs a target of the same
    shape and dtype (a bf16 model for bf16 weights); a mismatch is an
    InvalidArgumentError naming the tensor, raised before anything is copied.
    So are two targets that partly share memory (overlapping views into one
    buffer), and tied targets (one tensor under two names) whose replica
    tensors differ. Targets the replica does not have (buffers) are left alone.

    The first call copies everything. Later calls into the same tensors copy
    only the elements that changed since the previous call (the replica
    records them across updates, even several versions apart), gathered on
    the host and scattered with ``index_copy_`` on the target's device. After
    the replica loads an anchor from scratch, or when the targets are not the
    ones filled last time, everything is copied again.
    """
    if replica.version == 0:
        raise FailedPreconditionError("load_into: the replica holds no version yet; call update() first")
    sources = tensors(replica)
    by_name: dict[str, torch.Tensor] = {}
    for key, t in state_dict.items():
        by_name.setdefault(strip_wrapper_prefix(key), t)
    targets: dict[str, torch.Tensor] = {}
    for name, src in sources.items():
        dst = by_name.get(name)
        if dst is None:
            raise InvalidArgumentError(f"load_into: tensor {name} has no target in the state dict")
        if tuple(dst.shape) != tuple(src.shape):
            raise InvalidArgumentError(
                f"load_into: tensor {name}: target shape {tuple(dst.shape)} != replica shape {tuple(src.shape)}")
        if dst.dtype != src.dtype:
            raise InvalidArgumentError(
                f"load_into: tensor {name}: target dtype {dst.dtype} != replica dtype {src.dtype}")
        targets[name] = dst
    fingerprint = _fingerprint(targets)
    same_targets = _side_get(replica, "loaded") == fingerprint  # the targets the last load_into filled
    if not same_targets:  # (those were checked then)
        check_disjoint(targets)
    _check_tied(sources, targets)
    everything, changes = replica._take_changes()
    if not same_targets:
        everything = True
    _side_set(replica, "loaded", None)  # until this load completes
    copied = 0
    with torch.no_grad():
        if everything:
            for name, src in sources.items():
                targets[name].copy_(src)
                copied += src.numel()
        else:
            for name, idx_np in changes.items():
                src = sources[name]
                dst = targets[name]
                idx = torch.from_numpy(np.asarray(idx_np).astype(np.int64, copy=False))
                vals = bits_view(src.reshape(-1)).index_select(0, idx).view(src.dtype)
                if dst.device.type != "cpu":
                    idx, vals = idx.to(dst.device, non_blocking=True), vals.to(dst.device, non_blocking=True)
                _flat_put(dst, idx, vals)
                copied += idx.numel()
    _side_set(replica, "loaded", fingerprint)
    return copied
