"""deltasync.Publisher and deltasync.Replica on numpy arrays (no torch).

Every round trip is checked bit for bit against an independent numpy
reference: fp32 -> bf16 round-to-nearest-even computed here on the bit
patterns, compared as uint16.
"""
import json
import threading
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import deltasync

BF16 = ml_dtypes.bfloat16
ENCODINGS = ["compact", "gap_delta", "raw"]
SHAPES = {"model.embed_tokens.weight": (96, 32), "model.layers.0.mlp.up_proj.weight": (64, 32),
          "model.norm.weight": (32,)}


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns, round to nearest even (NaN: quieted, sign kept); independent of deltasync."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint16 if a.dtype.itemsize == 2 else f"u{a.dtype.itemsize}")


def make_weights(seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0, 0.02, shape).astype(np.float32) for name, shape in SHAPES.items()}


def nudge(weights, fraction, seed):
    """Moves about `fraction` of the elements by a small fp32 step (like AdamW at a low lr)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, w in weights.items():
        mask = rng.random(w.shape) < fraction
        step = (np.abs(w) / 64 + 1e-5).astype(np.float32)
        out[name] = np.where(mask, w + np.sign(rng.random(w.shape) - 0.5).astype(np.float32) * step, w)
        out[name] = out[name].astype(np.float32)
    return out


def nudged_history(seed, steps, fraction, salt):
    """make_weights(seed), then `steps` successive nudges of it."""
    history = [make_weights(seed)]
    for i in range(steps):
        history.append(nudge(history[-1], fraction, salt + i))
    return history


def assert_replica_holds(replica, weights):
    views = replica.tensors()
    assert set(views) == set(weights)
    for name, w in weights.items():
        assert views[name].dtype == BF16, name
        assert views[name].shape == w.shape, name
        np.testing.assert_array_equal(bits(views[name]), bf16_bits(w), err_msg=name)


def manifest(bucket):
    return json.loads((Path(bucket) / "manifest.json").read_text())


def object_keys(bucket, version):
    for entry in manifest(bucket)["versions"]:
        if entry["version"] == version:
            return [obj["key"] for obj in entry["objects"]]
    raise KeyError(version)


# ---------------------------------------------------------------------------
# round trips


def test_reference_rounding_agrees_with_ml_dtypes():
    x = np.random.default_rng(5).normal(0, 1, 10000).astype(np.float32)
    x[:4] = [np.inf, -np.inf, 0.0, -0.0]
    # Halfway cases: ties go to even.
    x[4:8] = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x3F80C000], dtype=np.uint32).view(np.float32)
    np.testing.assert_array_equal(bf16_bits(x), x.astype(BF16).view(np.uint16))


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_round_trip_bit_exact_over_anchors_and_deltas(bucket, encoding):
    weights = make_weights(1)
    replica = None
    with deltasync.Publisher(bucket, anchor_interval=3, encoding=encoding) as pub:
        for version in range(1, 8):
            result = pub.publish(version, weights)
            assert isinstance(result, deltasync.PublishResult)
            assert result.version == version
            assert result.wrote_anchor == (version in (1, 3, 6))
            assert result.wrote_delta == (version > 1)
            assert result.total_elements == sum(w.size for w in weights.values())
            assert len(result.state_hash) == 32
            assert pub.latest_version == version
            if replica is None:
                replica = deltasync.Replica(bucket)
                assert replica.version == 0
            assert replica.update() == version
            assert replica.version == version
            assert replica.state_hash == result.state_hash
            assert_replica_holds(replica, weights)
            # The publisher's own snapshot is the same bf16 state.
            for name, a in pub.state_tensors().items():
                np.testing.assert_array_equal(bits(a), bf16_bits(weights[name]))
            weights = nudge(weights, 0.05, version)
    keys = object_keys(bucket, 4)
    if encoding == "compact":
        assert all(k.startswith("ds/") for k in keys), keys
    else:
        assert keys == ["deltas/step_000004.safetensors"]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_late_replica_catches_up_and_can_stop_at_a_version(bucket, encoding):
    history = [make_weights(2)]
    with deltasync.Publisher(bucket, anchor_interval=4, encoding=encoding) as pub:
        for version in range(1, 10):
            pub.publish(version, history[-1])
            history.append(nudge(history[-1], 0.02, 100 + version))
    replica = deltasync.Replica(bucket)
    assert replica.latest_available() == 9
    assert replica.update(6) == 6
    assert_replica_holds(replica, history[5])
    assert replica.update() == 9
    assert replica.last_update.from_version == 6 and replica.last_update.to_version == 9
    assert replica.last_update.deltas_applied >= 1
    assert_replica_holds(replica, history[8])


def test_update_reports_the_compact_applies_held_and_stale(bucket):
    """last_update's compact counts: a replica that follows keeps the class totals
    of the state it applied to, so every compact apply after its first one starts
    from them (held), none stale; a late replica's catch-up likewise; gap_delta
    has no compact applies. The weights stay bit-exact throughout."""
    big = {"model.layers.0.mlp.down_proj.weight": (512, 300)}  # 153,600 elements: 3 chunks of the walk
    history = [{**make_weights(3), **{n: np.random.default_rng(4).normal(0, 0.02, s).astype(np.float32)
                                       for n, s in big.items()}}]
    for i in range(6):
        history.append(nudge(history[-1], 0.03, 300 + i))

    def counts(replica):
        u = replica.last_update
        return (u.anchors_applied, u.deltas_applied, u.compact_applies, u.held_applies, u.stale_applies)

    with deltasync.Publisher(bucket, anchor_interval=100, encoding="compact") as pub:
        follower = deltasync.Replica(bucket)
        for version in range(1, 8):
            pub.publish(version, history[version - 1])
            assert follower.update() == version
            assert_replica_holds(follower, history[version - 1])
            # v1: the anchor (loaded, not walked); v2: the first compact apply fills the totals.
            want = (1, 0, 0, 0, 0) if version == 1 else (0, 1, 1, 0 if version == 2 else 1, 0)
            assert counts(follower) == want, version
    late = deltasync.Replica(bucket)
    assert late.update(3) == 3
    assert counts(late) == (1, 2, 2, 1, 0)
    assert late.update() == 7
    assert counts(late) == (0, 4, 4, 4, 0)
    assert_replica_holds(late, history[6])

    gap = str(Path(bucket).with_name("gap"))
    with deltasync.Publisher(gap, encoding="gap_delta") as pub:
        for version in range(1, 4):
            pub.publish(version, history[version - 1])
    replica = deltasync.Replica(gap)
    assert replica.update() == 3
    assert counts(replica) == (1, 2, 0, 0, 0)
    assert_replica_holds(replica, history[2])

    # Once its changes are taken (load_into, the vLLM engine) a replica records
    # the next ones: it decodes, then scatters; no in-place compact apply.
    taker = deltasync.Replica(bucket)
    assert taker.update(5) == 5
    taker._take_changes()
    assert taker.update(6) == 6
    assert counts(taker)[1:3] == (1, 0)
    assert_replica_holds(taker, history[5])


def test_follow_prints_one_line_per_version_with_the_compact_applies(bucket, run):
    """`deltasync follow` (docs/cli.md): one JSON line per version, the keys documented,
    its hashes the manifest's, the compact applies held after the first."""
    history = nudged_history(5, 3, 0.03, 500)
    with deltasync.Publisher(bucket, anchor_interval=100, encoding="compact") as pub:
        for version in range(1, 5):
            pub.publish(version, history[version - 1])
    lines = [json.loads(line) for line in run("follow", bucket, "--until", 4).stdout.splitlines()]
    hashes = {e["version"]: e["state_hash"] for e in manifest(bucket)["versions"]}
    assert [line["version"] for line in lines] == [1, 2, 3, 4]
    for line in lines:
        assert list(line) == ["anchors", "apply_ms", "bytes", "compact_applies", "deltas", "download_ms",
                              "full_hash", "held_applies", "stale_applies", "state_hash", "version"]
        assert line["state_hash"] == line["full_hash"] == hashes[line["version"]]
    assert [(x["anchors"], x["deltas"], x["compact_applies"], x["held_applies"], x["stale_applies"])
            for x in lines] == [(1, 0, 0, 0, 0), (0, 1, 1, 0, 0), (0, 1, 1, 1, 0), (0, 1, 1, 1, 0)]


