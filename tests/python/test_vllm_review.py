"""Session 49's adversarial review of the vLLM delivery path (no vLLM: the engine with callbacks).

Each test is a way a delivery could go silently wrong that the review looked for:

- TP workers that resolve "the newest version" each on their own while the trainer publishes
  (``update_llm(version=None)``): the ranks would hold different versions, and nothing said so;
- a node follower's region replaced under the engine by a daemon of another bucket whose
  version numbers continue the engine's (the change lists start at "the engine's version",
  but of another run): applied as a sparse move, the engine would hold neither run's state;
- an older version after a newer one, and the same version twice (these hold).
"""
import contextlib
import subprocess
import time
import uuid

import pytest

torch = pytest.importorskip("torch")
import deltasync  # noqa: E402
import deltasync.torch as dt  # noqa: E402
from deltasync._shm import Region  # noqa: E402
from deltasync.vllm import (  # noqa: E402
    DeltaSyncEngine,
    DeltaSyncWorkerExtension,
    apply_patches_to_state_dict,
    update_llm,
)


def versions(seed, n):
    """{version: {name: bf16 tensor}}: n versions, each moving a few elements."""
    g = torch.Generator().manual_seed(seed)
    s = {"a.weight": torch.randn(64, 48, generator=g).to(torch.bfloat16),
         "b.bias": torch.randn(300, generator=g).to(torch.bfloat16)}
    out = {1: {k: t.clone() for k, t in s.items()}}
    for v in range(2, n + 1):
        flat = s["a.weight"].view(-1)
        idx = torch.randint(0, flat.numel(), (40,), generator=g)
        flat[idx] = (flat[idx].float() + 0.5).to(torch.bfloat16)
        s["b.bias"][v] = float(v)
        out[v] = {k: t.clone() for k, t in s.items()}
    return out


class State:
    """The engine's callbacks into a plain bf16 state."""

    def __init__(self):
        self.state = {}

    def load_weights(self, weights):
        for name, t in weights:
            self.state[name] = t.detach().clone()

    def apply_patches(self, patches):
        for p in patches:
            self.state.setdefault(p.name, torch.full(p.full_shape, float("nan"), dtype=torch.bfloat16))
        apply_patches_to_state_dict(self.state, patches)

    def equals(self, want):
        return set(self.state) == set(want) and all(
            torch.equal(self.state[n].view(torch.int16), want[n].view(torch.int16)) for n in want)


# --- TP workers and "the newest version" --------------------------------------------------------
class FakeWorker(DeltaSyncWorkerExtension):
    """What vLLM's worker gives the extension: the engine and the three weight-update calls."""

    def __init__(self, bucket):
        self.held = State()
        self.weight_transfer_engine = DeltaSyncEngine(bucket, load_weights=self.held.load_weights,
                                                      apply_patches=self.held.apply_patches)

    def start_weight_update(self):
        pass

    def update_weights(self, update_info):
        self.weight_transfer_engine.update_weights(update_info)

    def finish_weight_update(self):
        pass


class FakeLLM:
    """vllm.LLM's collective_rpc over TP workers, one after the other; ``between(method)`` runs
    after the first worker answered (the trainer publishing meanwhile)."""

    def __init__(self, workers, between=None):
        self.workers, self.between, self.calls = workers, between, []

    def collective_rpc(self, method, args=(), kwargs=None):
        self.calls.append(method)
        out = []
        for i, w in enumerate(self.workers):
            if i == 1 and self.between is not None:
                self.between(method)
            out.append(getattr(w, method)(*args, **(kwargs or {})))
        return out

    def reset_prefix_cache(self):
        pass


def test_update_llm_newest_moves_every_tp_rank_to_one_version(bucket):
    states = versions(1, 4)
    pub = deltasync.Publisher(bucket)
    for v in (1, 2):
        dt.publish(pub, v, states[v])
    published = [2]

    def publish_next(method):  # the trainer publishes while the ranks answer, once per call
        if published[-1] < 4:
            published.append(published[-1] + 1)
            dt.publish(pub, published[-1], states[published[-1]])

    workers = [FakeWorker(bucket), FakeWorker(bucket)]
    llm = FakeLLM(workers, between=publish_next)
    try:
        status = update_llm(llm)  # "the newest": the ranks must agree on which
        held = [s["version"] for s in status]
        assert held[0] == held[1], f"TP ranks hold different versions after update_llm(): {held}"
        for w in workers:
            assert w.held.equals(states[held[0]]), "a rank's weights are not its reported version's"
        llm.between = None
        status = update_llm(llm, 4)
        assert [s["version"] for s in status] == [4, 4]
        assert all(w.held.equals(states[4]) for w in workers)
    finally:
        pub.close()


