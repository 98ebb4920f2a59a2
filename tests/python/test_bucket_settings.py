"""Stored bucket settings, version cap and jumps, from Python and the CLI."""
import json

import numpy as np
import pytest
from safetensors.numpy import save_file

import deltasync


def weights(seed):
    rng = np.random.default_rng(seed)
    return {"w": (rng.standard_normal((64, 32)) * 0.02).astype(np.float32),
            "b": (rng.standard_normal(32) * 0.02).astype(np.float32)}


def manifest(bucket):
    with open(f"{bucket}/manifest.json") as f:
        return json.load(f)


def test_settings_are_stored_and_used_by_a_later_publisher(bucket):
    with deltasync.Publisher(bucket, encoding="gap_delta", anchor_interval=3) as pub:
        pub.publish(1, weights(1))
    assert manifest(bucket)["settings"] == {"encoding": "gap_delta", "anchor_interval": 3,
                                            "cumulative_interval": 0, "anchor_max_fraction": 0.0}
    with deltasync.Publisher(bucket) as pub:  # repeats nothing
        assert pub.settings["encoding"] == "gap_delta" and pub.settings["anchor_interval"] == 3
        pub.publish(2, weights(2))
    assert manifest(bucket)["versions"][-1]["objects"][0]["key"] == "deltas/step_000002.safetensors"

    with pytest.raises(deltasync.FailedPreconditionError, match="uses encoding gap_delta, not compact.*"
                       r"change_settings=True"):
        deltasync.Publisher(bucket, encoding="compact")
    with pytest.raises(deltasync.FailedPreconditionError, match="uses anchor_interval 3, not 5"):
        deltasync.Publisher(bucket, anchor_interval=5)

    with deltasync.Publisher(bucket, encoding="compact", change_settings=True) as pub:
        assert pub.changed_settings == ["encoding gap_delta -> compact"]
        pub.publish(3, weights(3))
    assert manifest(bucket)["settings"]["encoding"] == "compact"
    replica = deltasync.Replica(bucket)
    assert replica.update() == 3


def test_version_cap_and_jump(bucket):
    with deltasync.Publisher(bucket) as pub:
        with pytest.raises(deltasync.InvalidArgumentError, match=r"above 2\*\*53-1"):
            pub.publish(2**53, weights(1))
        pub.publish(1, weights(1))
        with pytest.raises(deltasync.InvalidArgumentError, match="1000001 past the newest version 1.*"
                           r"allow_version_jump=True"):
            pub.publish(1_000_002, weights(2))
        assert pub.latest_version == 1
        pub.publish(1_000_001, weights(2))
    with deltasync.Publisher(bucket, allow_version_jump=True) as pub:
        pub.publish(2**53 - 1, weights(3))
        assert pub.latest_version == 2**53 - 1


def test_cli_change_settings_and_version_jump(tmp_path, run, bucket):
    ckpt = tmp_path / "w.safetensors"
    save_file(weights(1), str(ckpt))
    run("publish", bucket, ckpt, "--version", 1, "--encoding", "gap_delta")
    save_file(weights(2), str(ckpt))
    refused = run("publish", bucket, ckpt, "--version", 2, "--encoding", "raw", check=False)
    assert refused.returncode == 1
    assert "uses encoding gap_delta, not raw" in refused.stderr and "--change-settings" in refused.stderr
    run("publish", bucket, ckpt, "--version", 2)  # the bucket's encoding
    assert manifest(bucket)["versions"][-1]["objects"][0]["encoding"] == "gap_delta"

    save_file(weights(3), str(ckpt))
    changed = run("publish", bucket, ckpt, "--version", 3, "--encoding", "raw", "--change-settings")
    lines = [l for l in changed.stderr.splitlines() if "changed the settings" in l]
    assert lines == [f"deltasync: changed the settings of file://{bucket} from version 3 on: "
                     "encoding gap_delta -> raw"], changed.stderr
    assert manifest(bucket)["settings"]["encoding"] == "raw"

    save_file(weights(4), str(ckpt))
    jump = run("publish", bucket, ckpt, "--version", 2_000_000, check=False)
    assert jump.returncode == 1 and "--allow-version-jump" in jump.stderr
    run("publish", bucket, ckpt, "--version", 2_000_000, "--allow-version-jump")
    cap = run("publish", bucket, ckpt, "--version", 18446744073709551615, "--allow-version-jump", check=False)
    assert cap.returncode == 1 and "above 2^53-1" in cap.stderr