def test_changed_elements_match_the_reference(bucket):
    w1 = make_weights(3)
    w2 = nudge(w1, 0.03, 7)
    with deltasync.Publisher(bucket) as pub:
        pub.publish(1, w1)
        r = pub.publish(2, w2)
    expected = sum(int((bf16_bits(w1[n]) != bf16_bits(w2[n])).sum()) for n in w1)
    assert r.changed_elements == expected > 0
    assert 0 < r.delta_bytes < r.full_bytes
    assert r.full_bytes == 2 * sum(w.size for w in w1.values())


def test_bf16_input_and_other_dtypes_carried_bitwise(bucket):
    rng = np.random.default_rng(4)
    tensors = {
        "bf16": rng.normal(0, 1, (16, 8)).astype(np.float32).astype(BF16),
        "f16": rng.normal(0, 1, (7,)).astype(np.float16),
        "i32": rng.integers(-1000, 1000, (3, 5)).astype(np.int32),
        "u8": rng.integers(0, 255, (9,)).astype(np.uint8),
        "flag": np.array([True, False, True]),
        "scalar": np.array(3.5, dtype=np.float64),
        "empty": np.zeros((0, 4), dtype=np.int16),
        "mlp.gate.e_score_correction_bias": rng.normal(0, 1, (4,)).astype(np.float32),  # stays F32
    }
    with deltasync.Publisher(bucket) as pub:
        pub.publish(1, tensors)
    replica = deltasync.Replica(bucket)
    replica.update()
    views = replica.tensors()
    assert views["bf16"].dtype == BF16
    np.testing.assert_array_equal(bits(views["bf16"]), bits(tensors["bf16"]))
    for name in ["f16", "i32", "u8", "flag", "scalar", "empty", "mlp.gate.e_score_correction_bias"]:
        assert views[name].dtype == tensors[name].dtype, name
        assert views[name].shape == tensors[name].shape, name
        np.testing.assert_array_equal(views[name], tensors[name], err_msg=name)


