"""Inputs that change while a publish reads them (session 50, helper H3).

* torch tensors that a trainer thread writes in place, resizes (``resize_``) or replaces
  (``set_``) while ``deltasync.torch.publish`` reads them without the GIL: the version is refused
  (FailedPreconditionError naming the tensor), nothing is committed, the next publish goes on.
* a checkpoint file written into while ``deltasync publish`` / ``diff`` / ``apply`` read it: a
  writer process rewrites it in a loop during the command, which must refuse it.
* thread starts refused by the system in the extension's parallel loops: the work runs on the
  threads that did start, the result is exact (it used to be std::terminate).
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

torch = pytest.importorskip("torch")

import deltasync  # noqa: E402
import deltasync.torch as dtorch  # noqa: E402
from deltasync import _native  # noqa: E402
from deltasync._errors import FailedPreconditionError  # noqa: E402


def _weights(seed: int = 0) -> dict[str, "torch.Tensor"]:
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(64, 32, generator=g).to(torch.bfloat16),
            "b": torch.randn(1000, generator=g).to(torch.bfloat16)}


class _Trainer:
    """The real native publisher, with a trainer step run in another thread after publish() took
    the tensors and before the native code reads them (deterministic 'during the publish')."""

    def __init__(self, native, step):
        self._real, self._step = native, step

    def _run_step(self):
        t = threading.Thread(target=self._step)
        t.start()
        t.join(30)

    def publish(self, version, items, *unchanged):
        self._run_step()
        return self._real.publish(version, items, *unchanged)

    def snapshot(self, items):
        self._run_step()
        return self._real.snapshot(items)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _steps(w):
    other = torch.zeros(64, 32, dtype=torch.bfloat16)
    return {
        "written in place": lambda: w["a"].add_(1),
        "resized": lambda: w["b"].resize_(10),
        "replaced": lambda: w["a"].set_(other),
    }


@pytest.mark.parametrize("background", [False, True])
@pytest.mark.parametrize("what", ["written in place", "resized", "replaced"])
def test_a_tensor_changed_during_a_torch_publish_refuses_the_version(tmp_path, what, background):
    bucket = str(tmp_path / "bucket")
    pub = deltasync.Publisher(bucket)
    w = _weights()
    first = dtorch.publish(pub, 1, w)
    assert first.version == 1
    step = _steps(w)[what]
    real = pub._native
    pub._native = _Trainer(real, step)
    with pytest.raises(FailedPreconditionError, match=r"tensor (a|b) changed while version 2 was read") as err:
        result = dtorch.publish(pub, 2, w, background=background)
        if background:
            result.result(timeout=60)
    assert {"written in place": "written in place", "resized": "shape went from [1000] to [10]",
            "replaced": "storage was replaced"}[what] in str(err.value)
    pub._native = real
    pub.flush()
    assert pub.latest_version == 1, "the refused version was committed"
    replica = deltasync.Replica(bucket)
    assert replica.update() == 1
    # The tensors as they are now publish.
    w["b"] = torch.randn(1000).to(torch.bfloat16)
    w["a"] = w["a"].clone()
    assert dtorch.publish(pub, 2, w).version == 2
    pub.close()


def test_an_unchanged_torch_publish_is_not_refused(tmp_path):
    pub = deltasync.Publisher(str(tmp_path / "bucket"))
    w = _weights()
    real = pub._native
    pub._native = _Trainer(real, lambda: w["b"].clone().add_(1))  # another tensor, not a published one
    assert dtorch.publish(pub, 1, w).version == 1
    assert dtorch.publish(pub, 2, w, background=True).result(timeout=60).version == 2
    pub.close()


def test_inference_mode_tensors_publish_and_their_other_changes_are_still_refused(tmp_path):
    # Session 50, H4: tensors made under torch.inference_mode() have no version counter
    # (t._version raises RuntimeError), so the held-tensor check made every publish of them fail
    # with that RuntimeError. They publish; a resize or a new storage is still refused.
    with torch.inference_mode():
        w = _weights()
    assert w["a"].is_inference()
    pub = deltasync.Publisher(str(tmp_path / "bucket"))
    assert dtorch.publish(pub, 1, w).version == 1
    real = pub._native

    def resize():
        with torch.inference_mode():  # outside it, torch refuses in-place changes to them
            w["b"].resize_(10)

    pub._native = _Trainer(real, resize)
    with pytest.raises(FailedPreconditionError, match="tensor b changed while version 2 was read"):
        dtorch.publish(pub, 2, w)
    pub._native = real
    assert pub.latest_version == 1
    pub.close()


_WRITER = r"""
import os, sys
path, size = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_WRONLY)
flip = bytes([1]) * 4096
print("writing", flush=True)
i = 0
while True:
    # The data section's last page, alternately: the file stays the same size.
    os.pwrite(fd, flip if i % 2 else bytes(4096), size - 4096)
    i += 1
