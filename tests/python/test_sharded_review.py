"""Adversarial review of the sharded trainer's Python side (session 48, H2).

attach() with a ShardedPublisher publishes in the background by default:
the step returns once the blocks are on the host, and a worker thread
publishes, gathers the receipts and commits. Steps that come faster than
publishing queue up (max_pending); each must still become its own version,
in order, bit for bit. These run a one-rank gloo job in a subprocess (the
same code path as every rank of a larger job) with a publish slowed down so
that the queue fills.
"""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import deltasync  # noqa: E402

JOB = textwrap.dedent(
    """
    import sys, time
    import torch, torch.distributed as dist
    import deltasync.torch as dt
    bucket, out, steps, fail_first = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    dist.init_process_group("gloo", init_method="file://" + out + "/init", rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    handle = dt.attach(model, opt, dt.ShardedPublisher(bucket, threads=1, max_pending=4))
    native = handle._native

    class Slow:  # the publish takes longer than a step: the steps queue up
        def __getattr__(self, name):
            return getattr(native, name)

        def publish(self, *args):
            time.sleep(0.4)
            return native.publish(*args)

    handle._native = Slow()
    if fail_first:
        handle.fail_next_publish = True
    g = torch.Generator().manual_seed(1)
    errors = []
    for step in range(1, steps + 1):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        try:
            opt.step()
        except Exception as e:  # a failed earlier version, raised from the hook: this step is not queued
            errors.append(f"step {step} raised: {e}")
        torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, out + f"/step{step}.pt")
    try:
        handle.flush()
    except Exception as e:
        errors.append(str(e))
    handle.remove()
    with open(out + "/errors.txt", "w") as f:
        f.write("\\n".join(errors))
    dist.destroy_process_group()
    """
)


def run_job(tmp_path, steps, fail_first=False):
    bucket, out = tmp_path / "bucket", tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-c", JOB, str(bucket), str(out), str(steps), "1" if fail_first else "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(bucket), out, (out / "errors.txt").read_text()


def bf16_bits(t):
    return t.to(torch.bfloat16).view(torch.int16).numpy()


def check_versions(bucket, out, version_of_step):
    m = json.loads((open(bucket + "/manifest.json").read()))
    assert [v["version"] for v in m["versions"]] == sorted(version_of_step.values())
    replica = deltasync.Replica(bucket)
    for step, version in version_of_step.items():
        assert replica.update(version) == version
        saved = torch.load(out / f"step{step}.pt")
        held = replica.tensors()
        for name, t in saved.items():
            np.testing.assert_array_equal(held[name].view(np.int16), bf16_bits(t),
                                          err_msg=f"{name}: version {version} is not step {step}")


def test_queued_background_steps_each_become_their_own_version(tmp_path):
    # Four steps while the first version is still publishing: each step's
    # job must carry its own version number (before the fix the queued jobs
    # all took the number the worker had not yet advanced, and failed).
    bucket, out, errors = run_job(tmp_path, 4)
    assert errors == ""
    check_versions(bucket, out, {1: 1, 2: 2, 3: 3, 4: 4})


def test_a_failed_version_is_published_again_by_the_next_queued_step(tmp_path):
    # Step 1's part fails: nothing is committed, the failure is raised, and
    # the next step (already queued) publishes version 1 again; the later
    # steps follow on from it.
    bucket, out, errors = run_job(tmp_path, 5, fail_first=True)
    assert "version 1 was not committed" in errors and "injected failure of part 0" in errors
    # The step whose hook raised the failure (which one depends on timing) was
    # queued all the same (session 51): every step after the first is a version, in order.
    raised = {int(line.split()[1]) for line in errors.splitlines() if line.startswith("step ")}
    assert len(raised) <= 1
    check_versions(bucket, out, {s: v for v, s in enumerate(range(2, 6), start=1)})