def test_pairs_and_reopened_publisher_continue_the_bucket(bucket):
    w1, w2 = make_weights(5), nudge(make_weights(5), 0.1, 1)
    with deltasync.Publisher(bucket) as pub:
        pub.publish(1, list(w1.items()))  # (name, array) pairs work like a mapping
    with deltasync.Publisher(bucket) as pub:  # rebuilt from the bucket
        assert pub.latest_version == 1
        for name, a in pub.state_tensors().items():
            np.testing.assert_array_equal(bits(a), bf16_bits(w1[name]))
        assert pub.publish(2, w2).wrote_delta
    replica = deltasync.Replica(bucket)
    assert replica.update() == 2
    assert_replica_holds(replica, w2)


# ---------------------------------------------------------------------------
# publish_changes and the replica's change record


def test_publish_changes_bit_exact(bucket):
    w1 = make_weights(6)
    name = "model.layers.0.mlp.up_proj.weight"
    with deltasync.Publisher(bucket) as pub:
        pub.publish(1, w1)
        replica = deltasync.Replica(bucket)
        replica.update()
        assert replica._take_changes() == (True, {})

        # bf16 values with int64 indices (what torch.nonzero gives).
        idx = np.array([0, 5, 100, 2047], dtype=np.int64)
        new_vals = np.array([0.5, -0.25, 1.0, 3.0], dtype=np.float32)
        r = pub.publish_changes(2, {name: (idx, new_vals.astype(BF16))})
        assert r.version == 2 and r.changed_elements == 4 and r.wrote_delta
        expected = {n: bf16_bits(w) for n, w in w1.items()}
        expected[name].reshape(-1)[idx] = bf16_bits(new_vals)
        assert replica.update() == 2

        # uint16 bits with uint64 indices, and float32 values (rounded to bf16).
        idx2 = np.array([1, 5], dtype=np.uint64)
        vals2 = np.array([0x3F80, 0xC000], dtype=np.uint16)
        idx3 = np.array([3], dtype=np.uint64)
        vals3 = np.array([0.1], dtype=np.float32)
        pub.publish_changes(3, {name: (idx2, vals2), "model.norm.weight": (idx3, vals3)})
        expected[name].reshape(-1)[idx2.astype(np.int64)] = vals2
        expected["model.norm.weight"][3] = bf16_bits(vals3)[0]
        assert replica.update() == 3

    views = replica.tensors()
    for n, e in expected.items():
        np.testing.assert_array_equal(bits(views[n]), e, err_msg=n)
    everything, changes = replica._take_changes()
    assert everything is False
    assert sorted(changes) == ["model.layers.0.mlp.up_proj.weight", "model.norm.weight"]
    np.testing.assert_array_equal(changes[name], np.array([0, 1, 5, 100, 2047], dtype=np.uint64))
    assert changes[name].dtype == np.uint64
    np.testing.assert_array_equal(changes["model.norm.weight"], [3])
    assert replica._take_changes() == (False, {})


