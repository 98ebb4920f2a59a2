"""deltasync.torch on the trainer's side: attach() to an optimizer, to_publishable, publish.

Every check compares bit patterns: what a replica holds must equal the
model's fp32 parameters cast to bf16 by PyTorch (round to nearest even).
"""
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import deltasync  # noqa: E402
import deltasync.torch as dt  # noqa: E402

LR = 3e-6


class Tiny(torch.nn.Module):
    def __init__(self, vocab=64, dim=48):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.up = torch.nn.Linear(dim, 2 * dim)
        self.down = torch.nn.Linear(2 * dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def forward(self, x):
        h = self.embed(x)
        h = h + self.down(torch.nn.functional.gelu(self.up(h)))
        return self.head(self.norm(h))


def make(seed=0):
    torch.manual_seed(seed)
    model = Tiny()
    return model, torch.optim.AdamW(model.parameters(), lr=LR)


def train_step(model, opt, step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, 64, (8, 12), generator=g)
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), x.roll(1, dims=1).reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()


def bits(t):
    """bf16 bit patterns of a torch tensor cast like PyTorch's CPU cast (RNE)."""
    return t.detach().to(torch.bfloat16).view(torch.int16).numpy().reshape(-1)


def replica_bits(replica):
    return {name: np.ascontiguousarray(a).view(np.int16).reshape(-1) for name, a in replica.tensors().items()}


def expected_bits(model, strip=""):
    return {name[len(strip):] if name.startswith(strip) else name: bits(p) for name, p in model.named_parameters()}


def assert_same(got, want):
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("background", [True, False])
@pytest.mark.parametrize("sparse", [None, True])
def test_attach_publishes_every_step_bit_exact(tmp_path, background, sparse):
    model, opt = make()
    bucket = str(tmp_path / "bucket")
    publisher = deltasync.Publisher(bucket, anchor_interval=3)
    handle = dt.attach(model, opt, publisher, background=background, sparse=sparse)
    replica = deltasync.Replica(bucket)
    changed_total = 0
    prev = None
    for step in range(5):
        train_step(model, opt, step)
        handle.flush()
        assert publisher.latest_version == step + 1
        assert replica.update() == step + 1
        want = expected_bits(model)
        assert_same(replica_bits(replica), want)
        if prev is not None:
            changed_total += sum(int((want[n] != prev[n]).sum()) for n in want)
        prev = want
    # lr 3e-6 moves some bf16 values every step, but far from all.
    total = sum(p.numel() for p in model.parameters())
    assert 0 < changed_total < 4 * total * 0.5
    handle.remove()
    train_step(model, opt, 99)
    handle.flush()
    assert publisher.latest_version == 5  # no hook any more
    publisher.close()


def test_attach_start_version_and_result(tmp_path):
    model, opt = make(1)
    publisher = deltasync.Publisher(str(tmp_path / "b"), anchor_interval=10)
    handle = dt.attach(model, opt, publisher, start_version=7, background=False)
    train_step(model, opt, 0)
    res = handle.last_result
    assert res.version == 7 and res.wrote_anchor
    train_step(model, opt, 1)
    res = handle.last_result
    assert res.version == 8 and res.wrote_delta and not res.wrote_anchor
    assert res.total_elements == sum(p.numel() for p in model.parameters())
    assert handle.next_version == 9


def test_ddp_module_prefix_is_stripped(tmp_path):
    class Wrapper(torch.nn.Module):  # what DDP/Accelerate look like: the model under .module
        def __init__(self, inner):
            super().__init__()
            self.module = inner

    model, _ = make(2)
    wrapped = Wrapper(model)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=LR)
    assert all(n.startswith("module.") for n, _ in wrapped.named_parameters())
    bucket = str(tmp_path / "b")
    publisher = deltasync.Publisher(bucket)
    handle = dt.attach(wrapped, opt, publisher)
    assert sorted(handle.names) == sorted(n for n, _ in model.named_parameters())
    for step in range(2):
        train_step(model, opt, step)
    handle.flush()
    publisher.close()
    replica = deltasync.Replica(bucket)
    replica.update()
    assert_same(replica_bits(replica), expected_bits(wrapped, strip="module."))



def test_compiled_and_checkpointed_layers_publish_their_checkpoint_names(tmp_path):
    # torchtitan-style: each block wrapped for activation checkpointing and compiled on its own
    # puts "_checkpoint_wrapped_module." and "_orig_mod." inside the names (session 51, H1: they
    # were published as they are, names no checkpoint and no vLLM model has).
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    model, _ = make(2)
    plain = sorted(n for n, _ in model.named_parameters())
    model.up = checkpoint_wrapper(model.up)
    model.down = torch.compile(checkpoint_wrapper(model.down))
    wrapped = torch.compile(model)
    raw = sorted(n for n, _ in wrapped.named_parameters())
    assert "_orig_mod.down._orig_mod._checkpoint_wrapped_module.weight" in raw
    opt = torch.optim.AdamW(wrapped.parameters(), lr=LR)
    bucket = str(tmp_path / "b")
    publisher = deltasync.Publisher(bucket)
    handle = dt.attach(wrapped, opt, publisher)
    assert sorted(handle.names) == plain
    publisher.close()
    assert dt.strip_wrapper_prefix("_orig_mod.module.layers.0._orig_mod.w") == "layers.0.w"
    assert dt.strip_wrapper_prefix("encoder.module.w") == "encoder.module.w"  # a submodule named "module"
    assert dt.strip_wrapper_prefix("x_orig_mod.w") == "x_orig_mod.w"