# Session 51 (H1): two ranks, each holding half of every parameter (Shard(0)), whose
# training loops run at different speeds. A failed version is raised by whichever step
# of each rank comes after the outcome: step 2 on the slow rank, a later one on the fast
# rank. Every step must still be queued on every rank, or the ranks' queues pair
# different steps and a version commits half of one step and half of another.
TWO_RANKS = textwrap.dedent(
    """
    torch.manual_seed(0)
    full = torch.randn(8, 4)
    w = torch.nn.Parameter(DTensor.from_local(full.chunk(2)[rank].clone(), mesh, [Shard(0)], run_check=False))
    opt = torch.optim.SGD([w], lr=0.5)
    model = torch.nn.Module()
    model.w = w
    handle = dt.attach(model, opt, dt.ShardedPublisher(bucket, threads=1, max_pending=8))
    native = handle._native

    class Slow:  # rank 1's part takes long: the outcome of version 1 comes late
        def __getattr__(self, name):
            return getattr(native, name)

        def publish(self, *args):
            time.sleep(0.5)
            return native.publish(*args)

    if rank == 0:
        handle.fail_next_publish = True  # version 1 fails on rank 0
    else:
        handle._native = Slow()
    pause = 0.1 if rank == 0 else 1.0   # rank 0 steps fast, rank 1 slowly
    for step in range(1, 7):
        g = torch.Generator().manual_seed(step)
        w.grad = DTensor.from_local(torch.randn(8, 4, generator=g).chunk(2)[rank], mesh, [Shard(0)], run_check=False)
        try:
            opt.step()
        except Exception as e:
            lines.append(f"step {step} raised: {e}")
        torch.save(w.to_local().detach().clone(), out + f"/r{rank}-step{step}.pt")
        time.sleep(pause)
    try:
        handle.flush()
    except Exception as e:
        lines.append(str(e))
    handle.remove()
    """
)


# What every two-rank job below starts and ends with: `mesh` (1-D, 2 ranks), `lines` that the
# job appends to and the test reads back (one list per rank), and `try_attach` (attach and
# remove, or the InvalidArgumentError's message).
PROLOGUE = textwrap.dedent(
    """
    import sys, time
    import torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    import deltasync, deltasync.torch as dt
    bucket, out, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo", init_method="file://" + out + "/init", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    lines = []


    def try_attach(model, bucket=bucket):
        try:
            dt.attach(model, torch.optim.SGD(model.parameters(), lr=0.1), dt.ShardedPublisher(bucket)).remove()
            return "attached"
        except deltasync.InvalidArgumentError as e:
            return str(e)
    """
)
EPILOGUE = textwrap.dedent(
    """
    with open(out + f"/lines-{rank}.txt", "w") as f:
        f.write("\\n".join(lines))
    dist.destroy_process_group()
    """
)


def run_two_ranks(script, tmp_path):
    """Runs PROLOGUE + `script` + EPILOGUE as ranks 0 and 1; returns (bucket, out, lines of each rank)."""
    bucket, out = tmp_path / "bucket", tmp_path / "out"
    out.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", PROLOGUE + script + EPILOGUE, str(bucket), str(out), str(r)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(2)]
    logs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)
    return bucket, out, [(out / f"lines-{r}.txt").read_text() for r in range(2)]


def test_a_failure_raised_at_different_steps_on_two_ranks_never_mixes_their_steps(tmp_path):
    bucket, out, errors = run_two_ranks(TWO_RANKS, tmp_path)
    assert all("version 1 was not committed" in e for e in errors), errors
    # The slow rank saw the failure at one step (2 unless the machine is very slow), the fast
    # one later or only at flush(): the ranks raised at different steps.
    raised = [{int(line.split()[1]) for line in e.splitlines() if line.startswith("step ")} for e in errors]
    assert len(raised[1]) == 1 and raised[0] != raised[1], raised
    # Every version is one step of the trainer (both halves), and every step from 2 on is a version.
    m = json.loads((bucket / "manifest.json").read_text())
    versions = [v["version"] for v in m["versions"]]
    assert versions == [1, 2, 3, 4, 5], versions
    replica = deltasync.Replica(str(bucket))
    for version, step in zip(versions, range(2, 7)):
        assert replica.update(version) == version
        held = replica.tensors()["w"].view(np.int16)
        halves = [torch.load(out / f"r{r}-step{step}.pt") for r in range(2)]
        np.testing.assert_array_equal(held, bf16_bits(torch.cat(halves)),
                                      err_msg=f"version {version} is not step {step} on both ranks")


# One DTensor whose local shard is fp32 on rank 0 and bf16 on rank 1: both publish as BF16,
# but the ranks do not hold one tensor (session 51, H1: it was accepted).
MIXED_DTYPES = textwrap.dedent(
    """
    local = torch.randn(3, 4, dtype=torch.bfloat16 if rank == 1 else torch.float32)
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(DTensor.from_local(local, mesh, [Shard(0)], run_check=False))
    lines.append(try_attach(model))
    """
)