def test_take_changes_after_dense_publishes_matches_reference(bucket):
    w1 = make_weights(7)
    w2 = nudge(w1, 0.05, 1)
    w3 = nudge(w2, 0.05, 2)
    with deltasync.Publisher(bucket, anchor_interval=100) as pub:
        pub.publish(1, w1)
        replica = deltasync.Replica(bucket)
        replica.update()
        replica._take_changes()
        pub.publish(2, w2)
        pub.publish(3, w3)
    replica.update()
    everything, changes = replica._take_changes()
    assert not everything
    for name in w1:
        ref = np.flatnonzero((bf16_bits(w1[name]) != bf16_bits(w2[name])) |
                             (bf16_bits(w2[name]) != bf16_bits(w3[name])))
        got = changes.get(name, np.array([], dtype=np.uint64))
        np.testing.assert_array_equal(got, ref.astype(np.uint64), err_msg=name)


def test_publish_changes_errors(bucket):
    name = "model.norm.weight"
    with deltasync.Publisher(bucket) as pub:
        with pytest.raises(deltasync.FailedPreconditionError):
            pub.publish_changes(1, {name: (np.array([0]), np.array([1.0], dtype=BF16))})
        pub.publish(1, make_weights(8))
        with pytest.raises(deltasync.InvalidArgumentError, match=name):
            pub.publish_changes(2, {name: (np.array([32]), np.array([1.0], dtype=BF16))})  # out of range
        with pytest.raises(deltasync.InvalidArgumentError, match=name):
            pub.publish_changes(2, {name: (np.array([3, 1]), np.array([1.0, 2.0], dtype=BF16))})  # not ascending
        with pytest.raises(deltasync.InvalidArgumentError, match=name):
            pub.publish_changes(2, {name: (np.array([1, 2]), np.array([1.0], dtype=BF16))})  # count mismatch
        with pytest.raises(deltasync.InvalidArgumentError, match="negative"):
            pub.publish_changes(2, {name: (np.array([-1]), np.array([1.0], dtype=BF16))})
        with pytest.raises(deltasync.InvalidArgumentError):
            pub.publish_changes(2, {"no.such.tensor": (np.array([0]), np.array([1.0], dtype=BF16))})
        assert pub.latest_version == 1
        assert pub.publish_changes(2, {name: (np.array([0]), np.array([1.0], dtype=BF16))}).version == 2


# ---------------------------------------------------------------------------
# background publishing


def test_background_publishes_complete_in_order(bucket):
    history = nudged_history(9, 5, 0.05, 200)
    with deltasync.Publisher(bucket, max_pending=2, anchor_interval=4) as pub:
        futures = [pub.publish(v, history[v - 1], background=True) for v in range(1, 7)]
        results = [f.result(timeout=60) for f in futures]
        assert [r.version for r in results] == list(range(1, 7))
        assert pub.latest_version == 6
        assert pub.pending == 0
    replica = deltasync.Replica(bucket)
    assert replica.update() == 6
    assert replica.state_hash == results[-1].state_hash
    assert_replica_holds(replica, history[5])


class _GatedNative:
    """The real native publisher, with publish() held until a gate opens (to observe the queue)."""

    def __init__(self, native):
        self._real = native
        self.gate = threading.Event()
        self.started = threading.Event()

    def publish(self, version, items):
        self.started.set()
        assert self.gate.wait(60)
        return self._real.publish(version, items)

    def publish_snapshot(self, version, snapshot):
        self.started.set()
        assert self.gate.wait(60)
        return self._real.publish_snapshot(version, snapshot)

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_publish_blocks_when_max_pending_versions_are_queued(bucket):
    weights = make_weights(10)
    pub = deltasync.Publisher(bucket, max_pending=2)
    gated = _GatedNative(pub._native)
    pub._native = gated
    f1 = pub.publish(1, weights, background=True)
    assert gated.started.wait(30)
    f2 = pub.publish(2, nudge(weights, 0.1, 1), background=True)
    assert pub.pending == 2
    third = {}

    def submit_third():
        third["future"] = pub.publish(3, nudge(weights, 0.1, 2), background=True)

    t = threading.Thread(target=submit_third)
    t.start()
    t.join(0.5)
    assert t.is_alive(), "publish() returned although max_pending versions were outstanding"
    assert not f1.done() and not f2.done() and "future" not in third
    gated.gate.set()
    t.join(30)
    assert not t.is_alive()
    assert [f.result(timeout=60).version for f in (f1, f2, third["future"])] == [1, 2, 3]
    pub.close()
    assert pub.latest_version == 3


