"""`deltasync log` and `verify` on a parted bucket (docs/format.md, "Parts"),
published by two part publishers and a committer in one process."""
import json

import numpy as np

from deltasync import _native


def publish_parted(bucket):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((7, 4)).astype(np.float32)
    tensors = [("w", "BF16", [7, 4])]
    parts = [[(0, [0, 0], [4, 4])], [(0, [4, 0], [3, 4])]]
    pubs = [_native.PartPublisher(bucket, tensors, parts, p, 2, 1, False, False, False) for p in range(2)]
    committer = _native.PartCommitter(bucket, tensors, parts, 2, False, False)
    for version in (1, 2, 3):
        weight[version % 7] += 1.0
        receipts = [pubs[0].publish(version, [("w", weight[:4], "")]),
                    pubs[1].publish(version, [("w", weight[4:], "")])]
        committer.commit(version, receipts)
        for p in pubs:
            p.finish(True)


def test_log_shows_parts(bucket, run):
    publish_parted(bucket)
    log = json.loads(run("log", bucket, "--json").stdout)
    v3 = log["versions"][2]  # anchors at 1 and 2 (every 2), a delta only at 3
    assert v3["parts"] == 2
    (delta,) = v3["objects"]
    assert delta["key"] is None
    assert [p["key"] for p in delta["parts"]] == [
        "ds/parts/step_000003.delta_from_000002.part_00000_of_00002.safetensors",
        "ds/parts/step_000003.delta_from_000002.part_00001_of_00002.safetensors"]
    assert delta["size_bytes"] == sum(p["size_bytes"] for p in delta["parts"])
    assert "in 2 parts" in run("log", bucket).stdout
    assert run("verify", bucket, "--all").returncode == 0
