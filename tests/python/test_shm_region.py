"""deltasync._shm.Region: the node follower's reader of a real `deltasync serve --shm` region.

Sparse (changed indices and values) when the region moved from the version the
reader holds, dense otherwise; None for another version; the seqlock bracket
(waits while the writer is inside, gives up loudly); a stopped daemon is named.
"""
import contextlib
import mmap
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid

import numpy as np
import pytest
import torch

import deltasync
import deltasync.torch as dt
from deltasync._errors import FailedPreconditionError
from deltasync._shm import Region


def states():
    g = torch.Generator().manual_seed(3)
    s1 = {"a.weight": torch.randn(64, 48, generator=g).to(torch.bfloat16),
          "b.bias": torch.randn(300, generator=g).to(torch.bfloat16)}
    s2 = {n: t.clone() for n, t in s1.items()}
    flat = s2["a.weight"].view(-1)
    flat[torch.tensor([0, 7, 500, 3071])] += 1
    s2["b.bias"][5] = 9.0
    return s1, s2


def wait_version(name, v, daemon, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert daemon.poll() is None, "serve exited"
        try:
            r = Region(name)
            if r.version == v:
                return r
        except deltasync.NotFoundError:
            pass
        time.sleep(0.05)
    pytest.fail(f"the region never held version {v}")


def same_bits(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@contextlib.contextmanager
def serving(deltasync_bin, bucket, s1):
    """A `serve --shm` daemon on `bucket` after version 1 (`s1`) was published: (name, publisher, proc)."""
    name = f"ds-test-{uuid.uuid4().hex[:8]}"
    pub = deltasync.Publisher(bucket)
    dt.publish(pub, 1, s1)
    proc = subprocess.Popen([deltasync_bin, "serve", bucket, "--shm", name, "--listen", "127.0.0.1:0",
                             "--poll", "0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield name, pub, proc
    finally:
        pub.close()
        proc.terminate()
        proc.wait(30)


@pytest.fixture
def daemon(deltasync_bin, bucket):
    s1, s2 = states()
    with serving(deltasync_bin, bucket, s1) as (name, pub, proc):
        yield dict(name=name, pub=pub, s1=s1, s2=s2, proc=proc)


def test_sparse_from_the_held_version_dense_otherwise(daemon):
    name, s1, s2 = daemon["name"], daemon["s1"], daemon["s2"]
    r = wait_version(name, 1, daemon["proc"])
    first = r.take(1, None, full=False)
    assert first.changes is None and all(same_bits(first.src[n], s1[n]) for n in s1)
    dt.publish(daemon["pub"], 2, s2)
    r = wait_version(name, 2, daemon["proc"])
    assert r.take(1, None, full=False) is None  # never another version than the one asked for
    sparse = r.take(2, 1, full=False)
    assert sparse.base_version == 1 and sparse.version == 2
    for n in s1:
        want = torch.nonzero(s1[n].view(-1) != s2[n].view(-1)).view(-1)
        assert np.array_equal(sparse.changes[n], want.numpy()), n
        assert same_bits(sparse.values[n], s2[n].view(-1)[want]), n
        assert sparse.src[n].is_meta and sparse.src[n].shape == s2[n].shape  # no content without full
    assert sparse.changes["a.weight"].tolist() == [0, 7, 500, 3071]
    with_full = r.take(2, 1, full=True)
    assert all(same_bits(with_full.src[n], s2[n]) for n in s2)
    dense = r.take(2, 7, full=False)  # the reader holds another version: whole tensors
    assert dense.changes is None and all(same_bits(dense.src[n], s2[n]) for n in s2)


def test_seqlock_waits_for_the_writer_and_gives_up_loudly(daemon):
    name = daemon["name"]
    wait_version(name, 1, daemon["proc"])
    copy = f"{name}-copy"
    shutil.copyfile(f"/dev/shm/{name}", f"/dev/shm/{copy}")
    try:
        with open(f"/dev/shm/{copy}", "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0)
        seq = np.frombuffer(mm, dtype="<u8", count=3)  # seq at byte 16
        s = int(seq[2])
        seq[2] = s + 1  # the writer is inside
        r = Region(copy)
        with pytest.raises(TimeoutError, match="busy"):
            r.take(1, None, full=False, timeout=0.2)
        timer = threading.Timer(0.3, lambda: seq.__setitem__(2, s + 2))
        timer.start()
        t0 = time.monotonic()
        got = r.take(1, None, full=False, timeout=10)
        assert time.monotonic() - t0 >= 0.25 and got.retries > 0 and got.version == 1
        assert all(same_bits(got.src[n], daemon["s1"][n]) for n in daemon["s1"])
        del seq
        mm.close()
    finally:
        os.unlink(f"/dev/shm/{copy}")


def test_a_stopped_daemon_is_named(daemon):
    r = wait_version(daemon["name"], 1, daemon["proc"])
    r.check_alive()
    daemon["proc"].send_signal(signal.SIGTERM)
    daemon["proc"].wait(30)
    with pytest.raises(FailedPreconditionError, match=rf"--shm region '{daemon['name']}' was closed"):
        r.check_alive()


# --- the node follower's plan: this worker's changed elements, native, into its parameters ----------------

def big_states():
    g = torch.Generator().manual_seed(5)
    s1 = {"a.weight": torch.randn(64, 48, generator=g).to(torch.bfloat16),
          "c.weight": torch.randn(1024, 1024, generator=g).to(torch.bfloat16),
          "d.bias": torch.randn(300, generator=g).to(torch.bfloat16)}
    s2 = {n: t.clone() for n, t in s1.items()}
    for n, frac in (("a.weight", 0.1), ("c.weight", 0.1), ("d.bias", 0.5)):  # 105k changes: chunks
        flat = s2[n].view(-1)
        idx = torch.randperm(flat.numel(), generator=g)[: int(flat.numel() * frac)]
        flat[idx] += 1
    return s1, s2


@pytest.fixture
def big_daemon(deltasync_bin, bucket):
    s1, s2 = big_states()
    with serving(deltasync_bin, bucket, s1) as (name, pub, proc):
        wait_version(name, 1, proc)
        dt.publish(pub, 2, s2)
        yield dict(name=name, s1=s1, s2=s2, region=wait_version(name, 2, proc))


def shards(s):
    """Parameters holding parts of the version-`s` tensors as three kinds of worker would, with a
    sentinel around the part; and their Places."""
    from deltasync._shm_plan import Place
    c = s["c.weight"]
    rows = torch.full((700, 1024), 7.0, dtype=torch.bfloat16)  # rows 512..1023 at local row 100 (rank 1 of 2, fused)
    rows[100:612] = c[512:]
    cols = c[:, 512:].clone()  # a row-parallel shard: columns 512..1023 (rank 1 of 2)
    a = s["a.weight"].clone()
    d = s["d.bias"].clone()
    places = {
        "rows": {"c.weight": Place(rows.view(-1), (1024, 1024), 512 * 1024, 1024 * 1024, 1024, 0, 1024, 100 * 1024),
                 "a.weight": Place(a.view(-1), (64, 48), 0, 64 * 48), "d.bias": Place(d.view(-1), (300,), 0, 300)},
        "cols": {"c.weight": Place(cols.view(-1), (1024, 1024), 0, 1024 * 1024, 1024, 512, 512)},
    }
    return dict(rows=rows, cols=cols, a=a, d=d), places


@pytest.mark.parametrize("threads", [1, 3])
def test_plan_takes_only_this_workers_part_and_scatters_it_exactly(big_daemon, threads):
    from deltasync._shm_plan import Plan
    r, s1, s2 = big_daemon["region"], big_daemon["s1"], big_daemon["s2"]
    params, places = shards(s1)
    want, _ = shards(s2)
    plans = {k: Plan(r, pl, threads) for k, pl in places.items()}
    for kind, plan in plans.items():
        before = {k: v.clone() for k, v in params.items()}
        taken = r.take(2, 1, full=False, plan=plan)
        assert taken.changes.keys().isdisjoint(plan.names) and set(taken.planned) == set(plan.names)
        changed = (s1["c.weight"] != s2["c.weight"]).view(-1)
        part = changed.view(1024, 1024)[512:] if kind == "rows" else changed.view(1024, 1024)[:, 512:]
        assert taken.planned["c.weight"] == int(part.sum())  # only this worker's part was copied
        assert all(same_bits(params[k], before[k]) for k in params)  # the read touches no parameter
        assert plan.scatter() == sum(taken.planned.values())
    for k in params:
        assert same_bits(params[k], want[k]), k


def test_plan_buffers_grow_and_are_reused(big_daemon):
    from deltasync._shm_plan import Plan
    r, s1, s2 = big_daemon["region"], big_daemon["s1"], big_daemon["s2"]
    params, places = shards(s1)
    plan = Plan(r, places["rows"], 2)
    plan._idx, plan._val = np.empty(3, np.uint32), np.empty(5, np.uint8)  # too small for the update
    r.take(2, 1, full=False, plan=plan)
    grown = plan._idx, plan._val
    assert len(grown[0]) >= sum(plan.counts().values())
    r.take(2, 1, full=False, plan=plan)
    assert plan._idx is grown[0] and plan._val is grown[1]  # the same buffers, no new pages
    plan.scatter()
    want, _ = shards(s2)
    assert same_bits(params["rows"], want["rows"])


def test_plan_read_torn_by_the_writer_is_retried_and_a_corrupt_list_is_loud(big_daemon):
    from deltasync._errors import CorruptionError
    from deltasync._shm_plan import Plan
    name, s1, s2 = big_daemon["name"], big_daemon["s1"], big_daemon["s2"]
    copy = f"{name}-copy"
    shutil.copyfile(f"/dev/shm/{name}", f"/dev/shm/{copy}")
    try:
        with open(f"/dev/shm/{copy}", "r+b") as f:
            mm = mmap.mmap(f.fileno(), 0)
        u64 = np.frombuffer(mm, dtype="<u8")
        r = Region(copy)
        params, places = shards(s1)
        before = params["rows"].clone()
        plan = Plan(r, places["rows"], 2)
        e = r.tensors["c.weight"][0]
        good_off, good_cnt = int(u64[e + 5]), int(u64[e + 6])
        real_read = plan.read
        calls = []

        def torn(region):  # the writer rewrites c.weight's list while the worker copies it
            calls.append(1)
            if len(calls) == 1:
                u64[e + 5] = 8  # a list outside the change-list area
                got = real_read(region)
                u64[e + 5] = good_off
                u64[2] += 2  # and moved on: the bracket fails
                return got
            if len(calls) == 2:
                lst = u64[good_off // 8:good_off // 8 + good_cnt]
                lst[[-11, -10]] = lst[[-10, -11]]  # out of order (in this worker's rows)
                got = real_read(region)
                lst[[-11, -10]] = lst[[-10, -11]]
                u64[2] += 2
                return got
            return real_read(region)

        plan.read = torn
        taken = r.take(2, 1, full=False, plan=plan)
        assert taken.retries == 2 and len(calls) == 3
        assert same_bits(params["rows"], before)
        plan.scatter()
        want, _ = shards(s2)
        assert same_bits(params["rows"], want["rows"])
        # the same damage inside a bracket that held: an error naming the tensor, nothing written
        plan.read = real_read
        params2, places2 = shards(s1)
        plan2 = Plan(r, places2["rows"], 2)
        u64[e + 5] = 8
        with pytest.raises(CorruptionError, match="change list of 'c.weight' lies outside its area"):
            r.take(2, 1, full=False, plan=plan2)
        u64[e + 5] = good_off
        lst = u64[good_off // 8:good_off // 8 + good_cnt]
        lst[-1] = lst[-2]  # repeated
        with pytest.raises(CorruptionError, match="'c.weight' is not strictly ascending"):
            r.take(2, 1, full=False, plan=plan2)
        with pytest.raises(RuntimeError, match="no read to write"):
            plan2.scatter()
        assert same_bits(params2["rows"], before)
        del u64, lst
        mm.close()
    finally:
        os.unlink(f"/dev/shm/{copy}")


def test_the_node_follower_wakes_a_daemon_that_has_a_token(deltasync_bin, bucket, tmp_path, monkeypatch):
    """A `--token-file` daemon (which only polls hourly here) is woken with its bearer token."""
    import socket
    import urllib.error

    from deltasync.vllm import DeltaSyncEngine, DeltaSyncInitInfo
    s1, s2 = states()
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    name = f"ds-test-{uuid.uuid4().hex[:8]}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pub = deltasync.Publisher(bucket)
    dt.publish(pub, 1, s1)
    proc = subprocess.Popen([deltasync_bin, "serve", bucket, "--shm", name, "--listen", f"127.0.0.1:{port}",
                             "--poll", "3600", "--token-file", str(token)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_version(name, 1, proc)
        got = {}
        eng = DeltaSyncEngine(load_weights=lambda ws: got.update({n: t.clone() for n, t in ws}))
        info = dict(shm=name, shm_url=f"http://127.0.0.1:{port}", shm_wait_s=20)
        eng.init_transfer_engine(DeltaSyncInitInfo(**info))
        eng.update_weights({"version": 1})
        dt.publish(pub, 2, s2)
        with pytest.raises(urllib.error.HTTPError, match="401"):  # no token: refused, the engine keeps 1
            eng.update_weights({"version": 2})
        assert eng.version == 1
        eng.init_transfer_engine(DeltaSyncInitInfo(**info, shm_token_file=str(token)))
        eng.update_weights({"version": 2})
        assert eng.last_update["version"] == 2 and eng.last_update["source"] == "shm"
        assert all(same_bits(got[n], s2[n]) for n in s2)
        monkeypatch.setenv("DELTASYNC_SHM_TOKEN_FILE", str(tmp_path / "missing"))
        eng.init_transfer_engine(DeltaSyncInitInfo(**info))
        dt.publish(pub, 3, s1)
        with pytest.raises(ValueError, match="cannot read the daemon's token"):
            eng.update_weights({"version": 3})
    finally:
        pub.close()
        proc.terminate()
        proc.wait(30)