def test_synchronous_publish_waits_behind_queued_ones(bucket):
    weights = make_weights(11)
    with deltasync.Publisher(bucket, max_pending=3) as pub:
        gated = _GatedNative(pub._native)
        pub._native = gated
        f1 = pub.publish(1, weights, background=True)
        threading.Timer(0.3, gated.gate.set).start()
        result = pub.publish(2, nudge(weights, 0.1, 3))  # queued behind version 1
        assert f1.done() and f1.result().version == 1
        assert result.version == 2


def test_publishing_from_a_future_callback_does_not_deadlock(bucket):
    weights = make_weights(26)
    pub = deltasync.Publisher(bucket, max_pending=1)
    chained = {}

    def next_version(future):
        version = future.result().version
        if version < 3:
            chained[version + 1] = pub.publish(version + 1, nudge(weights, 0.1, version), background=True)
            chained[version + 1].add_done_callback(next_version)
        else:
            with pytest.raises(deltasync.FailedPreconditionError, match="itself"):
                pub.flush()
            chained["sync"] = pub.publish(4, nudge(weights, 0.1, 4))  # runs inline on the worker

    pub.publish(1, weights, background=True).add_done_callback(next_version)
    deadline = time.monotonic() + 60
    while "sync" not in chained and time.monotonic() < deadline:
        time.sleep(0.01)
    pub.close()
    assert chained["sync"].version == 4
    assert [chained[v].result().version for v in (2, 3)] == [2, 3]
    assert pub.latest_version == 4


def test_background_failure_reaches_future_and_flush_once(bucket):
    weights = make_weights(12)
    pub = deltasync.Publisher(bucket)
    pub.publish(1, weights)
    bad = pub.publish(1, weights, background=True)  # not newer than the latest version
    with pytest.raises(deltasync.InvalidArgumentError, match="not newer"):
        bad.result(timeout=60)
    while pub.pending:
        time.sleep(0.01)
    # The next publish raises it before queueing anything, once.
    with pytest.raises(deltasync.InvalidArgumentError, match="not newer"):
        pub.publish(2, nudge(weights, 0.1, 4), background=True)
    good = pub.publish(2, nudge(weights, 0.1, 4), background=True)  # later versions still go through
    assert good.result(timeout=60).version == 2
    pub.flush()  # already reported
    # Without a publish after it, flush() reports it, once.
    pub.publish(2, weights, background=True).exception(timeout=60)
    with pytest.raises(deltasync.InvalidArgumentError, match="not newer"):
        pub.flush()
    pub.flush()
    pub.close()
    with pytest.raises(deltasync.FailedPreconditionError, match="closed"):
        pub.publish(3, weights)


def test_context_manager_flushes_on_exit(bucket):
    weights = make_weights(13)
    with deltasync.Publisher(bucket, max_pending=4) as pub:
        futures = [pub.publish(v, nudge(weights, 0.05, v), background=True) for v in (1, 2, 3)]
    assert all(f.done() for f in futures)
    assert deltasync.Replica(bucket).latest_available() == 3


def test_background_publish_is_unaffected_by_changes_after_it_returns(bucket):
    """The trainer's next step may change the arrays while the worker still publishes."""
    pub = deltasync.Publisher(bucket, max_pending=2)
    gated = _GatedNative(pub._native)
    pub._native = gated
    arrays = make_weights(27)
    expected = {n: bf16_bits(a) for n, a in arrays.items()}
    future = pub.publish(1, arrays, background=True)
    assert gated.started.wait(30)
    for a in arrays.values():  # an in-place optimizer step before the publish ran
        a *= 1.5
    gated.gate.set()
    assert future.result(timeout=60).version == 1
    pub.close()
    replica = deltasync.Replica(bucket)
    replica.update()
    for name, e in expected.items():
        np.testing.assert_array_equal(bits(replica.tensors()[name]), e, err_msg=name)


def test_background_keeps_arrays_alive(bucket):
    import gc
    import weakref

    with deltasync.Publisher(bucket) as pub:
        pub.publish(1, make_weights(14))
        arrays = nudge(make_weights(14), 0.1, 5)
        expected = {n: bf16_bits(a) for n, a in arrays.items()}
        ref = weakref.ref(arrays["model.norm.weight"])
        future = pub.publish(2, arrays, background=True)
        del arrays
        gc.collect()
        future.result(timeout=60)
    del future
    gc.collect()
    assert ref() is None  # released once the publish is over
    replica = deltasync.Replica(bucket)
    replica.update()
    for name, e in expected.items():
        np.testing.assert_array_equal(bits(replica.tensors()[name]), e)


