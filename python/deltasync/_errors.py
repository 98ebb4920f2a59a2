"""deltasync's exceptions: one class per C++ ``deltasync::ErrorCode``.

The native module raises these classes (looked up here by name) with the C++
``Status`` message as the only argument; ``.code`` is the stable lower-case
name of the code (``"integrity"``, ``"not found"``, ``"io error"``, ...), as
``deltasync::ErrorCodeName`` spells it.
"""
from __future__ import annotations

__all__ = [
    "Error",
    "InvalidArgumentError",
    "NotFoundError",
    "CorruptionError",
    "IntegrityError",
    "StoreIOError",
    "UnsupportedError",
    "ConflictError",
    "FailedPreconditionError",
    "InternalError",
]


class Error(Exception):
    """Base class of every deltasync error. ``str(e)`` is the C++ message."""

    code: str = "unknown"

    def __init__(self, message: str = "", *args: object) -> None:
        super().__init__(message, *args)
        self.message = message


class InvalidArgumentError(Error, ValueError):
    """The caller's input is wrong (bad version, shape, dtype, non-contiguous array, ...)."""

    code = "invalid argument"


class NotFoundError(Error, LookupError):
    """An object, tensor, version or bucket does not exist."""

    code = "not found"


class CorruptionError(Error):
    """Bytes violate a format rule (truncated, malformed, ...)."""

    code = "corruption"


class IntegrityError(Error):
    """A hash does not match what the manifest promises."""

    code = "integrity"


class StoreIOError(Error):
    """The OS or the network failed (C++ ``kIOError``)."""

    code = "io error"


class UnsupportedError(Error):
    """Well-formed but not supported here."""

    code = "unsupported"


class ConflictError(Error):
    """Another writer changed the bucket; the version already exists."""

    code = "conflict"


class FailedPreconditionError(Error):
    """The object is in the wrong state for this call (e.g. publish_changes before the first version)."""

    code = "failed precondition"


class InternalError(Error):
    """A bug in deltasync."""

    code = "internal"
