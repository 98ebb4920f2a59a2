"""Sharded trainers (docs/format.md, "Parts"): every rank of a gloo job on CPU
publishes its own part; a single-process Replica follows and, at every
version, holds the trainer's full parameters (gathered with full_tensor() in
the worker, for the test only) cast to bf16, bit for bit, with the state hash
a single-process Publisher computes for the same full state.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import deltasync  # noqa: E402

WORKER = Path(__file__).with_name("sharded_worker.py")


def run_job(scenario, world, bucket, out, **env):
    out.mkdir(parents=True, exist_ok=True)
    init = out / f"init-{scenario}-{world}"
    if init.exists():
        init.unlink()
    environ = dict(os.environ, OMP_NUM_THREADS="1", **{k: str(v) for k, v in env.items()})
    procs = [subprocess.Popen([sys.executable, str(WORKER), scenario, str(r), str(world), str(init), bucket, str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ)
             for r in range(world)]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{log}"
    return logs[0]


def bf16_bits(t):
    return t.to(torch.bfloat16).view(torch.int16).numpy()


def follow_and_compare(bucket, out, versions, tmp_path):
    """A Replica follows version by version; each equals the saved full params."""
    replica = deltasync.Replica(bucket)
    reference = deltasync.Publisher(str(tmp_path / f"single-{versions[0]}"), anchor_interval=4)
    for v in versions:
        full = torch.load(out / f"v{v}.pt")
        assert replica.update(v) == v
        held = replica.tensors()
        assert sorted(held) == sorted(full)
        for name, t in full.items():
            np.testing.assert_array_equal(held[name].view(np.int16), bf16_bits(t), err_msg=f"{name} at version {v}")
        result = reference.publish(v, {n: t.numpy() for n, t in full.items()})
        assert replica.state_hash == result.state_hash, f"version {v}"


def manifest(bucket):
    return json.loads((Path(bucket) / "manifest.json").read_text())


def test_fsdp2_two_ranks_with_a_failed_part_then_four_ranks_hsdp(tmp_path):
    bucket = str(tmp_path / "bucket")
    out2 = tmp_path / "two"
    # The plain deltasync.Publisher, as a single-process trainer passes it, on every rank.
    log = run_job("fsdp", 2, bucket, out2, STEPS=11, FAIL_AT=3, FAIL_RANK=1, PUBLISHER="plain")
    # Step 3's version failed on rank 1: nothing committed, and the next step commits it.
    assert (out2 / "failed.txt").read_text().split() == ["3"]
    assert "injected failure of part 1" in log
    m = manifest(bucket)
    assert m["format_version"] == 2
    assert [v["version"] for v in m["versions"]] == list(range(1, 11))
    assert all(len(o["parts"]) == 2 for v in m["versions"] for o in v["objects"])
    assert [v["version"] for v in m["versions"] if any(o["kind"] == "anchor" for o in v["objects"])] == [1, 4, 8]
    follow_and_compare(bucket, out2, list(range(1, 11)), tmp_path)

    # Restart on 4 ranks (FSDP2 over 4): each rank rebuilds its own blocks
    # from the bucket, and the next version is a delta in the new layout.
    out4 = tmp_path / "four"
    out4.mkdir()
    torch.save(torch.load(out2 / "end.pt"), out4 / "start.pt")
    run_job("fsdp", 4, bucket, out4, STEPS=2, PUBLISHER="plain")
    m = manifest(bucket)
    assert [v["version"] for v in m["versions"]][-2:] == [11, 12]
    eleven = m["versions"][-2]
    assert [o["kind"] for o in eleven["objects"]] == ["delta"]
    assert len(eleven["parts"]) == 4
    assert len(m["layouts"]) == 2
    follow_and_compare(bucket, out4, [11, 12], tmp_path)

    # Then a 2x2 HSDP mesh: only the replica group at coordinate 0 publishes.
    outh = tmp_path / "hsdp"
    outh.mkdir()
    torch.save(torch.load(out4 / "end.pt"), outh / "start.pt")
    run_job("hsdp", 4, bucket, outh, STEPS=2)
    m = manifest(bucket)
    assert [v["version"] for v in m["versions"]][-2:] == [13, 14]
    assert len(m["versions"][-1]["parts"]) == 2
    follow_and_compare(bucket, outh, [13, 14], tmp_path)


def test_shard1_params_four_ranks(tmp_path):
    bucket = str(tmp_path / "bucket")
    out = tmp_path / "out"
    run_job("shard1", 4, bucket, out, STEPS=5)
    m = manifest(bucket)
    assert [v["version"] for v in m["versions"]] == [1, 2, 3, 4, 5]
    assert len(m["versions"][0]["parts"]) == 4
    follow_and_compare(bucket, out, [1, 2, 3, 4, 5], tmp_path)


def test_fsdp2_with_tensor_parallel_four_ranks(tmp_path):
    # A 2x2 (dp, tp) mesh: strided column-parallel shards, row-parallel
    # Shard(1) blocks, and parameters replicated across tp published once.
    bucket = str(tmp_path / "bucket")
    out = tmp_path / "out"
    run_job("fsdp_tp", 4, bucket, out, STEPS=5, PUBLISHER="plain")
    m = manifest(bucket)
    assert [v["version"] for v in m["versions"]] == [1, 2, 3, 4, 5]
    assert len(m["versions"][0]["parts"]) == 4
    follow_and_compare(bucket, out, [1, 2, 3, 4, 5], tmp_path)
    # An uneven FSDP2+TP split (37 rows over 2 x 2) is not a block torch describes reliably: refused.
    uneven = tmp_path / "uneven"
    run_job("fsdp_tp_uneven", 4, str(tmp_path / "bucket-uneven"), uneven)
    for r in range(4):
        text = (uneven / f"refused-{r}.txt").read_text()
        assert "parameter 'head.weight' (shape (37, 16)) is split 4 ways along dim 0" in text, text


def test_parameters_not_on_every_rank_and_unsupported_settings_are_refused_at_attach(tmp_path):
    out = tmp_path / "out"
    run_job("pipeline", 2, str(tmp_path / "bucket"), out)
    for rank in (0, 1):
        message = (out / f"refused-{rank}.txt").read_text()
        assert "parameter 'extra.bias' is on rank 1 but not on rank 0" in message
        assert "pipeline stages" in message
        refused = (out / f"setting-refused-{rank}.txt").read_text()
        assert "parts do not support Publisher(cumulative_interval=3)" in refused
    assert not (tmp_path / "bucket" / "manifest.json").exists()


def test_a_bucket_one_rank_cannot_open_fails_attach_on_every_rank_at_once(tmp_path):
    # Rank 1 alone cannot open its bucket: rank 0 must not wait for it in the
    # next collective (gloo's timeout is 30 minutes); both raise at attach.
    out = tmp_path / "out"
    started = time.monotonic()
    run_job("badbucket", 2, str(tmp_path / "bucket"), out)
    assert time.monotonic() - started < 200
    assert "is not a bucket URL" in (out / "refused-1.txt").read_text()
    assert "attach failed on rank 1: InvalidArgumentError" in (out / "refused-0.txt").read_text()
    assert "is not a bucket URL" in (out / "refused-0.txt").read_text()


def test_a_sigkilled_rank_commits_nothing_and_the_restarted_job_continues(tmp_path):
    bucket = str(tmp_path / "bucket")
    out = tmp_path / "first"
    out.mkdir()
    init = out / "init"
    environ = dict(os.environ, OMP_NUM_THREADS="1", STEPS="6", FAIL_AT="4", FAIL_RANK="1", FAIL_MODE="kill")
    procs = [subprocess.Popen([sys.executable, str(WORKER), "fsdp", str(r), "2", str(init), bucket, str(out)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environ) for r in range(2)]
    # Rank 1 dies mid-publish; the job is then ended as a launcher would (every rank).
    assert procs[1].wait(timeout=240) == -signal.SIGKILL
    time.sleep(1)
    procs[0].kill()
    procs[0].wait(timeout=60)
    assert [v["version"] for v in manifest(bucket)["versions"]] == [1, 2, 3]
    # The restarted job continues from the last committed weights with a delta.
    restart = tmp_path / "restart"
    restart.mkdir()
    torch.save(torch.load(out / "v3.pt"), restart / "start.pt")
    run_job("fsdp", 2, bucket, restart, STEPS=2)
    m = manifest(bucket)
    assert [v["version"] for v in m["versions"]] == [1, 2, 3, 4, 5]
    assert [o["kind"] for o in m["versions"][3]["objects"]] == ["delta", "anchor"]  # 4: the cadence's anchor
    follow_and_compare(bucket, restart, [4, 5], tmp_path)


def test_a_plain_publisher_on_a_one_rank_fsdp2_job_is_refused_naming_the_parameter(tmp_path):
    # World size 1 keeps the single-process path, which cannot read DTensors:
    # a clear refusal (it used to crash reading the DTensor's storage).
    out = tmp_path / "out"
    run_job("fsdp", 1, str(tmp_path / "bucket"), out, PUBLISHER="plain")
    message = (out / "refused-0.txt").read_text()
    assert "is sharded (a DTensor, e.g. FSDP2)" in message and "ShardedPublisher" in message