# ---------------------------------------------------------------------------
# errors


@pytest.mark.parametrize("version", [0, -1, 2**53, 2**64, "3", 1.5, True, None])
def test_bad_version_is_invalid_argument(bucket, version):
    with deltasync.Publisher(bucket) as pub:
        with pytest.raises(deltasync.InvalidArgumentError, match="version"):
            pub.publish(version, make_weights(15))
        assert pub.latest_version == 0


def test_version_not_newer_is_invalid_argument_and_changes_nothing(bucket):
    w = make_weights(16)
    with deltasync.Publisher(bucket) as pub:
        first = pub.publish(5, w)
        with pytest.raises(deltasync.InvalidArgumentError, match="not newer") as info:
            pub.publish(5, nudge(w, 0.5, 1))
        assert info.value.code == "invalid argument"
        with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError
            pub.publish(4, w)
        assert pub.latest_version == 5
    replica = deltasync.Replica(bucket)
    replica.update()
    assert replica.state_hash == first.state_hash


def test_corrupt_object_is_integrity_error_and_replica_stays(bucket):
    history = nudged_history(17, 2, 0.1, 300)
    with deltasync.Publisher(bucket, anchor_interval=100) as pub:
        pub.publish(1, history[0])
        replica = deltasync.Replica(bucket)
        replica.update()
        view = replica.tensors()["model.embed_tokens.weight"]
        before = bits(view).copy()
        hash_before = replica.state_hash
        pub.publish(2, history[1])
        pub.publish(3, history[2])
    (key,) = object_keys(bucket, 2)
    path = Path(bucket) / key
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # same size, one bit flipped
    path.write_bytes(bytes(data))
    with pytest.raises(deltasync.IntegrityError, match="step_000002") as info:
        replica.update()
    assert info.value.code == "integrity"
    assert replica.version == 1
    assert replica.state_hash == hash_before
    np.testing.assert_array_equal(bits(view), before)
    assert_replica_holds(replica, history[0])


def test_truncated_object_is_an_error_and_replica_stays(bucket):
    with deltasync.Publisher(bucket, anchor_interval=100) as pub:
        pub.publish(1, make_weights(18))
        replica = deltasync.Replica(bucket)
        replica.update()
        pub.publish(2, nudge(make_weights(18), 0.2, 1))
    (key,) = object_keys(bucket, 2)
    path = Path(bucket) / key
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises((deltasync.CorruptionError, deltasync.IntegrityError)):
        replica.update()
    assert replica.version == 1


def test_missing_object_is_not_found(bucket):
    with deltasync.Publisher(bucket, anchor_interval=100) as pub:
        pub.publish(1, make_weights(19))
        pub.publish(2, nudge(make_weights(19), 0.2, 1))
    (key,) = object_keys(bucket, 1)
    (Path(bucket) / key).unlink()
    replica = deltasync.Replica(bucket)
    with pytest.raises(deltasync.NotFoundError):
        replica.update()
    assert replica.version == 0


def test_missing_bucket_is_not_found(tmp_path):
    with pytest.raises(deltasync.NotFoundError, match="no-such-bucket") as info:
        deltasync.Replica(str(tmp_path / "no-such-bucket"))
    assert isinstance(info.value, LookupError)


def test_empty_bucket_and_unknown_version(bucket):
    Path(bucket).mkdir()
    replica = deltasync.Replica(bucket)
    with pytest.raises(deltasync.NotFoundError):
        replica.update()
    with deltasync.Publisher(bucket) as pub:
        pub.publish(1, make_weights(20))
        pub.publish(2, nudge(make_weights(20), 0.1, 1))
    with pytest.raises((deltasync.NotFoundError, deltasync.InvalidArgumentError)):
        replica.update(7)
    assert replica.update(2) == 2
    with pytest.raises((deltasync.NotFoundError, deltasync.InvalidArgumentError)):
        replica.update(1)  # older than held
    assert replica.version == 2
    with pytest.raises(deltasync.InvalidArgumentError):
        replica.update(0)


