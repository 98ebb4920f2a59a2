"""deltasync.Replica routes around a missing object: a replica holding 4
whose delta 5 was deleted reaches 12 once anchor 10 and 11-12 exist (it used
to retry delta 5 forever), and lists the object in ``bad_objects``."""
import json
from pathlib import Path

import pytest

import deltasync
from test_publisher_replica import assert_replica_holds, manifest, nudged_history, object_keys


def test_a_held_replica_past_a_deleted_delta_reaches_the_next_anchor(bucket):
    history = nudged_history(seed=3, steps=11, fraction=0.05, salt=100)  # versions 1..12
    publisher = deltasync.Publisher(bucket, anchor_interval=10)  # anchors at 1 and 10
    for v in range(1, 5):
        publisher.publish(v, history[v - 1])
    replica = deltasync.Replica(bucket)
    assert replica.update() == 4
    assert replica.bad_objects == []

    publisher.publish(5, history[4])
    (delta5,) = [k for k in object_keys(bucket, 5) if "deltas/" in k]
    (Path(bucket) / delta5).unlink()
    with pytest.raises(deltasync.NotFoundError, match="no route to version 5"):
        replica.update()
    assert replica.version == 4
    assert [(b["key"], b["version"], b["kind"]) for b in replica.bad_objects] == [(delta5, 5, "not_found")]

    for v in range(6, 13):
        publisher.publish(v, history[v - 1])
    assert replica.update() == 12
    assert replica.last_update.anchors_applied == 1
    assert_replica_holds(replica, history[11])
    fresh = deltasync.Replica(bucket)
    assert fresh.update() == 12
    assert replica.state_hash == fresh.state_hash
    assert len(replica.bad_objects) == 1  # still listed by the manifest


def test_pull_routes_around_a_damaged_cumulative_delta(bucket, run, tmp_path):
    history = nudged_history(seed=4, steps=8, fraction=0.05, salt=200)  # versions 1..9
    publisher = deltasync.Publisher(bucket, anchor_interval=100, cumulative_interval=4)
    for v in range(1, 10):
        publisher.publish(v, history[v - 1])
    entry = next(e for e in manifest(bucket)["versions"] if e["version"] == 9)
    (cumulative,) = [o["key"] for o in entry["objects"] if o.get("base_version") == 1]
    # One byte flipped, in a copy renamed over the object (never in place).
    path = Path(bucket) / cumulative
    damaged = bytearray(path.read_bytes())
    damaged[len(damaged) // 2] ^= 0x01
    copy = tmp_path / "damaged"
    copy.write_bytes(bytes(damaged))
    copy.replace(path)

    out = tmp_path / "v9.safetensors"
    proc = run("pull", bucket, "-o", out, "--version", 9, "--json")
    result = json.loads(proc.stdout)
    assert result["version"] == 9
    assert [b["key"] for b in result["bad_objects"]] == [cumulative]
    fresh = deltasync.Replica(bucket)
    fresh.update(9)
    assert result["state_hash"] == fresh.state_hash
    assert_replica_holds(fresh, history[8])
    text = run("pull", bucket, "-o", tmp_path / "again.safetensors", "--version", 9)
    assert f"warning: routed around {cumulative} (version 9)" in text.stderr
