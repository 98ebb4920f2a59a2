"""Session 49: the Python faults session 48's review left open (docs/benchmarks.md, "Session 48 (helper H4)").

- deltasync.torch.load_into with targets that partly share memory (overlapping views into one
  buffer): an InvalidArgumentError before anything is copied (tied targets stay supported).
- Publisher.close() racing a publish from another thread: ordered (close waits for a publish that
  began before it, refuses one that begins after), nothing publishes after close() returned.
"""
import threading

import ml_dtypes
import numpy as np
import pytest

import deltasync
from test_publisher_replica import _GatedNative

BF16 = ml_dtypes.bfloat16


def weights(seed):
    rng = np.random.default_rng(seed)
    return {"a.weight": rng.normal(0, 0.02, (32, 16)).astype(np.float32).astype(BF16),
            "b.weight": rng.normal(0, 0.02, (32, 16)).astype(np.float32).astype(BF16)}


# ----------------------------------------------------------------- load_into


@pytest.fixture
def replica(bucket):
    with deltasync.Publisher(bucket) as pub:
        pub.publish(1, weights(1))
    r = deltasync.Replica(bucket)
    r.update()
    return r


def _bits(t):
    import torch
    return t.contiguous().view(torch.int16)


@pytest.mark.parametrize("layout", ["rows 0-31 and 16-47 of a flat buffer", "a tensor and a shifted slice",
                                    "two overlapping blocks of a matrix"])
def test_load_into_refuses_targets_that_partly_overlap(replica, layout):
    torch = pytest.importorskip("torch")
    import deltasync.torch as dt

    if layout == "rows 0-31 and 16-47 of a flat buffer":
        buf = torch.zeros(64 * 16, dtype=torch.bfloat16)
        a, b = buf[:32 * 16].view(32, 16), buf[16 * 16:48 * 16].view(32, 16)
    elif layout == "a tensor and a shifted slice":
        buf = torch.zeros(64, 16, dtype=torch.bfloat16)
        a, b = buf[8:40], buf[:32]
    else:  # rows 16-31, columns 8-15 are in both (neither is contiguous)
        buf = torch.zeros(48, 32, dtype=torch.bfloat16)
        a, b = buf[:32, :16], buf[16:48, 8:24]
    with pytest.raises(deltasync.InvalidArgumentError, match="partly share memory"):
        dt.load_into(replica, {"a.weight": a, "b.weight": b})
    assert not bool(buf.view(torch.int16).any())  # nothing copied


def test_load_into_checks_new_targets_after_a_load_into_others(replica):
    """The check is skipped only for the very targets the last load filled; other targets (the same
    names and shapes, now overlapping) are checked again."""
    torch = pytest.importorskip("torch")
    import deltasync.torch as dt

    dt.load_into(replica, {"a.weight": torch.zeros(32, 16, dtype=torch.bfloat16),
                           "b.weight": torch.zeros(32, 16, dtype=torch.bfloat16)})
    buf = torch.zeros(48, 16, dtype=torch.bfloat16)
    with pytest.raises(deltasync.InvalidArgumentError, match="partly share memory"):
        dt.load_into(replica, {"a.weight": buf[:32], "b.weight": buf[16:]})
    assert not bool(buf.view(torch.int16).any())


def test_load_into_takes_interleaved_views_that_share_no_element(replica):
    """Views whose byte ranges intersect but whose elements do not (the even and odd columns of one
    buffer) are separate targets: loaded exactly."""
    torch = pytest.importorskip("torch")
    import deltasync.torch as dt

    buf = torch.zeros(32, 32, dtype=torch.bfloat16)
    targets = {"a.weight": buf[:, 0::2], "b.weight": buf[:, 1::2]}
    assert dt.load_into(replica, targets) == 2 * 32 * 16
    for name, t in targets.items():
        assert torch.equal(_bits(t), dt.tensors(replica)[name].view(torch.int16))