def test_non_contiguous_arrays_are_refused_by_name(bucket):
    w = make_weights(21)
    with deltasync.Publisher(bucket) as pub:
        bad = dict(w)
        bad["model.layers.0.mlp.up_proj.weight"] = np.asfortranarray(w["model.layers.0.mlp.up_proj.weight"])
        with pytest.raises(deltasync.InvalidArgumentError, match="up_proj.weight' is not contiguous"):
            pub.publish(1, bad)
        strided = dict(w)
        strided["model.norm.weight"] = np.repeat(w["model.norm.weight"], 2)[::2]
        with pytest.raises(deltasync.InvalidArgumentError, match="norm.weight' is not contiguous"):
            pub.publish(1, strided)
        bf16_strided = dict(w)
        bf16_strided["model.embed_tokens.weight"] = w["model.embed_tokens.weight"].astype(BF16)[:, ::2]
        with pytest.raises(deltasync.InvalidArgumentError, match="embed_tokens.weight' is not contiguous"):
            pub.publish(1, bf16_strided)
        assert pub.latest_version == 0
        # Contiguous slices and size-1 dimensions are fine.
        ok = dict(w)
        ok["model.embed_tokens.weight"] = np.concatenate([w["model.embed_tokens.weight"]] * 2)[:96]
        ok["model.norm.weight"] = w["model.norm.weight"][None, :][0]
        assert pub.publish(1, ok).version == 1


def test_bad_inputs_are_invalid_argument(bucket):
    w = make_weights(22)
    with deltasync.Publisher(bucket) as pub:
        with pytest.raises(deltasync.InvalidArgumentError, match="norm.weight"):
            pub.publish(1, {**w, "model.norm.weight": [1.0, 2.0]})  # a list is not an array
        with pytest.raises(deltasync.InvalidArgumentError, match="byte order"):
            pub.publish(1, {**w, "model.norm.weight": w["model.norm.weight"].astype(">f4")})
        with pytest.raises(deltasync.InvalidArgumentError, match="c64"):
            pub.publish(1, {**w, "c64": np.zeros(3, dtype=np.complex64)})
        with pytest.raises(deltasync.InvalidArgumentError, match="twice"):
            pub.publish(1, [("a", w["model.norm.weight"]), ("a", w["model.norm.weight"])])
        nan = {**w, "model.norm.weight": np.full(32, np.nan, dtype=np.float32)}
        with pytest.raises(deltasync.InvalidArgumentError, match="norm.weight"):
            pub.publish(1, nan)
        pub.publish(1, w)
        with pytest.raises(deltasync.InvalidArgumentError, match="norm.weight"):
            pub.publish(2, {**w, "model.norm.weight": np.zeros(33, dtype=np.float32)})  # shape changed
        with pytest.raises(deltasync.InvalidArgumentError):
            pub.publish(2, {k: v for k, v in w.items() if k != "model.norm.weight"})  # tensor missing
        assert pub.latest_version == 1
    with pytest.raises(deltasync.InvalidArgumentError, match="encoding"):
        deltasync.Publisher(bucket, encoding="zip")
    with pytest.raises(deltasync.InvalidArgumentError, match="max_pending"):
        deltasync.Publisher(bucket, max_pending=0)


def test_allow_nonfinite(bucket):
    w = {"w": np.array([np.nan, np.inf, -np.inf, 1.0], dtype=np.float32)}
    with deltasync.Publisher(bucket, allow_nonfinite=True) as pub:
        pub.publish(1, w)
    replica = deltasync.Replica(bucket)
    replica.update()
    np.testing.assert_array_equal(bits(replica.tensors()["w"]), bf16_bits(w["w"]))


# ---------------------------------------------------------------------------
# views


def test_views_are_read_only_zero_copy_and_keep_their_address(bucket):
    history = nudged_history(23, 6, 0.1, 400)
    with deltasync.Publisher(bucket, anchor_interval=3) as pub:
        pub.publish(1, history[0])
        replica = deltasync.Replica(bucket)
        replica.update()
        views = replica.tensors()
        addresses = {n: a.__array_interface__["data"][0] for n, a in views.items()}
        for name, a in views.items():
            assert not a.flags.writeable, name
            with pytest.raises(ValueError):
                a[...] = 0
            assert a.flags.c_contiguous
            # Two calls share memory: no copies.
            assert np.shares_memory(a, replica.tensors()[name])
        for version in range(2, 7):  # versions 3 and 6 are anchors
            pub.publish(version, history[version - 1])
            replica.update()
            now = replica.tensors()
            assert {n: a.__array_interface__["data"][0] for n, a in now.items()} == addresses, version
            # The old views show the new contents.
            for name, a in views.items():
                np.testing.assert_array_equal(bits(a), bf16_bits(history[version - 1][name]))
        state = pub.state_tensors()
        for name, a in state.items():
            assert not a.flags.writeable
            np.testing.assert_array_equal(bits(a), bits(views[name]))


