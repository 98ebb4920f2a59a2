"""``deltasync.torch.attach``: publishes a model's weights after every ``optimizer.step()``
(the optimizer's parameters named after the model's, a step post-hook, the
:class:`AttachHandle`), or, under ``torch.distributed`` or with a ``ShardedPublisher``, each
rank its own part (``_sharded.py``). Re-exported by ``deltasync.torch``, its public home.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from . import _sharded
from ._publisher import Publisher, distributed_world_size
from ._sharded import ShardedPublisher
from ._errors import FailedPreconditionError, InvalidArgumentError
from ._torch_common import strip_wrapper_prefix
from ._torch_publish import publish


def _storage_key(t: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))


def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 names: Mapping[str, str] | Callable[[str], str | None] | None,
                 sharded: bool = False) -> list[tuple[str, torch.Tensor]]:
    # DTensors have no storage of their own to compare: matched by identity.
    def key_of(p: torch.Tensor):
        return id(p) if sharded or callable(getattr(p, "full_tensor", None)) else _storage_key(p)

    by_storage: dict[Any, str] = {}
    for raw_name, p in model.named_parameters():
        by_storage.setdefault(key_of(p), raw_name)
    out: list[tuple[str, torch.Tensor]] = []
    seen: dict[str, str] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            raw = by_storage.get(key_of(p))
            if raw is None:
                raise InvalidArgumentError(
                    f"an optimizer parameter of shape {tuple(p.shape)} is not a parameter of the model "
                    "(attach() needs the model that owns the optimizer's parameters)")
            if callable(names):
                name = names(raw)
            elif names is not None:
                stripped = strip_wrapper_prefix(raw)
                name = names[raw] if raw in names else names.get(stripped, stripped)
            else:
                name = strip_wrapper_prefix(raw)
            if name is None:
                continue
            if name in seen:
                raise InvalidArgumentError(f"parameters {seen[name]} and {raw} both publish as {name}")
            if not sharded and callable(getattr(p, "full_tensor", None)):
                raise InvalidArgumentError(
                    f"parameter {raw} is sharded (a DTensor, e.g. FSDP2): pass a deltasync.torch.ShardedPublisher "
                    "to attach() on every rank (each rank publishes its own part), or gather with full_tensor() "
                    "and call deltasync.torch.publish() on rank 0")
            seen[name] = raw
            out.append((name, p))
    if not out:
        raise InvalidArgumentError("attach(): the optimizer has no parameters to publish")
    return out


class AttachHandle:
    """What :func:`attach` returns. ``remove()`` stops publishing; ``flush()`` waits."""

    def __init__(self, publisher, params, start_version: int, background: bool, sparse: bool | None):
        self.publisher = publisher
        self.params = params  # [(name, parameter)]
        self.next_version = start_version
        self.background = background
        self.sparse = sparse
        self.last_result = None  # PublishResult or Future of the newest version
        self._hook = None

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.params]

    def publish_now(self):
        """Publishes the current parameters as the next version (what the hook does).

        A background publish that failed since the last call is raised here
        first (from ``optimizer.step()``), and the version is not consumed:
        the next step publishes it again.
        """
        self.publisher.raise_failure()
        version = self.next_version
        result = publish(self.publisher, version, self.params, background=self.background, sparse=self.sparse)
        self.next_version = version + 1
        self.last_result = result
        return result

    def _on_step(self, optimizer, args, kwargs) -> None:
        with torch.no_grad():
            self.publish_now()

    def flush(self) -> None:
        """Waits for every queued publish; re-raises the first failure."""
        self.publisher.flush()

    def remove(self) -> None:
        """Unhooks the optimizer (queued publishes still complete; call flush() to wait)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


def attach(model: torch.nn.Module, optimizer: torch.optim.Optimizer, publisher, *, start_version: int | None = None,
           names: Mapping[str, str] | Callable[[str], str | None] | None = None, background: bool = True,
           sparse: bool | None = None) -> AttachHandle:
    """Publishes the model's weights after every ``optimizer.step()``.

    Versions are ``start_version``, ``start_version + 1``, ... (one per step);
    by default ``start_version`` is one past the publisher's newest version
    (after its queued publishes), so a restarted trainer continues the
    bucket's numbering. A given ``start_version`` at or below it is refused
    (InvalidArgumentError).
    The optimizer's parameters are named after the model's parameters they
    share storage with, with a leading ``module.`` (DDP, Accelerate) and torch's wrapper
    components anywhere (``_orig_mod.``, ``_checkpoint_wrapped_module.``,
    ``_fsdp_wrapped_module.``) removed. ``names`` renames: a mapping from the
    model's (or the stripped) name to the published one (names it lacks keep
    the stripped name; a None value leaves the parameter out), or a callable
    taking the model's name and returning the published one or None.

    With ``background=True`` (the default) the step returns as soon as a
    private snapshot is taken (bf16 on the host for CPU parameters; only the
    changed elements for accelerator parameters) and the publisher encodes
    and uploads it on its own thread; at most ``max_pending`` versions queue
    up, then ``step()`` blocks. A background publish that failed is raised
    by the next ``step()`` (or ``handle.flush()``, whichever comes first),
    and that step publishes again. ``sparse`` as in :func:`publish` (None:
    by device).

    Under ``torch.distributed`` with world size > 1 the same call, made on
    every rank (a collective), publishes the model as parts: each rank its
    own blocks (DTensor placements; a plain parameter by rank 0), rank 0
    commits, with the Publisher's bucket and settings, as a
    ``ShardedPublisher`` would (docs/python.md, "Sharded trainers"). Settings
    parts do not support are refused (InvalidArgumentError naming them) and
    the Publisher itself is never opened; a ShardedHandle is returned.

    Needs PyTorch >= 2.1 (``Optimizer.register_step_post_hook``).
    """
    if not hasattr(optimizer, "register_step_post_hook"):
        raise FailedPreconditionError("attach() needs PyTorch >= 2.1 (Optimizer.register_step_post_hook)")
    if isinstance(publisher, ShardedPublisher):
        return _sharded.attach(model, optimizer, publisher, _param_names(model, optimizer, names, sharded=True),
                               start_version=start_version, background=background)
    world = distributed_world_size()
    if world > 1 and isinstance(publisher, Publisher):
        # Every rank publishes its own part, as with a ShardedPublisher of the same bucket and settings.
        if sparse is not None:
            raise InvalidArgumentError(f"attach(sparse={sparse}): under torch.distributed (world size {world}) "
                                       "every rank copies its own blocks to the host; leave sparse out")
        sharded = _sharded.from_publisher(publisher, world)
        handle = _sharded.attach(model, optimizer, sharded, _param_names(model, optimizer, names, sharded=True),
                                 start_version=start_version, background=background)
        publisher._parted = handle
        return handle
    params = _param_names(model, optimizer, names)
    publisher.flush()  # the queued versions count: start after them
    latest = publisher.latest_version
    if start_version is None:
        start_version = latest + 1
    elif start_version <= latest:
        raise InvalidArgumentError(
            f"attach(start_version={start_version}): {publisher.bucket} already holds version {latest}; "
            f"leave start_version out to continue at {latest + 1}")
    handle = AttachHandle(publisher, params, start_version, background, sparse)
    handle._hook = optimizer.register_step_post_hook(handle._on_step)
    return handle
