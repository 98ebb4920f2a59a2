"""deltasync: keeps LLM inference replicas in step with an RL trainer.

Only the bf16 weights that changed travel, through a bucket (a directory or
s3://), verified bit for bit. See docs/python.md.

    import deltasync
    with deltasync.Publisher("/shared/bucket", anchor_interval=10) as pub:
        pub.publish(1, {"w": weights_fp32})          # numpy / torch CPU arrays
    replica = deltasync.Replica("/shared/bucket")
    replica.update()                                 # newest version, verified
    replica.tensors()["w"]                           # read-only bf16 view
"""
from ._errors import (
    ConflictError,
    CorruptionError,
    Error,
    FailedPreconditionError,
    IntegrityError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    StoreIOError,
    UnsupportedError,
)
from ._publisher import Publisher, PublishResult
from ._replica import Replica, UpdateResult

__version__ = "0.1.0"

__all__ = [
    "ConflictError",
    "CorruptionError",
    "Error",
    "FailedPreconditionError",
    "IntegrityError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PublishResult",
    "Publisher",
    "Replica",
    "StoreIOError",
    "UnsupportedError",
    "UpdateResult",
    "__version__",
]
