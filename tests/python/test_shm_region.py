"""deltasync._shm.Region: the node follower's reader of a real `deltasync serve --shm` region.

Sparse (changed indices and values) when the region moved from the version the
reader holds, dense otherwise; None for another version; the seqlock bracket
(waits while the writer is inside, gives up loudly); a stopped daemon is named.
"""
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


@pytest.fixture
def daemon(deltasync_bin, bucket):
    name = f"ds-test-{uuid.uuid4().hex[:8]}"
    s1, s2 = states()
    pub = deltasync.Publisher(bucket)
    dt.publish(pub, 1, s1)
    proc = subprocess.Popen([deltasync_bin, "serve", bucket, "--shm", name, "--listen", "127.0.0.1:0",
                             "--poll", "0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield dict(name=name, pub=pub, s1=s1, s2=s2, proc=proc)
    finally:
        pub.close()
        proc.terminate()
        proc.wait(30)


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
