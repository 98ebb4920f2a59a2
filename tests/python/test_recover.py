"""A publisher always moves forward when given the complete weights (issue 10,
reproduction 2): with the newest version's step delta deleted or damaged, the
stateless `deltasync publish`, a reopened `deltasync.Publisher` and a
restarted `deltasync.torch.attach` trainer commit the next version as a
recovered, anchor-only version instead of failing forever. Damage is made as
the bucket contract allows: a damaged copy renamed over the object."""
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import deltasync
from test_cli_compact import to_bf16_bits
from test_publisher_replica import assert_replica_holds, nudged_history
from test_safetensors_interop import make_weights, nudge

STEP12 = "ds/deltas/step_000012.safetensors"


def damage(bucket, key, how, tmp_path):
    path = Path(bucket) / key
    if how == "delete":
        path.unlink()
        return
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    copy = tmp_path / "damaged"
    copy.write_bytes(bytes(data))
    copy.replace(path)


@pytest.mark.parametrize("version,how", [(13, "delete"), (20, "flip")])
def test_cli_publish_moves_past_a_damaged_newest_delta(tmp_path, run, version, how):
    bucket = tmp_path / "bucket"
    weights = make_weights(40)
    for v in range(1, 13):
        if v > 1:
            weights = nudge(weights, 0.03, v)
        save_file(weights, tmp_path / "ckpt.safetensors")
        run("publish", bucket, tmp_path / "ckpt.safetensors", "--version", v, "--quiet")
    damage(bucket, STEP12, how, tmp_path)

    weights = nudge(weights, 0.03, 100)
    save_file(weights, tmp_path / "ckpt.safetensors")
    proc = run("publish", bucket, tmp_path / "ckpt.safetensors", "--version", version, "--json")
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, proc.stderr
    assert "version 12 of" in warnings[0] and STEP12 in warnings[0] and "anchor-only" in warnings[0]
    out = json.loads(proc.stdout)
    assert out["version"] == version
    assert out["recovered"] is True and out["changed_elements"] is None
    assert out["wrote_anchor"] and not out["wrote_delta"] and out["cumulative_bytes"] == 0
    expected = {version: {k: to_bf16_bits(w) for k, w in weights.items()}}

    # The next publish is an ordinary one, with no warning.
    weights = nudge(weights, 0.03, 101)
    save_file(weights, tmp_path / "ckpt.safetensors")
    proc = run("publish", bucket, tmp_path / "ckpt.safetensors", "--version", version + 1, "--json")
    assert "warning" not in proc.stderr
    out = json.loads(proc.stdout)
    assert out["recovered"] is False and out["wrote_delta"] and out["changed_elements"] > 0
    expected[version + 1] = {k: to_bf16_bits(w) for k, w in weights.items()}

    for v, bits in expected.items():
        pulled = tmp_path / f"pulled{v}.safetensors"
        run("pull", bucket, "-o", pulled, "--version", v, "--quiet")
        got = load_file(pulled)
        for name in bits:
            np.testing.assert_array_equal(got[name].view(np.uint16), bits[name], err_msg=f"v{v} {name}")

    log = {v["version"]: v for v in json.loads(run("log", bucket, "--json").stdout)["versions"]}
    assert log[version]["recovered"] is True
    assert log[version]["changed_elements"] is None and log[version]["changed_fraction"] is None
    assert [o["role"] for o in log[version]["objects"]] == ["anchor"]
    assert log[version + 1]["recovered"] is False and log[version + 1]["changed_elements"] > 0
    assert "(recovered: no base)" in run("log", bucket).stdout
    entry = next(e for e in json.loads((bucket / "manifest.json").read_text())["versions"] if e["version"] == version)
    assert entry["recovered"] is True and entry["changed_elements"] == entry["total_elements"]

    report = run("verify", bucket, "--all", "--json", check=False)
    assert report.returncode == 1  # the damaged delta is still listed, and said so
    report = json.loads(report.stdout)
    assert report["recovered"] == [version]
    assert [p["key"] for p in report["bad_objects"]] == [STEP12]
    assert report["unreachable"] == [12] and report["verified"][-2:] == [version, version + 1]


def test_a_reopened_publisher_recovers_with_full_weights(bucket, tmp_path):
    history = nudged_history(seed=8, steps=13, fraction=0.05, salt=300)  # versions 1..14
    first = deltasync.Publisher(bucket, cumulative_interval=4)
    for v in range(1, 13):
        first.publish(v, history[v - 1])
    first.close()
    damage(bucket, STEP12, "delete", tmp_path)

    with pytest.warns(RuntimeWarning, match="step_000012.safetensors"):
        publisher = deltasync.Publisher(bucket)
    assert STEP12 in publisher.degraded and "anchor-only" in publisher.degraded
    assert publisher.latest_version == 12
    name = next(iter(history[12]))
    with pytest.raises(deltasync.FailedPreconditionError, match="Publish the full weights once"):
        publisher.publish_changes(13, {name: (np.array([0], np.uint64), np.array([1.0], np.float32))})

    result = publisher.publish(13, history[12])
    assert result.recovered and result.changed_elements is None
    assert result.wrote_anchor and not result.wrote_delta
    assert publisher.degraded is None
    changed = {}
    for tensor, w in history[13].items():
        idx = np.flatnonzero(to_bf16_bits(w) != to_bf16_bits(history[12][tensor])).astype(np.uint64)
        if idx.size:
            changed[tensor] = (idx, w.reshape(-1)[idx])
    result = publisher.publish_changes(14, changed)
    assert not result.recovered and result.wrote_delta and result.changed_elements > 0
    publisher.close()

    replica = deltasync.Replica(bucket)
    assert replica.update(13) == 13
    assert_replica_holds(replica, history[12])
    assert replica.update() == 14
    assert_replica_holds(replica, history[13])


def test_a_restarted_torch_attach_trainer_moves_forward(tmp_path):
    torch = pytest.importorskip("torch")
    import deltasync.torch as dt
    from test_torch_attach import assert_same, expected_bits, make, replica_bits, train_step

    bucket = str(tmp_path / "b")
    model, opt = make(9)
    first = deltasync.Publisher(bucket)
    handle = dt.attach(model, opt, first, background=False, sparse=True)
    for step in range(12):
        train_step(model, opt, step)
    handle.remove()
    first.close()
    assert first.latest_version == 12
    damage(bucket, STEP12, "flip", tmp_path)

    with pytest.warns(RuntimeWarning, match="anchor-only"):
        publisher = deltasync.Publisher(bucket)
    handle = dt.attach(model, opt, publisher, sparse=True)
    assert handle.next_version == 13
    for step in (12, 13):
        train_step(model, opt, step)
    handle.flush()
    assert handle.last_result.result().version == 14 and not handle.last_result.result().recovered
    handle.remove()
    publisher.close()
    replica = deltasync.Replica(bucket)
    assert replica.update() == 14
    assert_same(replica_bits(replica), expected_bits(model))
    del torch
