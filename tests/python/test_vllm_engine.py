"""deltasync.vllm: the weight-transfer engine, driven with recording callbacks.

vLLM itself is not installed here: the engine's callbacks are what vLLM
0.33.0's worker would run (model.load_weights for full loads,
load_checkpoint_weight_patches for sparse patches). The recorders below
apply what they receive to a plain torch state, which must reproduce the
trainer's published bf16 state bit for bit at every version.
"""
import importlib.util
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import deltasync  # noqa: E402
import deltasync.torch as dt  # noqa: E402
from deltasync.vllm import (  # noqa: E402
    DeltaSyncEngine,
    DeltaSyncUpdateInfo,
    DeltaSyncWorkerExtension,
    SparseWeightPatch,
    apply_patches_to_state_dict,
    request_update,
)

LR = 3e-6


def trained_bucket(path, steps=7, anchor_interval=3):
    """Trains a tiny model with AdamW (lr 3e-6), publishing every step; returns {version: {name: bf16 bits}}."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(40, 32), torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                torch.nn.Linear(64, 40))
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    pub = deltasync.Publisher(str(path), anchor_interval=anchor_interval)
    handle = dt.attach(model, opt, pub, background=False)
    published = {}
    for step in range(steps):
        x = torch.randint(0, 40, (16,), generator=torch.Generator().manual_seed(step))
        loss = torch.nn.functional.cross_entropy(model(x), (x + 1) % 40)
        opt.zero_grad()
        loss.backward()
        opt.step()
        published[step + 1] = {n: p.detach().to(torch.bfloat16).view(torch.int16).reshape(-1).numpy().copy()
                               for n, p in model.named_parameters()}
    handle.remove()
    pub.close()
    return published


class Recorder:
    """Applies what the engine delivers to a torch bf16 state, and records it."""

    def __init__(self, strict_kinds=True):
        self.state = {}
        self.calls = []  # ("dense", [names]) / ("sparse", [(name, count)])

    def load_weights(self, weights):
        names = []
        for name, t in weights:
            assert t.dtype == torch.bfloat16
            self.state[name] = t.detach().clone()  # the engine's tensors are the replica's memory: copy
            names.append(name)
        self.calls.append(("dense", names))

    def apply_patches(self, patches):
        rec = []
        for p in patches:
            assert isinstance(p, SparseWeightPatch)
            assert p.indices.dtype == torch.int64 and p.indices.dim() == 1
            assert p.values.dtype == torch.bfloat16 and p.values.shape == p.indices.shape
            assert bool((p.indices[1:] > p.indices[:-1]).all()), "indices ascending, unique"
            if p.name not in self.state:
                self.state[p.name] = torch.full(p.full_shape, float("nan"), dtype=torch.bfloat16)
            assert tuple(self.state[p.name].shape) == tuple(p.full_shape)
            rec.append((p.name, p.indices.numel()))
        apply_patches_to_state_dict(self.state, patches)
        self.calls.append(("sparse", rec))

    def bits(self):
        return {n: t.view(torch.int16).reshape(-1).numpy() for n, t in self.state.items()}


def assert_state(rec, want, version):
    got = rec.bits()
    assert set(got) == set(want), version
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} at version {version}")


def changed(published, a, b):
    out = {}
    for name in published[a]:
        mask = np.zeros_like(published[a][name], dtype=bool)
        for v in range(a + 1, b + 1):
            mask |= published[v][name] != published[v - 1][name]
        if mask.any():
            out[name] = int(mask.sum())
    return out


def test_engine_follows_every_version_bit_exact(tmp_path):
    published = trained_bucket(tmp_path / "b")
    rec = Recorder()
    engine = DeltaSyncEngine(str(tmp_path / "b"))
    engine.init_transfer_engine(engine.parse_init_info({"bucket": str(tmp_path / "b")}))
    for v in range(1, 8):
        engine.start_weight_update()
        engine.update_weights({"version": v}, load_weights=rec.load_weights, apply_patches=rec.apply_patches)
        engine.finish_weight_update()
        assert engine.version == v
        assert_state(rec, published[v], v)
        kind, what = rec.calls[-1]
        if v == 1:
            assert kind == "dense" and sorted(what) == sorted(published[1])
            assert engine.last_update["kind"] == "dense"
        else:
            # Anchors at 3 and 6 too: a following replica applies their deltas.
            assert kind == "sparse", f"version {v}"
            assert dict(what) == changed(published, v - 1, v)
            assert engine.last_update["elements"] == sum(changed(published, v - 1, v).values())
    assert len(rec.calls) == 7


def test_engine_catches_up_and_late_starter_gets_a_full_load(tmp_path):
    published = trained_bucket(tmp_path / "b")
    rec = Recorder()
    engine = DeltaSyncEngine(str(tmp_path / "b"), load_weights=rec.load_weights, apply_patches=rec.apply_patches)
    engine.update_weights({"version": 2})
    engine.update_weights({"version": 5})  # skips 3 and 4: the union of their changes
    assert_state(rec, published[5], 5)
    assert rec.calls[-1][0] == "sparse"
    assert dict(rec.calls[-1][1]) == changed(published, 2, 5)
    engine.update_weights({})  # newest
    assert engine.version == 7
    assert_state(rec, published[7], 7)

    late = Recorder()
    engine2 = DeltaSyncEngine(str(tmp_path / "b"), load_weights=late.load_weights, apply_patches=late.apply_patches)
    engine2.update_weights({"version": 6})
    assert [k for k, _ in late.calls] == ["dense"]
    assert_state(late, published[6], 6)


def test_trl_style_update_info_and_entry_points(tmp_path):
    published = trained_bucket(tmp_path / "b", steps=4)
    bucket = str(tmp_path / "b")
    info = DeltaSyncUpdateInfo(repo_id=bucket, filename="anchors/step_000001.safetensors", update_kind="dense")
    assert info.version == 1 and info.bucket == bucket
    with pytest.raises(ValueError, match="update_kind"):
        DeltaSyncUpdateInfo(version=1, update_kind="nvcomp")
    with pytest.raises(ValueError, match="does not name a version"):
        DeltaSyncUpdateInfo(filename="weights.safetensors")
    with pytest.raises(ValueError, match="invalid update_info"):
        DeltaSyncEngine(bucket).parse_update_info({"bogus": 1})

    # TRL's receive_weights(update_info, load_weights): only full tensors, the changed ones after the first.
    dense = Recorder()
    engine = DeltaSyncEngine()
    engine.receive_weights(info, dense.load_weights)
    assert_state(dense, published[1], 1)
    info2 = DeltaSyncUpdateInfo(repo_id=bucket, filename="deltas/step_000002.safetensors", update_kind="sparse_flat")
    engine.receive_weights(info2, dense.load_weights)
    assert_state(dense, published[2], 2)
    assert sorted(dense.calls[-1][1]) == sorted(changed(published, 1, 2))

    # TRL's receive_sparse_weights(update_info, apply_patches): a first load arrives as full-coverage patches.
    sparse = Recorder()
    engine = DeltaSyncEngine()
    engine.receive_sparse_weights(DeltaSyncUpdateInfo(bucket=bucket, version=2), sparse.apply_patches)
    assert_state(sparse, published[2], 2)
    assert all(n == published[2][name].size for name, n in sparse.calls[-1][1])
    engine.receive_sparse_weights(DeltaSyncUpdateInfo(bucket=bucket, version=4), sparse.apply_patches)
    assert_state(sparse, published[4], 4)
    assert dict(sparse.calls[-1][1]) == changed(published, 2, 4)


def test_a_failed_delivery_is_retried_full_and_the_status_tells_what_the_engine_holds(tmp_path):
    published = trained_bucket(tmp_path / "b", steps=4)
    rec = Recorder()
    engine = DeltaSyncEngine(str(tmp_path / "b"), load_weights=rec.load_weights, apply_patches=rec.apply_patches)
    engine.update_weights({"version": 1})

    def broken(*args):
        raise RuntimeError("worker out of memory")

    # Patches fail part-way: the same call delivers the whole version instead.
    engine.update_weights({"version": 2}, apply_patches=broken, load_weights=rec.load_weights)
    assert engine.version == 2 and engine.last_error == ""
    assert rec.calls[-1][0] == "dense" and "out of memory" in engine.last_update["retried_full_after"]
    assert_state(rec, published[2], 2)

    # Both fail: raised, and the engine holds no known version (not the replica's 3).
    with pytest.raises(RuntimeError, match="out of memory"):
        engine.update_weights({"version": 3}, apply_patches=broken, load_weights=broken)
    assert engine.version == 0 and engine.replica.version == 3 and "out of memory" in engine.last_error
    engine.update_weights({"version": 4})
    assert rec.calls[-1][0] == "dense" and engine.version == 4
    assert_state(rec, published[4], 4)


def test_missing_version_and_bucket_are_errors(tmp_path):
    trained_bucket(tmp_path / "b", steps=2)
    rec = Recorder()
    with pytest.raises(ValueError, match="no bucket"):
        DeltaSyncEngine(load_weights=rec.load_weights).update_weights({"version": 1})
    engine = DeltaSyncEngine(str(tmp_path / "b"), load_weights=rec.load_weights, apply_patches=rec.apply_patches)
    with pytest.raises(deltasync.Error):
        engine.update_weights({"version": 9})
    assert rec.calls == []
    with pytest.raises(ValueError, match="no load_weights or apply_patches"):
        DeltaSyncEngine(str(tmp_path / "b")).update_weights({"version": 1})


def test_worker_extension_reports_the_engine(tmp_path):
    trained_bucket(tmp_path / "b", steps=2)

    class Worker(DeltaSyncWorkerExtension):  # vLLM mixes the extension into its worker class
        def __init__(self, engine):
            self.weight_transfer_engine = engine

    rec = Recorder()
    engine = DeltaSyncEngine(str(tmp_path / "b"), load_weights=rec.load_weights, apply_patches=rec.apply_patches)
    engine.update_weights({})
    status = Worker(engine).deltasync_status()
    assert status["backend"] == "deltasync" and status["version"] == 2
    assert Worker(None).deltasync_status() == {"backend": None}


def test_request_update_drives_the_control_plane():
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.path, json.loads(body)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            if self.path != "/collective_rpc":
                self.wfile.write(b"{}")
            elif json.loads(body)["method"] == "deltasync_newest":  # two TP workers seeing versions 6 and 7
                self.wfile.write(b'{"results": [{"version": 6}, {"version": 7}]}')
            else:  # deltasync_status: both hold the version asked last
                v = next(b["update_info"]["version"] for p, b in reversed(seen) if p == "/update_weights")
                self.wfile.write(json.dumps({"results": [{"version": v}, {"version": v}]}).encode())

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        request_update(url, 12, bucket="s3://b/run")
        assert seen == [("/pause?mode=wait&clear_cache=true", {}),  # as TRL: clears the prefix cache
                        ("/start_weight_update", {}),
                        ("/update_weights", {"update_info": {"version": 12, "bucket": "s3://b/run"}}),
                        ("/finish_weight_update", {}),
                        ("/collective_rpc", {"method": "deltasync_status"}),  # every worker holds 12
                        ("/resume", {})]
        seen.clear()
        request_update(url, pause=None)  # the newest: resolved once for every worker, then asked for by number
        assert [p for p, _ in seen] == ["/collective_rpc", "/start_weight_update", "/update_weights",
                                        "/finish_weight_update", "/collective_rpc"]
        assert seen[0][1] == {"method": "deltasync_newest", "kwargs": {"bucket": ""}}
        assert seen[2][1] == {"update_info": {"version": 7}}
    finally:
        server.shutdown()


def test_module_imports_without_vllm():
    code = "import sys, deltasync.vllm as m; print('vllm' in sys.modules, m.VLLM_VERSION)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    if importlib.util.find_spec("vllm") is None:
        assert out[0] == "False"
        with pytest.raises(ImportError):
            __import__("deltasync.vllm", fromlist=["x"]).DeltaSyncWeightTransferEngine  # noqa: B018
    assert out[1] == "0.33.0"


def test_real_vllm_factory_builds_and_runs_the_engine(tmp_path):
    """Where vLLM 0.33 is installed: the registered backend through vLLM's own factory and patch loader."""
    vllm = pytest.importorskip("vllm")
    if not vllm.__version__.startswith("0.33"):
        pytest.skip(f"written against vLLM 0.33.0, found {vllm.__version__}")
    import types

    import deltasync.vllm as dv
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    dv.register()
    published = trained_bucket(tmp_path / "b", steps=4)

    class Model(torch.nn.Module):  # a vLLM-style model: load_weights copies checkpoint tensors in
        def __init__(self):
            super().__init__()
            self.params = torch.nn.ParameterDict({n.replace(".", "_"): torch.nn.Parameter(
                torch.zeros(published[1][n].shape, dtype=torch.bfloat16), requires_grad=False) for n in published[1]})

        def load_weights(self, weights):
            loaded = set()
            for name, w in weights:
                self.params[name.replace(".", "_")].data.copy_(w.reshape(self.params[name.replace(".", "_")].shape))
                loaded.add(name)
            return loaded

    model = Model()
    cfg = types.SimpleNamespace(parallel_config=None, model_config=None)
    engine = WeightTransferEngineFactory.create_engine(WeightTransferConfig(backend="deltasync"), cfg,
                                                       torch.device("cpu"), model)
    engine.init_transfer_engine(engine.parse_init_info({"bucket": str(tmp_path / "b"), "layerwise_reload": False}))
    for v in range(1, 5):
        engine.start_weight_update()
        engine.update_weights({"version": v})
        engine.finish_weight_update()
        for name, want in published[v].items():
            got = model.params[name.replace(".", "_")].detach().view(torch.int16).reshape(-1).numpy()
            np.testing.assert_array_equal(got, want, err_msg=f"{name} at version {v}")
        assert engine.last_update["kind"] == ("dense" if v == 1 else "sparse_flat")