def test_load_into_refuses_a_self_overlapping_target(replica):
    torch = pytest.importorskip("torch")
    import deltasync.torch as dt

    # An expanded row (one row of memory for 32 rows) beside a tensor over the same buffer.
    flat = torch.zeros(32 * 16 + 16, dtype=torch.bfloat16)
    targets = {"a.weight": flat[:16].expand(32, 16), "b.weight": flat[8:8 + 32 * 16].view(32, 16)}
    with pytest.raises(deltasync.InvalidArgumentError):
        dt.load_into(replica, targets)
    assert not bool(flat.view(torch.int16).any())


def test_load_into_tied_targets_still_load(bucket):
    """Session 48's tied route (one tensor under two names, equal replica tensors) is not an overlap."""
    torch = pytest.importorskip("torch")
    import deltasync.torch as dt

    w = weights(2)
    with deltasync.Publisher(bucket) as pub:
        pub.publish(1, {"a.weight": w["a.weight"], "b.weight": w["a.weight"].copy()})
    r = deltasync.Replica(bucket)
    r.update()
    shared = torch.zeros(32, 16, dtype=torch.bfloat16)
    assert dt.load_into(r, {"a.weight": shared, "b.weight": shared}) > 0
    assert torch.equal(_bits(shared), dt.tensors(r)["a.weight"].view(torch.int16))


# --------------------------------------------------------------------- close


# _GatedNative: the real native publisher whose publish waits for a gate (test_publisher_replica).


def test_close_refuses_a_publish_that_begins_after_it_and_nothing_publishes_after_it_returns(bucket):
    """Thread B publishes at the instant close() has waited for the queue (session 48's window:
    between flush()'s return and the publisher marked closed). B must be refused: on the old code
    it ran inline, after close() returned."""
    pub = deltasync.Publisher(bucket)
    pub.publish(1, weights(1))
    gated = _GatedNative(pub._native)
    pub._native = gated
    outcome = {}
    attempted = threading.Event()

    def publish_from_b():
        try:
            outcome["result"] = pub.publish(2, weights(2))
        except Exception as exc:  # noqa: BLE001 - inspected below
            outcome["error"] = exc
        finally:
            attempted.set()

    b = threading.Thread(target=publish_from_b)
    real_flush = pub.flush

    def flush_then_b_publishes():
        real_flush()
        if not b.is_alive() and not attempted.is_set():
            b.start()
            # Until B was refused or its publish is running.
            for _ in range(600):
                if attempted.wait(0.05) or gated.started.is_set():
                    break

    pub.flush = flush_then_b_publishes
    pub.close()
    running_after_close = gated.started.is_set() and not attempted.is_set()
    gated.gate.set()
    if not b.is_alive() and not attempted.is_set():
        b.start()  # close() no longer goes through flush(): B begins after it
    b.join(60)
    assert not running_after_close, "B's publish was running after close() returned"
    assert "error" in outcome, f"B's publish after close() committed: {outcome}"
    assert isinstance(outcome["error"], deltasync.FailedPreconditionError)
    assert "closed" in str(outcome["error"])
    assert not gated.started.is_set()
    assert deltasync.Replica(bucket).update() == 1


def test_close_waits_for_a_publish_from_another_thread_that_began_before_it(bucket):
    pub = deltasync.Publisher(bucket)
    pub.publish(1, weights(1))
    gated = _GatedNative(pub._native)
    pub._native = gated
    future = pub.publish(2, weights(2), background=True)
    assert gated.started.wait(60)
    closed = threading.Event()
    closer = threading.Thread(target=lambda: (pub.close(), closed.set()))
    closer.start()
    assert not closed.wait(0.3), "close() returned while version 2 was still publishing"
    for _ in range(100):  # until close() has begun (the old code marked the publisher closed at its end)
        if pub._closed:
            break
        closed.wait(0.01)
    with pytest.raises(deltasync.FailedPreconditionError, match="closed"):
        pub.publish(3, weights(3), background=True)  # close() has begun: refused
    gated.gate.set()
    closer.join(60)
    assert closed.is_set()
    assert future.result().version == 2
    assert deltasync.Replica(bucket).update() == 2
