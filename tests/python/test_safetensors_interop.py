"""Interop with the official `safetensors` package and TRL's patch layout.

Our files must load in `safetensors` (anchors, deltas, pulled states), and
files written in TRL's layout by `safetensors` must apply in deltasync. The
TRL layout is described in ../shared/reference/trl-wire-format.md.
"""
import json

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

BF16 = ml_dtypes.bfloat16
TRL_KEYS = {"format", "version", "sparse", "model_version", "num_changed_params",
            "total_changed_elements", "total_elements", "sparsity", "encoding"}


def make_weights(seed, shapes=None):
    rng = np.random.default_rng(seed)
    shapes = shapes or {"model.embed_tokens.weight": (300, 64), "model.layers.0.mlp.up_proj.weight": (128, 64),
                        "model.norm.weight": (64,)}
    return {name: (rng.normal(0, 0.02, shape) if len(shape) > 1 else np.ones(shape)).astype(np.float32)
            for name, shape in shapes.items()}


def nudge(weights, fraction, seed):
    """Moves about `fraction` of the elements by a tiny fp32 step, as AdamW does."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, w in weights.items():
        mask = rng.random(w.shape) < fraction
        step = np.abs(w).astype(np.float32) / 100 + 1e-6
        out[name] = np.where(mask, w + np.sign(rng.random(w.shape) - 0.5) * step, w).astype(np.float32)
    return out


def to_bf16_bits(w):
    # ml_dtypes rounds to nearest even, like PyTorch's CPU cast.
    return w.astype(BF16).view(np.uint16)


def gap_decode(gaps):
    return np.cumsum(gaps.astype(np.int64) + 1) - 1


@pytest.mark.parametrize("encoding", ["gap_delta", "raw"])
def test_our_delta_loads_in_safetensors_and_reconstructs(tmp_path, run, encoding):
    old, new = make_weights(1), nudge(make_weights(1), 0.05, 2)
    save_file(old, tmp_path / "old.safetensors")
    save_file(new, tmp_path / "new.safetensors")
    run("diff", tmp_path / "old.safetensors", tmp_path / "new.safetensors", "-o", tmp_path / "d.safetensors",
        "--encoding", encoding, "--version", 7)

    with safe_open(tmp_path / "d.safetensors", framework="np") as f:
        meta = f.metadata()
        assert TRL_KEYS <= set(meta)
        assert meta["format"] == "sparse_weight_patch"
        assert meta["sparse"] == "True"
        assert meta["encoding"] == encoding
        assert meta["model_version"] == "7"
        keys = set(f.keys())
        tensors = {k: f.get_tensor(k) for k in keys}
    total_changed = 0
    for name, w in old.items():
        expect_old, expect_new = to_bf16_bits(w), to_bf16_bits(new[name])
        changed = np.flatnonzero(expect_old.ravel() != expect_new.ravel())
        if len(changed) == 0:
            assert f"{name}.idx" not in keys
            continue
        idx, val = tensors[f"{name}.idx"], tensors[f"{name}.val"]
        assert val.dtype == BF16 and val.ndim == 1
        if encoding == "gap_delta":
            assert idx.dtype in (np.uint16, np.uint32)
            positions = gap_decode(idx)
        else:
            assert idx.dtype == np.int32
            positions = idx.astype(np.int64)
        np.testing.assert_array_equal(positions, changed)
        patched = expect_old.ravel().copy()
        patched[positions] = val.view(np.uint16)
        np.testing.assert_array_equal(patched, expect_new.ravel())
        total_changed += len(changed)
    assert meta["total_changed_elements"] == str(total_changed)
    assert meta["total_elements"] == str(sum(w.size for w in old.values()))


def write_trl_delta(path, old_bits, new_bits, encoding, layout="v3", model_version=2):
    """A delta as TRL writes it, using the safetensors package."""
    tensors, changed_total, params = {}, 0, []
    for name in sorted(old_bits):
        o, n = old_bits[name].ravel(), new_bits[name].ravel()
        idx = np.flatnonzero(o != n)
        if len(idx) == 0:
            continue
        params.append(name)
        changed_total += len(idx)
        vals = n[idx].view(BF16)
        if layout == "v1":
            tensors[f"{name}.indices"] = idx.astype(np.int32)
            tensors[f"{name}.values"] = vals
        elif encoding == "gap_delta":
            gaps = np.diff(idx, prepend=-1) - 1
            tensors[f"{name}.idx"] = gaps.astype(np.uint16 if gaps.max() <= 0xFFFF else np.uint32)
            tensors[f"{name}.val"] = vals
        else:
            tensors[f"{name}.idx"] = idx.astype(np.int32)
            tensors[f"{name}.val"] = vals
    total = sum(v.size for v in old_bits.values())
    meta = {"format": "sparse_weight_patch", "version": "1", "sparse": "True", "model_version": str(model_version),
            "num_changed_params": str(len(params)), "total_changed_elements": str(changed_total),
            "total_elements": str(total), "sparsity": str(1 - changed_total / total), "encoding": encoding}
    if layout == "v1":
        meta["changed_params"] = json.dumps(params)
    save_file(tensors, path, metadata=meta)


@pytest.mark.parametrize("encoding,layout", [("gap_delta", "v3"), ("raw", "v3"), ("raw", "v1")])
def test_trl_written_delta_applies_in_deltasync(tmp_path, run, encoding, layout):
    old = {k: to_bf16_bits(v) for k, v in make_weights(3).items()}
    new = {k: to_bf16_bits(v) for k, v in nudge(make_weights(3), 0.1, 4).items()}
    # One tensor with a gap above 65535 forces TRL's per-tensor uint32 fallback.
    big = np.zeros(70000, dtype=np.uint16)
    big_new = big.copy()
    big_new[[0, 69999]] = 0x3F80
    old["big"], new["big"] = big, big_new
    save_file({k: v.view(BF16) for k, v in old.items()}, tmp_path / "base.safetensors")
    write_trl_delta(tmp_path / "trl.safetensors", old, new, encoding, layout)
    if layout == "v3" and encoding == "gap_delta":
        with safe_open(tmp_path / "trl.safetensors", framework="np") as f:
            assert f.get_tensor("big.idx").dtype == np.uint32
    run("apply", tmp_path / "base.safetensors", tmp_path / "trl.safetensors", "-o", tmp_path / "out.safetensors")
    out = load_file(tmp_path / "out.safetensors")
    assert set(out) == set(new)
    for name, bits in new.items():
        np.testing.assert_array_equal(out[name].view(np.uint16).ravel(), bits.ravel(), err_msg=name)


def test_nvcomp_is_refused_clearly(tmp_path, run):
    old = {"w": to_bf16_bits(make_weights(5)["model.norm.weight"])}
    save_file({"w": old["w"].view(BF16)}, tmp_path / "base.safetensors")
    save_file({"w.idx": np.zeros(16, dtype=np.uint8), "w.val": np.ones(2, dtype=BF16)}, tmp_path / "nv.safetensors",
              metadata={"format": "sparse_weight_patch", "version": "1", "sparse": "True", "model_version": "2",
                        "encoding": "nvcomp_cascaded", "total_elements": "64"})
    proc = run("apply", tmp_path / "base.safetensors", tmp_path / "nv.safetensors", "-o", tmp_path / "out.safetensors",
               check=False)
    assert proc.returncode == 1
    assert "nvcomp" in proc.stderr.lower()
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out.safetensors").exists()


def test_bucket_publish_pull_roundtrip_loads_in_safetensors(tmp_path, run):
    bucket = tmp_path / "bucket"
    weights = make_weights(6)
    expected = {}
    for version in (1, 2, 4, 5):  # gaps are allowed
        if version > 1:
            weights = nudge(weights, 0.05, version)
        save_file(weights, tmp_path / f"ckpt{version}.safetensors")
        run("publish", bucket, tmp_path / f"ckpt{version}.safetensors", "--version", version, "--anchor-interval", 3,
            "--encoding", "gap_delta")  # TRL's objects and names
        expected[version] = {k: to_bf16_bits(v) for k, v in weights.items()}

    manifest = json.loads((bucket / "manifest.json").read_text())
    assert [v["version"] for v in manifest["versions"]] == [1, 2, 4, 5]
    assert (bucket / "anchors/step_000001.safetensors").exists()
    assert (bucket / "anchors/step_000004.safetensors").exists()  # crosses the multiple 3 of the interval
    assert (bucket / "deltas/step_000004.safetensors").exists()  # anchors get a delta too
    with safe_open(bucket / "anchors/step_000004.safetensors", framework="np") as f:
        assert f.metadata()["sparse"] == "False"
        for name, bits in expected[4].items():
            np.testing.assert_array_equal(f.get_tensor(name).view(np.uint16), bits)
    for version, bits in expected.items():
        run("pull", bucket, "-o", tmp_path / f"pulled{version}.safetensors", "--version", version)
        pulled = load_file(tmp_path / f"pulled{version}.safetensors")
        for name in bits:
            np.testing.assert_array_equal(pulled[name].view(np.uint16), bits[name], err_msg=f"v{version} {name}")


def test_republishing_an_old_version_fails(tmp_path, run):
    save_file(make_weights(7), tmp_path / "c.safetensors")
    run("publish", tmp_path / "b", tmp_path / "c.safetensors", "--version", 3)
    proc = run("publish", tmp_path / "b", tmp_path / "c.safetensors", "--version", 3, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("deltasync: error:")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_corrupt_input_is_one_line_error_and_usage_is_exit_2(tmp_path, run):
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 64)
    proc = run("inspect", tmp_path / "bad.safetensors", check=False)
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "bad.safetensors" in proc.stderr
    assert run("diff", check=False).returncode == 2
    assert run("frobnicate", check=False).returncode == 2


def test_inspect_json_reports_sparsity(tmp_path, run):
    old, new = make_weights(8), nudge(make_weights(8), 0.1, 9)
    save_file(old, tmp_path / "o.safetensors")
    save_file(new, tmp_path / "n.safetensors")
    run("diff", tmp_path / "o.safetensors", tmp_path / "n.safetensors", "-o", tmp_path / "d.safetensors")
    info = json.loads(run("inspect", tmp_path / "d.safetensors", "--json").stdout)
    changed = sum(int((to_bf16_bits(old[k]) != to_bf16_bits(new[k])).sum()) for k in old)
    assert info["kind"] == "delta"
    assert info["changed_elements"] == changed
    assert info["total_elements"] == sum(v.size for v in old.values())
    assert info["sparsity"] == pytest.approx(1 - changed / info["total_elements"])
    assert info["bytes_per_changed_element"] == pytest.approx(info["size_bytes"] / changed)
