"""Session 49 (helper H5): an adversarial review of the Python <-> native boundary (python/native/*.cc).

Each test here failed on the code before its fix (docs/benchmarks.md, "Session 49 (helper H5)").
"""
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import deltasync
from deltasync import _elements, _native

torch = pytest.importorskip("torch")


# ---------------------------------------------------------------- lifetimes

# Replica.tensors() hands out views of the replica's buffers. An update to a
# version whose layout differs (a recovered, anchor-only version may reshape or
# rename tensors as long as the element count matches) used to replace the
# state and free the buffers under the views: reading one then read freed
# memory (another tensor's bytes, garbage, or SIGSEGV once the pages were
# unmapped). Run in a child process so that a crash is a failure, not the end
# of the test run.
_RELAYOUT = textwrap.dedent("""
    import gc, os, sys, warnings
    import numpy as np
    import deltasync

    bucket = sys.argv[1]
    w = (np.arange(1 << 20) % 200).astype(np.float32).reshape(1024, 1024)  # 2 MiB of bf16: its own mmap
    p = deltasync.Publisher(bucket)
    p.publish(1, {"w": w})
    p.close()
    r = deltasync.Replica(bucket)
    assert r.update() == 1
    old = r.tensors()["w"]
    v1 = np.array(old, copy=True)
    os.remove(os.path.join(bucket, "ds/anchors/step_000001.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = deltasync.Publisher(bucket)
    assert p.degraded
    p.publish(2, {"w": (w + 1).reshape(2048, 512)})  # recovered: same elements, another shape
    p.close()
    assert r.update() == 2
    new = r.tensors()["w"]
    assert new.shape == (2048, 512)
    np.testing.assert_array_equal(new.astype(np.float32), (w + 1).reshape(2048, 512))
    junk = [np.full(1 << 20, 7, np.uint16) for _ in range(8)]  # reuse what was freed
    gc.collect()
    # The old view still reads version 1 (its buffer outlived the replacement).
    np.testing.assert_array_equal(old.view(np.uint16), v1.view(np.uint16))
    del old, new, r
    gc.collect()
    print("ok")
""")


