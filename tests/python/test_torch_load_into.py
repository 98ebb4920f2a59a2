"""deltasync.torch on the replica's side: tensors() views and load_into()."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import deltasync  # noqa: E402
import deltasync.torch as dt  # noqa: E402

SHAPES = {"model.embed.weight": (200, 32), "model.layers.0.mlp.up.weight": (64, 32),
          "model.layers.0.mlp.up.bias": (64,), "model.norm.weight": (32,)}


def weights(seed):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) * 0.02 for n, s in SHAPES.items()}


def adam_like(w, step):
    """Moves every fp32 master by ~3e-6 (what AdamW at lr 3e-6 does), so a few % of bf16 values change."""
    g = torch.Generator().manual_seed(100 + step)
    return {n: t + 3e-6 * torch.sign(torch.randn(t.shape, generator=g)) for n, t in w.items()}


def bf16_bits(t):
    return t.detach().to(torch.bfloat16).view(torch.int16).reshape(-1).cpu().numpy()


def target_dict(dtype=torch.bfloat16, prefix=""):
    return {prefix + n: torch.zeros(s, dtype=dtype) for n, s in SHAPES.items()}


def assert_loaded(sd, replica, prefix=""):
    for name, a in replica.tensors().items():
        np.testing.assert_array_equal(bf16_bits(sd[prefix + name]), np.ascontiguousarray(a).view(np.int16).reshape(-1),
                                      err_msg=name)


@pytest.fixture
def history(tmp_path):
    """A bucket with 6 versions; returns (bucket, {version: {name: bf16 bits}})."""
    bucket = str(tmp_path / "bucket")
    pub = deltasync.Publisher(bucket, anchor_interval=4)
    w = weights(0)
    bits = {}
    for v in range(1, 7):
        dt.publish(pub, v, w)
        bits[v] = {n: bf16_bits(t) for n, t in w.items()}
        w = adam_like(w, v)
    pub.close()
    return bucket, bits


def changed_between(bits, a, b):
    """Elements that changed in some delta from a to b (the union over the steps)."""
    n = 0
    for name in bits[a]:
        mask = np.zeros_like(bits[a][name], dtype=bool)
        for v in range(a + 1, b + 1):
            mask |= bits[v][name] != bits[v - 1][name]
        n += int(mask.sum())
    return n


def test_first_load_copies_everything_then_only_changed_elements(history):
    bucket, bits = history
    total = sum(int(np.prod(s)) for s in SHAPES.values())
    replica = deltasync.Replica(bucket)
    replica.update(1)
    sd = target_dict()
    assert dt.load_into(replica, sd) == total
    assert_loaded(sd, replica)

    replica.update(2)
    n = dt.load_into(replica, sd)
    assert n == changed_between(bits, 1, 2)
    assert 0 < n < total // 5
    assert_loaded(sd, replica)

    # Several versions at once (across the anchor at 4): the union of their changes.
    replica.update(5)
    n = dt.load_into(replica, sd)
    assert n == changed_between(bits, 2, 5)
    assert_loaded(sd, replica)

    # Nothing new: nothing copied.
    assert dt.load_into(replica, sd) == 0

    # Other target tensors: everything again.
    sd2 = target_dict()
    assert dt.load_into(replica, sd2) == total
    assert_loaded(sd2, replica)
    replica.update(6)
    assert dt.load_into(replica, sd2) == changed_between(bits, 5, 6)
    assert_loaded(sd2, replica)


def test_model_state_dict_with_module_prefix(history):
    bucket, _ = history

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for n, s in SHAPES.items():
                self.register_parameter(n.replace(".", "_"), torch.nn.Parameter(torch.zeros(s, dtype=torch.bfloat16)))

    replica = deltasync.Replica(bucket)
    replica.update(3)
    m = M()
    params = dict(m.named_parameters())
    sd = {"module." + n: params[n.replace(".", "_")] for n in SHAPES}  # a DDP-style state dict
    dt.load_into(replica, sd)
    assert_loaded(sd, replica, prefix="module.")
    replica.update()
    dt.load_into(replica, sd)
    assert_loaded(sd, replica, prefix="module.")


def test_non_contiguous_target(history):
    bucket, bits = history
    replica = deltasync.Replica(bucket)
    replica.update(1)
    name = "model.layers.0.mlp.up.weight"
    sd = target_dict()
    sd[name] = torch.zeros(SHAPES[name][::-1], dtype=torch.bfloat16).t()
    assert not sd[name].is_contiguous()
    dt.load_into(replica, sd)
    replica.update(3)
    assert dt.load_into(replica, sd) == changed_between(bits, 1, 3)
    assert_loaded(sd, replica)


def test_mismatches_are_refused_before_anything_is_copied(history):
    bucket, bits = history
    replica = deltasync.Replica(bucket)
    with pytest.raises(deltasync.FailedPreconditionError, match="update"):
        dt.load_into(replica, target_dict())
    replica.update(1)
    sd = target_dict()
    dt.load_into(replica, sd)
    replica.update(2)

    bad = target_dict(dtype=torch.float32)
    with pytest.raises(deltasync.InvalidArgumentError, match=r"model\.embed\.weight.*dtype"):
        dt.load_into(replica, bad)
    bad = target_dict()
    bad["model.norm.weight"] = torch.zeros(33, dtype=torch.bfloat16)
    with pytest.raises(deltasync.InvalidArgumentError, match=r"model\.norm\.weight.*shape"):
        dt.load_into(replica, bad)
    bad = target_dict()
    del bad["model.norm.weight"]
    with pytest.raises(ValueError, match=r"model\.norm\.weight has no target"):
        dt.load_into(replica, bad)
    # The refused calls consumed nothing: the changes since version 1 are still there.
    assert dt.load_into(replica, sd) == changed_between(bits, 1, 2)
    assert_loaded(sd, replica)


def test_tensors_share_the_replica_memory(history):
    bucket, bits = history
    replica = deltasync.Replica(bucket)
    replica.update(1)
    views = dt.tensors(replica)
    arrays = replica.tensors()
    for name, t in views.items():
        assert t.dtype == torch.bfloat16
        assert t.shape == tuple(SHAPES[name])
        assert t.data_ptr() == arrays[name].__array_interface__["data"][0]
        np.testing.assert_array_equal(t.view(torch.int16).reshape(-1).numpy(), bits[1][name])
    replica.update(4)
    for name, t in views.items():  # same memory, new contents
        np.testing.assert_array_equal(t.view(torch.int16).reshape(-1).numpy(), bits[4][name])


def test_replica_load_into_method_delegates(history):
    bucket, bits = history
    replica = deltasync.Replica(bucket)
    if not hasattr(replica, "load_into"):
        pytest.fail("deltasync.Replica.load_into is missing (it delegates to deltasync.torch.load_into)")
    replica.update(2)
    sd = target_dict()
    assert replica.load_into(sd) == sum(int(np.prod(s)) for s in SHAPES.values())
    replica.update(3)
    assert replica.load_into(sd) == changed_between(bits, 2, 3)
    assert_loaded(sd, replica)