@pytest.mark.parametrize("encoding", ["raw", "compact"])
def test_views_keep_their_address_when_the_replica_loads_an_anchor(bucket, encoding):
    # Every element changes every version, so deltas cost more than an anchor
    # and catching up from version 1 to 4 goes through the anchor of version 3.
    history = [make_weights(27)]
    for i in range(3):
        history.append({n: (w * np.float32(1.5) + np.float32(0.01)).astype(np.float32)
                        for n, w in history[-1].items()})
    with deltasync.Publisher(bucket, anchor_interval=3, encoding=encoding) as pub:
        pub.publish(1, history[0])
        replica = deltasync.Replica(bucket)
        replica.update()
        assert replica._take_changes()[0]  # the first call: everything
        views = replica.tensors()
        addresses = {n: a.__array_interface__["data"][0] for n, a in views.items()}
        for version in (2, 3, 4):
            pub.publish(version, history[version - 1])
    assert replica.update() == 4
    assert replica.last_update.anchors_applied == 1, replica.last_update
    assert {n: a.__array_interface__["data"][0] for n, a in replica.tensors().items()} == addresses
    for name, a in views.items():
        np.testing.assert_array_equal(bits(a), bf16_bits(history[3][name]), err_msg=name)
    everything, _ = replica._take_changes()
    assert everything  # an anchor was loaded: treat every element as changed


def test_verify_catches_a_write_behind_the_replica_and_update_repairs_it(bucket):
    import ctypes

    weights = make_weights(28)
    with deltasync.Publisher(bucket, anchor_interval=2) as pub:
        pub.publish(1, weights)
        pub.publish(2, nudge(weights, 0.1, 29))
    replica = deltasync.Replica(bucket)
    with pytest.raises(deltasync.FailedPreconditionError):
        replica.verify()  # nothing held yet
    assert replica.update() == 2
    replica.verify()
    view = replica.tensors()["model.norm.weight"]
    address = view.__array_interface__["data"][0]
    expected = bits(view).copy()
    # A stray write, as through a torch view (numpy views refuse writes).
    ctypes.memset(address, 0x7F, 2)
    with pytest.raises(deltasync.IntegrityError, match="version 2"):
        replica.verify()
    assert replica.version == 0
    assert replica.update() == 2  # reloaded from the anchor, into the same memory
    replica.verify()
    np.testing.assert_array_equal(bits(view), expected)


def test_views_keep_the_replica_alive(bucket):
    import gc

    w = make_weights(24)
    with deltasync.Publisher(bucket) as pub:
        pub.publish(1, w)
    replica = deltasync.Replica(bucket)
    replica.update()
    view = replica.tensors()["model.embed_tokens.weight"]
    del replica
    gc.collect()
    np.testing.assert_array_equal(bits(view), bf16_bits(w["model.embed_tokens.weight"]))


def test_update_releases_the_gil(bucket):
    """A thread spinning in Python keeps running while another thread is inside update()."""
    rng = np.random.default_rng(25)
    big = {"w": rng.normal(0, 0.02, (4096, 4096)).astype(np.float32)}
    with deltasync.Publisher(bucket) as pub:
        pub.publish(1, big)
    del big
    replica = deltasync.Replica(bucket, threads=1)
    ticks = []
    done = threading.Event()

    def spin():
        while not done.is_set():
            ticks.append(time.perf_counter())

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.05)
    start = time.perf_counter()
    replica.update()
    end = time.perf_counter()
    done.set()
    t.join()
    native_s = (replica.last_update.download_ms + replica.last_update.apply_ms) / 1000
    assert native_s > 0.01, f"update() took only {native_s * 1000:.1f} ms in C++: too short to tell"
    # Holding the GIL, update() would stop the spinner for the whole C++
    # part: one gap at least that long between ticks. Released, the spinner
    # keeps ticking (gaps are scheduling noise).
    inside = [start] + [x for x in ticks if start < x < end] + [end]
    largest_gap = max(b - a for a, b in zip(inside, inside[1:]))
    assert largest_gap < native_s / 2, (largest_gap, native_s)