def test_a_tensor_whose_ranks_hold_different_dtypes_is_refused_at_attach(tmp_path):
    bucket, _, messages = run_two_ranks(MIXED_DTYPES, tmp_path)
    for rank, other in ((0, 1), (1, 0)):
        message = messages[rank]
        assert "parameter 'w' is" in message and f"on rank {other}" in message, message
        assert "torch.float32" in message and "torch.bfloat16" in message, message
    assert not (bucket / "manifest.json").exists()


# Copies of one block that differ: a Replicate() DTensor (an HSDP replica group) and a plain
# parameter (data-parallel) initialized with a different seed on each rank. Only rank 0 (the
# replica at coordinate 0) publishes each, so the other rank's values were never looked at
# (session 51, H1: attached, and rank 0's copy published as the trainer's).
COPIES = textwrap.dedent(
    """
    for case in ("same", "replicate", "plain"):
        torch.manual_seed(0)
        same = torch.randn(4, 4)
        torch.manual_seed(rank)  # a different seed on each rank
        differs = torch.randn(4, 4)
        model = torch.nn.Module()
        model.a = torch.nn.Parameter(DTensor.from_local(same.clone(), mesh, [Shard(0)], run_check=False))
        model.r = torch.nn.Parameter(DTensor.from_local(differs if case == "replicate" else same.clone(), mesh,
                                                        [Replicate()], run_check=False))
        model.p = torch.nn.Parameter(differs if case == "plain" else same.clone())
        lines.append(case + ": " + try_attach(model, bucket + "-" + case))
    """
)


def test_copies_of_one_block_that_differ_between_ranks_are_refused_at_attach(tmp_path):
    _, _, lines = run_two_ranks(COPIES, tmp_path)
    for rank in (0, 1):
        same, replicate, plain = lines[rank].splitlines()
        assert same == "same: attached"
        for line, name in ((replicate, "r"), (plain, "p")):
            assert f"parameter '{name}': ranks 0 and 1 hold different values for its block at offset [0, 0], " \
                   "shape [4, 4]" in line, line


# Rank 1's copy of its blocks to the host fails at step 2 (session 51, H1: the step raised on
# rank 1 alone and was queued on rank 0 only, so rank 0's step 2 waited for rank 1's step 3).
SNAPSHOT_FAILS = textwrap.dedent(
    """
    torch.manual_seed(0)
    w = torch.nn.Parameter(DTensor.from_local(torch.randn(8, 4).chunk(2)[rank].clone(), mesh, [Shard(0)],
                                              run_check=False))
    opt = torch.optim.SGD([w], lr=0.5)
    model = torch.nn.Module()
    model.w = w
    handle = dt.attach(model, opt, dt.ShardedPublisher(bucket, threads=1), background=False)

    class Unreadable:  # its local shard cannot be copied to the host
        def to_local(self):
            raise RuntimeError("the host copy failed")

    for step in range(1, 5):
        g = torch.Generator().manual_seed(step)
        w.grad = DTensor.from_local(torch.randn(8, 4, generator=g).chunk(2)[rank], mesh, [Shard(0)], run_check=False)
        blocks = handle._blocks
        if step == 2 and rank == 1:
            handle._blocks = [(name, Unreadable()) for name, _ in blocks]
        try:
            opt.step()
        except Exception as e:
            lines.append(f"step {step} raised: {e}")
        handle._blocks = blocks
        torch.save(w.to_local().detach().clone(), out + f"/r{rank}-step{step}.pt")
    handle.remove()
    """
)


def test_a_host_copy_failing_on_one_rank_fails_that_version_on_every_rank(tmp_path):
    bucket, out, lines = run_two_ranks(SNAPSHOT_FAILS, tmp_path)
    for errors in lines:
        assert errors.startswith("step 2 raised: version 2 was not committed") and \
            "part 1 failed: RuntimeError: the host copy failed" in errors, errors
    m = json.loads((bucket / "manifest.json").read_text())
    assert [v["version"] for v in m["versions"]] == [1, 2, 3]
    replica = deltasync.Replica(str(bucket))
    for version, step in ((1, 1), (2, 3), (3, 4)):
        assert replica.update(version) == version
        halves = [torch.load(out / f"r{r}-step{step}.pt") for r in range(2)]
        np.testing.assert_array_equal(replica.tensors()["w"].view(np.int16), bf16_bits(torch.cat(halves)),
                                      err_msg=f"version {version} is not step {step} on both ranks")