# --- the node follower's region replaced under the engine --------------------------------------
@contextlib.contextmanager
def serving(deltasync_bin, bucket, name):
    proc = subprocess.Popen([deltasync_bin, "serve", bucket, "--shm", name, "--listen", "127.0.0.1:0",
                             "--poll", "0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(30)


def wait_region(name, version, proc, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, "serve exited"
        try:
            r = Region(name)
            if r.version == version and r._seq() % 2 == 0:
                return r
        except deltasync.NotFoundError:
            pass
        time.sleep(0.05)
    pytest.fail(f"the region never held version {version}")


def test_region_of_another_bucket_under_the_same_name_is_not_applied_as_a_move(deltasync_bin, tmp_path):
    """Daemon A (bucket A) feeds the engine versions 1 and 2, then stops; daemon B (bucket B, another
    run with the same tensors) takes the name, first at its version 2, then at 3 as a move from 2.
    The engine holds A's 2; B's change lists "from 2" are not a move from what it holds."""
    name = f"ds-review-{uuid.uuid4().hex[:8]}"
    a, b = versions(1, 3), versions(2, 3)
    pub_a, pub_b = deltasync.Publisher(str(tmp_path / "a")), deltasync.Publisher(str(tmp_path / "b"))
    try:
        held = State()
        engine = DeltaSyncEngine(str(tmp_path / "a"), load_weights=held.load_weights,
                                 apply_patches=held.apply_patches)
        engine.init_transfer_engine(engine.parse_init_info({"bucket": str(tmp_path / "a"), "shm": name,
                                                            "shm_wait_s": 20}))
        with serving(deltasync_bin, str(tmp_path / "a"), name) as proc:
            for v in (1, 2):
                dt.publish(pub_a, v, a[v])
                wait_region(name, v, proc)
                engine.update_weights({"version": v})
                assert held.equals(a[v]) and engine.version == v
            assert engine.last_update["kind"] == "sparse_flat"
        for v in (1, 2):
            dt.publish(pub_b, v, b[v])
        with serving(deltasync_bin, str(tmp_path / "b"), name) as proc:
            wait_region(name, 2, proc)
            dt.publish(pub_b, 3, b[3])
            region = wait_region(name, 3, proc)
            assert region.base_version == 2 and region.changes_complete  # B's move 2 -> 3
            engine.update_weights({"version": 3})
            assert engine.version == 3
            assert held.equals(b[3]), "B's move 2 -> 3 applied to A's version 2: neither run's weights"
    finally:
        pub_a.close()
        pub_b.close()


# --- an older version after a newer one, and the same version twice (what holds) ----------------
def test_an_older_version_after_a_newer_one_and_the_same_version_twice(tmp_path):
    states = versions(3, 5)
    pub = deltasync.Publisher(str(tmp_path / "b"), anchor_interval=3)
    for v in range(1, 6):
        dt.publish(pub, v, states[v])
    pub.close()
    held = State()
    engine = DeltaSyncEngine(str(tmp_path / "b"), load_weights=held.load_weights, apply_patches=held.apply_patches)
    engine.update_weights({"version": 4})
    assert held.equals(states[4]) and engine.version == 4
    engine.update_weights({"version": 4})  # again: nothing moves, nothing is delivered
    assert held.equals(states[4]) and engine.version == 4 and engine.last_update["elements"] == 0
    with pytest.raises(deltasync.Error, match="only move forward"):  # back: refused, untouched
        engine.update_weights({"version": 2})
    assert engine.version == 4 and held.equals(states[4]) and "older" in engine.last_error
    engine.update_weights({"version": 5})
    assert held.equals(states[5]) and engine.version == 5


# --- request_update: every worker must report the version afterwards ----------------------------
def test_request_update_raises_when_a_worker_does_not_hold_the_version():
    """A server whose three weight-update routes answer 200 while one TP rank did not move (vLLM's
    executor reports a rank's failure one call late once its replies are out of step)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from deltasync.vllm import request_update

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            if self.path == "/collective_rpc" and body["method"] == "deltasync_status":
                self.wfile.write(b'{"results": [{"version": 5}, {"version": 0}]}')  # rank 1 failed
            else:
                self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RuntimeError, match=r"hold versions \[5, 0\]"):
            request_update(f"http://127.0.0.1:{server.server_port}", 5)
        assert seen[-1] == "/resume"  # resumed whatever happened
    finally:
        server.shutdown()
