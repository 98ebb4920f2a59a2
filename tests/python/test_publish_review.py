"""Session 48 review of the non-sharded publish paths (Publisher's background queue,
publish_changes, deltasync.torch's DeviceTracker and attach): each test aims at a way a
version could reach the bucket with weights other than the trainer's, or be lost silently.
"""
import json
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import deltasync

BF16 = ml_dtypes.bfloat16
SHAPES = {"a.weight": (64, 32), "b.weight": (48,)}


def make_weights(seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0, 0.02, shape).astype(np.float32).astype(BF16) for name, shape in SHAPES.items()}


def u16(a):
    return np.ascontiguousarray(a).view(np.uint16).reshape(-1)


class _FailingNative:
    """The real native publisher; publish_changes of version `fail` waits for `gate`, then raises."""

    def __init__(self, native, fail):
        self._real = native
        self.fail = fail
        self.gate = threading.Event()
        self.started = threading.Event()

    def publish_changes(self, version, items):
        if version == self.fail:
            self.started.set()
            assert self.gate.wait(60)
            raise deltasync.StoreIOError(f"injected: version {version}'s upload failed")
        return self._real.publish_changes(version, items)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _replica_at(bucket, version):
    replica = deltasync.Replica(bucket)
    assert replica.update(version) == version
    return {n: u16(a).copy() for n, a in replica.tensors().items()}


def test_queued_changes_behind_a_failed_version_are_not_applied_to_an_older_state(bucket):
    """v2 and v3 queued as changes; v2 fails. v3's changes were computed against v2: applied to v1
    they would commit a v3 that is not the trainer's (silent: its hash is of that wrong state)."""
    w1 = make_weights(1)
    pub = deltasync.Publisher(bucket, max_pending=4)
    pub.publish(1, w1)
    failing = _FailingNative(pub._native, fail=2)
    pub._native = failing
    # version 2 changes a[0..9], version 3 changes b[0..4] (the trainer holds both at v3)
    c2 = {"a.weight": (np.arange(10), np.full(10, 0.5, dtype=BF16))}
    c3 = {"b.weight": (np.arange(5), np.full(5, -0.25, dtype=BF16))}
    f2 = pub.publish_changes(2, c2, background=True)
    assert failing.started.wait(30)
    f3 = pub.publish_changes(3, c3, background=True)
    failing.gate.set()
    with pytest.raises(deltasync.StoreIOError, match="injected"):
        f2.result(timeout=60)
    f3.exception(timeout=60)
    with pytest.raises(deltasync.StoreIOError, match="injected"):
        pub.flush()  # the first failure, once
    latest = pub.latest_version
    if latest == 3:  # committed: then it must be the trainer's v3 (v1 + c2 + c3)
        want = {n: u16(a).copy() for n, a in w1.items()}
        want["a.weight"][:10] = u16(np.full(10, 0.5, dtype=BF16))
        want["b.weight"][:5] = u16(np.full(5, -0.25, dtype=BF16))
        got = _replica_at(bucket, 3)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"version 3, {name}")
    assert latest == 1, "version 3's changes were applied without version 2's"
    with pytest.raises(deltasync.FailedPreconditionError, match="version 2"):
        f3.result()
    # A full publish queued behind a failure does not depend on it: it goes through.
    pub._native = failing._real
    f4 = pub.publish_changes(4, c3, background=True)
    assert f4.result(timeout=60).version == 4
    pub.close()


def test_a_queued_full_publish_behind_a_failed_version_still_commits(bucket):
    w1 = make_weights(2)
    w3 = make_weights(3)
    pub = deltasync.Publisher(bucket, max_pending=4)
    pub.publish(1, w1)
    failing = _FailingNative(pub._native, fail=2)
    pub._native = failing
    f2 = pub.publish_changes(2, {"a.weight": (np.arange(3), np.zeros(3, dtype=BF16))}, background=True)
    assert failing.started.wait(30)
    f3 = pub.publish(3, w3, background=True)
    failing.gate.set()
    assert isinstance(f2.exception(timeout=60), deltasync.StoreIOError)
    assert f3.result(timeout=60).version == 3
    with pytest.raises(deltasync.StoreIOError):
        pub.flush()
    pub.close()
    got = _replica_at(bucket, 3)
    for name, a in w3.items():
        np.testing.assert_array_equal(got[name], u16(a), err_msg=name)


