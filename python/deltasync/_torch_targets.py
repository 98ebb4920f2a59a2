"""``deltasync.torch.load_into``'s check that no two targets partly share memory.

Two targets that are one tensor (tied weights: the same device, address, shape, strides and dtype)
hold one value and are checked by ``load_into`` (the replica's tensors must be equal). Any other
two targets that share a byte (views into one flat buffer with overlapping ranges, a tensor and a
slice of it, two dtypes over the same bytes) cannot hold both replica tensors: whichever is copied
last would win in the shared bytes, silently. This finds them before anything is copied.

Exact, not a guess from address ranges: the byte ranges of the targets are sorted per device, and
only where two ranges intersect are the bytes each target really covers counted (a CPU counter over
that stretch, written through ``as_strided`` views with the targets' own strides), so interleaved
views that share no element (the even and odd columns of one buffer) stay allowed.
"""
from __future__ import annotations

import torch

from ._errors import InvalidArgumentError


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[first, end) bytes of t's elements (torch strides are never negative)."""
    span = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    start = t.data_ptr()
    return start, start + (span + 1) * t.element_size()


def _bytes_view(counter: torch.Tensor, t: torch.Tensor, offset: int) -> torch.Tensor:
    """A uint8 view of `counter` with one element per byte of t's elements, t's first byte at `offset`."""
    size = t.element_size()
    return counter.as_strided(tuple(t.shape) + (size,), tuple(s * size for s in t.stride()) + (1,), offset)


def _check_group(group: list[tuple[int, int, str]], targets: dict[str, torch.Tensor]) -> None:
    """`group`: (start, end, name) whose byte ranges chain into one stretch; raises if two share a byte."""
    if len(group) < 2:
        return
    base = min(start for start, _, _ in group)
    counter = torch.zeros(max(end for _, end, _ in group) - base, dtype=torch.uint8)
    seen: list[tuple[str, torch.Tensor]] = []
    for start, _, name in group:
        view = _bytes_view(counter, targets[name], start - base)
        shared = bool(view.any())
        try:
            view.add_(1)
        except RuntimeError:  # torch refuses to write through a view whose elements alias
            shared = True
        if not shared and not bool((view > 1).any()):
            seen.append((name, view))
            continue
        other = next((n for n, v in seen if bool((v > 1).any())), None)
        if other is None:
            raise InvalidArgumentError(f"load_into: target {name} has elements that share memory with each other "
                                       "(an expanded or self-overlapping view); it cannot hold the replica's tensor")
        raise InvalidArgumentError(
            f"load_into: targets {other} and {name} partly share memory (views into one buffer that overlap) but "
            "are not one tensor: the model cannot hold both replica tensors; give each its own memory, or tie "
            "them as one tensor")


def check_disjoint(targets: dict[str, torch.Tensor]) -> None:
    """Raises InvalidArgumentError when two targets share memory without being one tensor (module doc)."""
    one_tensor: dict[tuple, str] = {}
    for name, t in targets.items():
        if t.numel() == 0 or t.device.type == "meta":
            continue
        one_tensor.setdefault((str(t.device), t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype), name)
    ranges = sorted((key[0], *_byte_range(targets[name]), name) for key, name in one_tensor.items())
    group: list[tuple[int, int, str]] = []
    device, end = None, 0
    for dev, start, stop, name in ranges:
        if group and dev == device and start < end:
            group.append((start, stop, name))
            end = max(end, stop)
            continue
        _check_group(group, targets)
        group, device, end = [(start, stop, name)], dev, stop
    _check_group(group, targets)
