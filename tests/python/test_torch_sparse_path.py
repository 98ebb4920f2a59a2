"""The device-side change path (DeviceTracker), run on CPU tensors, against the dense path.

On a GPU the tracker keeps its bf16 snapshot on the device and sends only
changed elements over PCIe; the code is the same for any device, so running
it with CPU tensors checks it bit for bit against Publisher.publish.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import deltasync  # noqa: E402
import deltasync.torch as dt  # noqa: E402


def versions(n):
    """n successive weight sets with the awkward cases in them."""
    g = torch.Generator().manual_seed(7)
    w = {
        "model.embed_tokens.weight": torch.randn(300, 40, generator=g) * 0.02,
        "model.layers.0.self_attn.q_proj.weight": torch.randn(40, 40, generator=g) * 0.02,
        "model.layers.0.input_layernorm.weight": torch.ones(40),
        "model.layers.0.mlp.gate.e_score_correction_bias": torch.randn(8, generator=g),  # published as fp32
        "model.bf16_param": (torch.randn(16, 16, generator=g) * 0.02).to(torch.bfloat16),  # published as bf16
        "model.frozen": torch.randn(10, generator=g),  # never changes
        "model.signed_zero": torch.zeros(6),  # flips between 0.0 and -0.0: a bit change
    }
    out = []
    for v in range(n):
        out.append({k: t.clone() for k, t in w.items()})
        nxt = {}
        for k, t in w.items():
            if k == "model.frozen":
                nxt[k] = t
            elif k == "model.signed_zero":
                nxt[k] = -t
            elif t.dtype == torch.bfloat16:
                mask = torch.rand(t.shape, generator=g) < 0.05
                nxt[k] = torch.where(mask, (t.float() * 1.01).to(torch.bfloat16), t)
            else:
                nxt[k] = t + 3e-6 * torch.sign(torch.randn(t.shape, generator=g))
        w = nxt
    return out


def state_bits(publisher):
    return {n: np.ascontiguousarray(a).view(np.uint8).copy() for n, a in publisher.state_tensors().items()}


@pytest.mark.parametrize("background", [False, True])
def test_sparse_path_equals_dense_path(tmp_path, background):
    dense = deltasync.Publisher(str(tmp_path / "dense"), anchor_interval=4)
    sparse = deltasync.Publisher(str(tmp_path / "sparse"), anchor_interval=4)
    tracker = dt.DeviceTracker()
    seen_changes = False
    for v, w in enumerate(versions(7), start=1):
        a = dt.publish(dense, v, w, sparse=False)
        b = tracker.publish(sparse, v, w, background=background)
        if background:
            b = b.result()
        assert a.version == b.version == v
        assert a.state_hash == b.state_hash, f"version {v}"
        assert a.changed_elements == b.changed_elements, f"version {v}"
        assert (a.wrote_anchor, a.wrote_delta) == (b.wrote_anchor, b.wrote_delta)
        if v > 1:
            seen_changes = True
            assert 0 < b.changed_elements < b.total_elements // 5
        sa, sb = state_bits(dense), state_bits(sparse)
        assert sa.keys() == sb.keys()
        for name in sa:
            np.testing.assert_array_equal(sa[name], sb[name], err_msg=f"{name} at version {v}")
    assert seen_changes
    sparse.close()
    assert sparse.state_tensors()["model.layers.0.mlp.gate.e_score_correction_bias"].dtype == np.float32
    # The sparse bucket replays bit-exactly on a replica.
    replica = deltasync.Replica(str(tmp_path / "sparse"))
    replica.update()
    assert replica.state_hash == a.state_hash
    for name, arr in replica.tensors().items():
        np.testing.assert_array_equal(np.ascontiguousarray(arr).view(np.uint8), state_bits(dense)[name], err_msg=name)


def test_signed_zero_flip_is_a_change(tmp_path):
    pub = deltasync.Publisher(str(tmp_path / "b"))
    tracker = dt.DeviceTracker()
    tracker.publish(pub, 1, {"z": torch.zeros(4)})
    res = tracker.publish(pub, 2, {"z": torch.tensor([0.0, -0.0, 0.0, -0.0])})
    assert res.changed_elements == 2
    assert list(pub.state_tensors()["z"].view(np.uint16)) == [0, 0x8000, 0, 0x8000]


def test_tracker_recovers_after_a_refused_version(tmp_path):
    ws = versions(4)
    pub = deltasync.Publisher(str(tmp_path / "b"))
    ref = deltasync.Publisher(str(tmp_path / "ref"))
    tracker = dt.DeviceTracker()
    tracker.publish(pub, 1, ws[0])
    dt.publish(ref, 1, ws[0])
    tracker.publish(pub, 2, ws[1])
    dt.publish(ref, 2, ws[1])
    # Version 2 again: refused, after the tracker already moved its snapshot to ws[2].
    with pytest.raises(deltasync.InvalidArgumentError):
        tracker.publish(pub, 2, ws[2])
    # The next version must still carry every change from the published state.
    a = tracker.publish(pub, 3, ws[2])
    b = dt.publish(ref, 3, ws[2])
    assert a.state_hash == b.state_hash
    assert a.changed_elements == b.changed_elements


def test_tracker_refuses_a_changed_tensor_set(tmp_path):
    ws = versions(2)
    pub = deltasync.Publisher(str(tmp_path / "b"))
    tracker = dt.DeviceTracker()
    tracker.publish(pub, 1, ws[0])
    partial = dict(ws[1])
    del partial["model.frozen"]
    with pytest.raises(deltasync.InvalidArgumentError, match="model.frozen"):
        tracker.publish(pub, 2, partial)
    wrong = dict(ws[1])
    wrong["model.frozen"] = torch.zeros(11)
    with pytest.raises(deltasync.InvalidArgumentError, match=r"model\.frozen: shape"):
        tracker.publish(pub, 2, wrong)
    assert tracker.publish(pub, 2, ws[1]).version == 2