def test_attach_sparse_background_failure_never_commits_a_state_that_is_not_the_trainers(bucket):
    """deltasync.torch.attach with the DeviceTracker (sparse=True, on CPU here), two steps queued, the
    first failing: every version in the bucket must hold the model's weights at that step."""
    torch = pytest.importorskip("torch")
    import deltasync.torch as dt

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    pub = deltasync.Publisher(bucket, max_pending=4)
    handle = dt.attach(model, opt, pub, sparse=True)  # background

    def step(i):
        g = torch.Generator().manual_seed(i)
        loss = model(torch.randn(16, 32, generator=g)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()  # the hook publishes handle.next_version
        return {n: p.detach().to(torch.bfloat16).view(torch.int16).numpy().reshape(-1).copy()
                for n, p in model.named_parameters()}

    at = {1: step(1)}
    handle.flush()
    failing = _FailingNative(pub._native, fail=2)
    pub._native = failing
    at[2] = step(2)  # version 2: held, then fails
    assert failing.started.wait(30)
    at[3] = step(3)  # version 3: its changes are relative to version 2
    failing.gate.set()
    while pub.pending:
        threading.Event().wait(0.01)
    with pytest.raises(deltasync.StoreIOError, match="injected"):
        step(4)  # raises the failure; publishes nothing
    pub._native = failing._real
    v = handle.next_version
    at[v] = step(5)  # resyncs from the bucket's state and publishes
    handle.flush()
    handle.remove()
    pub.close()
    manifest = json.loads((Path(bucket) / "manifest.json").read_text())
    committed = sorted(int(e["version"]) for e in manifest["versions"])
    assert committed[0] == 1 and committed[-1] == v
    for ver in committed:
        replica = deltasync.Replica(bucket)
        assert replica.update(ver) == ver
        got = {n: np.ascontiguousarray(a).view(np.int16).reshape(-1) for n, a in replica.tensors().items()}
        for name, want in at[ver].items():
            np.testing.assert_array_equal(got[name], want, err_msg=f"version {ver}, {name}")


def test_load_into_tied_targets_needs_equal_replica_tensors(bucket):
    """A model whose embedding and LM head are one tensor cannot hold two different replica
    tensors: load_into must refuse (before copying) instead of leaving the first one overwritten."""
    torch = pytest.importorskip("torch")
    import deltasync.torch as dt

    rng = np.random.default_rng(5)
    emb = rng.normal(size=(16, 8)).astype(np.float32)
    with deltasync.Publisher(bucket) as pub:
        pub.publish(1, {"embed.weight": emb, "head.weight": emb.copy()})  # tied on the trainer: equal
        head = emb.copy()
        head[3, :] += 1.0
        pub.publish(2, {"embed.weight": emb, "head.weight": head})  # untied on the trainer
    replica = deltasync.Replica(bucket)
    replica.update(1)
    shared = torch.zeros(16, 8, dtype=torch.bfloat16)
    tied = {"embed.weight": shared, "head.weight": shared}
    assert dt.load_into(replica, tied) > 0
    np.testing.assert_array_equal(shared.view(torch.int16).numpy(), dt.tensors(replica)["embed.weight"]
                                  .view(torch.int16).numpy())
    replica.update(2)
    before = shared.clone()
    with pytest.raises(deltasync.InvalidArgumentError, match="tied"):
        dt.load_into(replica, tied)
    assert torch.equal(shared.view(torch.int16), before.view(torch.int16))  # nothing copied
    # Separate targets take both.
    separate = {"embed.weight": torch.zeros(16, 8, dtype=torch.bfloat16),
                "head.weight": torch.zeros(16, 8, dtype=torch.bfloat16)}
    dt.load_into(replica, separate)
    for name, t in separate.items():
        np.testing.assert_array_equal(t.view(torch.int16).numpy(), dt.tensors(replica)[name].view(torch.int16).numpy())