# FSDP1 with use_orig_params: each parameter is a 1-D piece of the rank's flat shard; a 4x4
# weight over two ranks is an (8,) piece on both, as if it were a plain (8,) parameter
# (session 51, H1: attached, and rank 0's half published as the whole tensor).
FSDP1 = textwrap.dedent(
    """
    from torch.distributed.fsdp import FullyShardedDataParallel
    torch.manual_seed(0)
    model = FullyShardedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False)),
                                     device_id=torch.device("cpu"), use_orig_params=True)
    lines += [f"{name} {tuple(p.shape)}" for name, p in model.named_parameters()]
    lines.append(try_attach(model))
    """
)


def test_an_fsdp1_model_is_refused_at_attach(tmp_path):
    bucket, _, lines = run_two_ranks(FSDP1, tmp_path)
    for text in lines:
        shapes, message = text.split("\n", 1)
        assert shapes == "_fsdp_wrapped_module.0.weight (8,)"
        assert message.startswith("attach: the model is wrapped in FSDP1 (FullyShardedDataParallel)"), message
    assert not (bucket / "manifest.json").exists()


# Local shards as trainers leave them (session 51, H1; held, pinned here): a transposed (non-
# contiguous) local, a view at a storage offset, FSDP2's uneven Shard(0) with an empty last
# shard (one row over two ranks), FSDP2's Shard(1), an empty parameter, a plain scalar. The
# replica must hold each full tensor, bit for bit, as torch casts it to bf16.
LOCAL_SHARDS = textwrap.dedent(
    """
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    full_t = torch.randn(6, 8)
    inner = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 4))
    inner.register_parameter("row", torch.nn.Parameter(torch.randn(1, 5)))
    inner.register_parameter("empty", torch.nn.Parameter(torch.zeros(0, 3)))
    fully_shard(inner, mesh=mesh, shard_placement_fn=lambda p: Shard(1) if p.dim() == 2 and p.shape[0] == 8 else Shard(0))
    model = torch.nn.Module()
    model.inner = inner
    # Shard(1) of a (6, 8) tensor whose local (6, 4) block is the transpose of a (4, 6) buffer.
    local_t = full_t.chunk(2, dim=1)[rank].t().contiguous().t()
    assert not local_t.is_contiguous()
    model.t = torch.nn.Parameter(DTensor.from_local(local_t, mesh, [Shard(1)], run_check=False))
    # Shard(0) whose local (3, 4) block starts 12 elements into a larger buffer.
    buffer = torch.cat([torch.full((12,), 9.0), torch.randn(8, 4).chunk(2)[rank].reshape(-1)])
    model.o = torch.nn.Parameter(DTensor.from_local(buffer[12:].view(4, 4)[1:], mesh, [Shard(0)], run_check=False))
    assert model.o.to_local().storage_offset() == 16
    model.s = torch.nn.Parameter(torch.tensor(1.5))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    handle = dt.attach(model, opt, dt.ShardedPublisher(bucket, threads=1))
    for step in range(1, 4):
        for p in model.parameters():
            local = torch.ones_like(p.to_local() if isinstance(p, DTensor) else p) * step
            p.grad = DTensor.from_local(local, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                        stride=p.stride()) if isinstance(p, DTensor) else local
        opt.step()
        handle.flush()
        full = {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
                for n, p in model.named_parameters()}
        if rank == 0:
            torch.save(full, out + f"/v{step}.pt")
    handle.remove()
    """
)


def test_local_shards_as_trainers_leave_them_publish_the_full_tensors(tmp_path):
    bucket, out, _ = run_two_ranks(LOCAL_SHARDS, tmp_path)
    replica = deltasync.Replica(str(bucket))
    for version in (1, 2, 3):
        assert replica.update(version) == version
        full = torch.load(out / f"v{version}.pt")
        held = replica.tensors()
        assert sorted(held) == sorted(full)
        for name, t in full.items():
            np.testing.assert_array_equal(held[name].view(np.int16), bf16_bits(t), err_msg=f"{name} at {version}")