def test_a_view_outlives_an_update_that_changes_the_layout(tmp_path):
    proc = subprocess.run([sys.executable, "-c", _RELAYOUT, str(tmp_path / "b")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode, proc.stdout, proc.stderr[-3000:])


def test_a_view_follows_an_update_with_the_same_layout(tmp_path):
    bucket = str(tmp_path / "b")
    w = (np.arange(4096) % 100).astype(np.float32).reshape(64, 64)
    with deltasync.Publisher(bucket) as p:
        p.publish(1, {"w": w})
        p.publish(2, {"w": w * 2})
    r = deltasync.Replica(bucket)
    r.update(1)
    view = r.tensors()["w"]
    r.update(2)
    assert np.shares_memory(view, r.tensors()["w"])  # in place, as documented
    np.testing.assert_array_equal(view.astype(np.float32), w * 2)


# ------------------------------------------- outputs never written to a copy

# nanobind converts an ndarray argument that misses the declared order or
# dtype into a temporary copy. For an output that meant writing the copy and
# returning: the caller's array stayed as it was, silently.

def test_gather_into_a_non_contiguous_out_is_refused():
    src = torch.arange(100, dtype=torch.int64)
    idx = np.array([3, 5, 7], dtype=np.int64)
    out = torch.zeros(6, dtype=torch.int64)[::2]
    with pytest.raises(TypeError):
        _native.gather_elements(src, idx, out, 1)
    out_np = np.zeros(6, dtype=np.int64)[::2]
    with pytest.raises(TypeError):
        _native.gather_elements(src, idx, out_np, 1)


def test_scatter_into_a_non_contiguous_destination_is_refused():
    base = torch.zeros(4, 8, dtype=torch.float32)
    dst = base.t()  # a transposed view: not C-contiguous
    idx = torch.tensor([0, 9, 17], dtype=torch.int64)
    vals = torch.tensor([1.0, 2.0, 3.0])
    with pytest.raises(TypeError):
        _native.scatter_elements(dst, idx, vals, 0, 1, 0, 1, 1)
    with pytest.raises(TypeError):
        _elements.put_elements(base[:, ::2], idx, vals)
    assert not base.any()


def test_shm_take_jobs_refuses_outputs_it_would_convert():
    region = np.zeros(64, np.uint8)
    jobs = np.zeros((0, 11), np.int64)
    ok = dict(out_idx=np.zeros(4, np.uint32), out_val=np.zeros(8, np.uint8), result=np.zeros((0, 3), np.int64))
    assert _native.shm_take_jobs(region, 0, 8, jobs, **ok, threads=1) == (0, -1, 0, 0)
    for name, bad in [("out_idx", np.zeros(4, np.int64)), ("out_val", np.zeros(16, np.uint8)[::2]),
                      ("result", np.zeros((0, 3), np.int32))]:
        with pytest.raises(TypeError):
            _native.shm_take_jobs(region, 0, 8, jobs, **{**ok, name: bad}, threads=1)


# ---------------------------------------------------------- checked, passing

def test_input_views_with_an_offset_publish_their_own_elements(tmp_path):
    bucket = str(tmp_path / "b")
    big = (np.arange(3 * 4096) % 250).astype(np.float32).reshape(3, 64, 64)
    with deltasync.Publisher(bucket) as p:
        p.publish(1, {"w": big[1], "t": torch.from_numpy(big)[2]})
    got = deltasync.Replica(bucket)
    got.update()
    t = got.tensors()
    np.testing.assert_array_equal(t["w"].astype(np.float32), big[1])
    np.testing.assert_array_equal(t["t"].astype(np.float32), big[2])


def test_non_contiguous_inputs_are_refused(tmp_path):
    with deltasync.Publisher(str(tmp_path / "b")) as p:
        with pytest.raises(deltasync.InvalidArgumentError, match="not contiguous"):
            p.publish(1, {"w": np.zeros((64, 64), np.float32).T})
        with pytest.raises(deltasync.InvalidArgumentError, match="not contiguous"):
            p.publish(1, {"w": torch.zeros(64, 64)[:, ::2]})


def test_two_threads_on_one_replica_are_serialised(tmp_path):
    bucket = str(tmp_path / "b")
    w = (np.arange(1 << 16) % 100).astype(np.float32)
    with deltasync.Publisher(bucket) as p:
        for v in range(1, 6):
            p.publish(v, {"w": w + v})
    r = deltasync.Replica(bucket)
    errors = []

    def work(target):
        try:
            for _ in range(5):
                r.update(target)
                r.verify()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(v,)) for v in (5, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert r.version == 5
    np.testing.assert_array_equal(r.tensors()["w"].astype(np.float32), w + 5)


# ------------------------------------------- publish_changes value dtypes

# publish_changes took values of any dtype whose width matched the published
# one as that dtype's bits: float16 3.0 for a bf16 tensor was published as
# bf16 32.0 (0x4200), silently.

@pytest.mark.parametrize("values", [np.array([3.0], np.float16), np.array([3], np.int16),
                                    torch.tensor([3.0], dtype=torch.float16)])
def test_publish_changes_refuses_values_it_would_reinterpret(tmp_path, values):
    bucket = str(tmp_path / "b")
    with deltasync.Publisher(bucket) as p:
        p.publish(1, {"w": np.ones(8, np.float32)})
        with pytest.raises(deltasync.InvalidArgumentError, match="values of (F16|I16) for the published dtype BF16"):
            p.publish_changes(2, {"w": (np.array([0], np.uint64), values)})
        assert p.latest_version == 1
        # the documented forms still work: float32 (rounded), bf16, its uint16 bits
        import ml_dtypes
        p.publish_changes(2, {"w": (np.array([0], np.uint64), np.array([3.0], np.float32))})
        p.publish_changes(3, {"w": (np.array([1], np.uint64), np.array([5.0], ml_dtypes.bfloat16))})
        p.publish_changes(4, {"w": (np.array([2], np.uint64), np.array([7.0], ml_dtypes.bfloat16).view(np.uint16))})
        p.publish_changes(5, {"w": (np.array([3], np.uint64), torch.tensor([9.0], dtype=torch.bfloat16))})
    r = deltasync.Replica(bucket)
    r.update()
    np.testing.assert_array_equal(r.tensors()["w"].astype(np.float32), [3, 5, 7, 9, 1, 1, 1, 1])