def test_names_mapping_and_exclusion(tmp_path):
    model, opt = make(3)
    publisher = deltasync.Publisher(str(tmp_path / "b"))

    def rename(name):
        return None if name.startswith("norm.") else "model." + name

    dt.attach(model, opt, publisher, names=rename, background=False)
    train_step(model, opt, 0)
    published = set(publisher.state_tensors())
    assert published == {"model." + n for n, _ in model.named_parameters() if not n.startswith("norm.")}

    # A mapping renames what it lists, drops what maps to None, keeps the rest.
    model2, opt2 = make(3)
    handle2 = dt.attach(model2, opt2, deltasync.Publisher(str(tmp_path / "b2")),
                        names={"head.weight": "lm_head.weight", "norm.bias": None}, background=False)
    names = set(handle2.names)
    assert "lm_head.weight" in names and "head.weight" not in names and "norm.bias" not in names
    assert "embed.weight" in names and len(names) == len(list(model2.parameters())) - 1


def test_optimizer_params_must_belong_to_the_model(tmp_path):
    model, _ = make(4)
    other, opt = make(5)
    publisher = deltasync.Publisher(str(tmp_path / "b"))
    with pytest.raises(deltasync.InvalidArgumentError, match="not a parameter of the model"):
        dt.attach(model, opt, publisher)


def test_to_publishable_is_zero_copy_and_refuses_non_contiguous():
    w = torch.randn(8, 6)
    b = torch.randn(5).to(torch.bfloat16)
    out = dt.to_publishable({"w": w, "b": b})
    assert out["w"].dtype == np.float32 and np.shares_memory(out["w"], w.numpy())
    assert out["b"].dtype.name == "bfloat16"
    assert out["b"].__array_interface__["data"][0] == b.data_ptr()
    t = w.t()
    assert not t.is_contiguous()
    with pytest.raises(deltasync.InvalidArgumentError, match=r"tensor w\.T is not contiguous"):
        dt.to_publishable({"w.T": t})
    copied = dt.to_publishable({"w.T": t}, contiguous=True)["w.T"]
    np.testing.assert_array_equal(copied, t.numpy())
    with pytest.raises(deltasync.InvalidArgumentError, match="cannot be published"):
        dt.to_publishable({"c": torch.zeros(2, dtype=torch.complex64)})


def test_non_contiguous_parameter_is_published_from_a_copy(tmp_path):
    # A parameter stored transposed: publish() refuses it, the background
    # path (which snapshots anyway) and contiguous=True both handle it.
    w = torch.nn.Parameter(torch.randn(16, 8).t())
    assert not w.is_contiguous()
    bucket = str(tmp_path / "b")
    publisher = deltasync.Publisher(bucket)
    with pytest.raises(deltasync.InvalidArgumentError, match="not contiguous"):
        dt.publish(publisher, 1, {"w": w})
    dt.publish(publisher, 1, {"w": w}, background=True).result()
    publisher.close()
    replica = deltasync.Replica(bucket)
    replica.update()
    np.testing.assert_array_equal(replica_bits(replica)["w"], bits(w))


@pytest.mark.parametrize("sparse", [False, True])
def test_publish_bf16_and_fp32_kept_suffix(tmp_path, sparse):
    # bf16 parameters publish as they are; an fp32 MoE correction bias stays fp32.
    bucket = str(tmp_path / "b")
    publisher = deltasync.Publisher(bucket)
    t = {"w": torch.randn(32, 4).to(torch.bfloat16), "gate.e_score_correction_bias": torch.randn(4)}
    for v in (1, 2, 3):
        dt.publish(publisher, v, t, sparse=sparse)
        state = publisher.state_tensors()
        assert state["gate.e_score_correction_bias"].dtype == np.float32
        np.testing.assert_array_equal(state["gate.e_score_correction_bias"], t["gate.e_score_correction_bias"].numpy())
        np.testing.assert_array_equal(state["w"].view(np.int16).reshape(-1), t["w"].view(torch.int16).numpy().reshape(-1))
        t = {k: (x + 1e-3 * torch.randn_like(x.float())).to(x.dtype) for k, x in t.items()}


def test_attach_on_a_bucket_with_versions_continues_its_numbering(tmp_path):
    # A restarted trainer: the bucket already holds versions 1-3.
    bucket = str(tmp_path / "b")
    model, opt = make(6)
    first = deltasync.Publisher(bucket)
    old = dt.attach(model, opt, first, background=False)
    for step in range(3):
        train_step(model, opt, step)
    old.remove()
    first.close()

    publisher = deltasync.Publisher(bucket)
    handle = dt.attach(model, opt, publisher)
    assert handle.next_version == 4
    train_step(model, opt, 3)
    handle.flush()
    assert publisher.latest_version == 4
    replica = deltasync.Replica(bucket)
    assert replica.update() == 4
    assert_same(replica_bits(replica), expected_bits(model))
    with pytest.raises(deltasync.InvalidArgumentError, match="already holds version 4; leave start_version out"):
        dt.attach(model, opt, publisher, start_version=2)
    handle.remove()
    publisher.close()


def test_background_failure_is_raised_at_the_next_step(tmp_path):
    model, opt = make(7)
    bucket = tmp_path / "b"
    publisher = deltasync.Publisher(str(bucket))
    handle = dt.attach(model, opt, publisher)  # background
    train_step(model, opt, 0)
    handle.flush()
    # Make the bucket unwritable: the next background publish fails.
    (bucket / "manifest.json").unlink()
    (bucket / "manifest.json").mkdir()
    train_step(model, opt, 1)  # queues version 2, which fails in the background
    while publisher.pending:
        time.sleep(0.01)
    with pytest.raises(deltasync.Error):
        train_step(model, opt, 2)  # the step that follows raises it
    assert handle.next_version == 3
    (bucket / "manifest.json").rmdir()
    handle.remove()
    publisher.close()