"""


def _bf16_file(path, n: int, seed: int) -> int:
    arr = np.random.default_rng(seed).standard_normal(n).astype(ml_dtypes.bfloat16)
    save_file({"w": arr}, str(path))
    return os.path.getsize(path)


@pytest.mark.parametrize("command", ["publish", "diff", "apply", "inspect"])
def test_a_file_rewritten_while_the_cli_reads_it_is_refused(tmp_path, command, deltasync_bin):
    exe = deltasync_bin
    ckpt = tmp_path / "model.safetensors"
    old = tmp_path / "old.safetensors"
    size = _bf16_file(ckpt, 16 << 20, 1)
    _bf16_file(old, 16 << 20, 2)
    patch = tmp_path / "p.patch"
    if command in ("apply", "inspect"):
        # A raw delta from the file to another state, without the base state hash (as TRL writes
        # them): nothing but the file check stops it from applying to a torn base.
        subprocess.run([exe, "diff", str(ckpt), str(old), "-o", str(patch), "--encoding", "raw"], check=True,
                       capture_output=True)
        with safe_open(str(patch), "np") as f:
            meta = {k: v for k, v in f.metadata().items() if k != "deltasync_base_state_hash"}
        save_file(load_file(str(patch)), str(patch), metadata=meta)
    if command == "inspect":
        # inspect decodes a delta's changes (session 50, H4): one written into while it is read
        # (a trainer saving a TRL-style delta in place) must not be described from a torn read.
        ckpt, size = patch, os.path.getsize(patch)
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(ckpt), str(size)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert writer.stdout.readline().strip() == "writing"
        if command == "publish":
            args = [exe, "publish", str(tmp_path / "bucket"), str(ckpt), "--version", "1"]
        elif command == "diff":
            args = [exe, "diff", str(old), str(ckpt), "-o", str(tmp_path / "d.patch"), "--version", "2"]
        elif command == "apply":
            args = [exe, "apply", str(ckpt), str(patch), "-o", str(tmp_path / "d.patch")]
        else:
            args = [exe, "inspect", str(ckpt), "--json"]
        run = subprocess.run(args, capture_output=True, text=True, timeout=300)
    finally:
        writer.kill()
        writer.wait()
    assert run.returncode != 0, f"a file written into while it was read was accepted: {run.stdout}"
    assert f"{ckpt} changed while it was read (it was written to)" in run.stderr, run.stderr
    if command == "publish":
        assert deltasync.Publisher(str(tmp_path / "bucket")).latest_version == 0, "the version was committed"
    else:
        assert not (tmp_path / "d.patch").exists()


def test_thread_starts_refused_in_the_extensions_loops_give_the_exact_result():
    n = 3 << 20
    src = np.arange(n, dtype=np.uint16)
    idx = np.random.default_rng(3).integers(0, n, size=n, dtype=np.int64)
    want = src[idx]
    for after in (0, 1, 2):
        out = np.zeros(n, dtype=np.uint16)
        _native._fail_thread_starts_after_for_testing(after)
        try:
            _native.gather_elements(src, idx, out, 4)
        finally:
            _native._fail_thread_starts_after_for_testing(-1)
        assert np.array_equal(out, want), f"refused after {after} starts"
    # shm_scatter_jobs (the node follower's Pull): jobs of several 64Ki-element items.
    dst = np.zeros(n, dtype=np.uint16)
    sidx = np.arange(0, n, 3, dtype=np.uint32)
    vals = np.random.default_rng(4).integers(1, 60000, size=sidx.size, dtype=np.uint16)
    jobs = np.array([[dst.ctypes.data, n, 2, sidx.size, 0, 0]], dtype=np.int64)
    _native._fail_thread_starts_after_for_testing(1)
    try:
        _native.shm_scatter_jobs(jobs, sidx, vals.view(np.uint8), 4)
    finally:
        _native._fail_thread_starts_after_for_testing(-1)
    expect = np.zeros(n, dtype=np.uint16)
    expect[sidx] = vals
    assert np.array_equal(dst, expect)
