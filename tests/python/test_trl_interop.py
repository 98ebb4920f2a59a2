"""TRL interop from Python: deltasync buckets read by TRL's reader, TRL files applied by deltasync.

TRL's side is re-implemented here from its wire format
(../shared/reference/trl-wire-format.md; TRL's delta_engine.iter_sparse_patches
and gap_delta_decode) with only the official safetensors package and numpy:
an anchor is one full bf16 tensor per parameter; a delta holds {name}.idx
(encoded flat indices) and {name}.val (absolute bf16 values); gap_delta
indices are uint16 gaps, uint32 for a parameter whose gaps do not fit;
decode is cumsum(g + 1) - 1.
"""
import json

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

torch = pytest.importorskip("torch")
import deltasync  # noqa: E402
import deltasync.torch as dt  # noqa: E402

BF16 = ml_dtypes.bfloat16
LR = 3e-6


# --- TRL's reader, re-implemented --------------------------------------------------------------

def trl_decode_idx(raw, encoding):
    if encoding == "raw":
        assert raw.dtype == np.int32
        return raw.astype(np.int64)
    if encoding == "gap_delta":
        assert raw.dtype in (np.uint16, np.uint32), raw.dtype  # the dtype is the width
        return np.cumsum(raw.astype(np.int64) + 1) - 1
    raise AssertionError(f"TRL's reader without nvCOMP cannot decode {encoding}")


def trl_read(path):
    """(metadata, {name: full bf16 array}) for an anchor; (metadata, {name: (idx, val)}) for a delta."""
    with safe_open(str(path), framework="np") as f:
        meta = f.metadata()
        keys = list(f.keys())
        assert meta["format"] == "sparse_weight_patch" and meta["version"] == "1"
        if meta["sparse"] == "False":
            return meta, {k: f.get_tensor(k) for k in keys}
        assert meta["sparse"] == "True"
        names = sorted({k[: -len(".val")] for k in keys if k.endswith(".val")})
        out = {}
        for name in names:
            val = f.get_tensor(f"{name}.val")
            assert val.dtype == BF16 and val.ndim == 1
            out[name] = (trl_decode_idx(f.get_tensor(f"{name}.idx"), meta["encoding"]), val)
        return meta, out


def trl_apply(state, patch):
    for name, (idx, val) in patch.items():
        flat = state[name].reshape(-1)
        flat[idx] = val  # absolute values: set, not add


# --- a trainer ---------------------------------------------------------------------------------

def train(steps, publisher=None):
    """Tiny model + a sparse 'router' weight whose changes are far apart (forcing uint32 gaps)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 24), torch.nn.Linear(24, 50))
    far = torch.nn.Parameter(torch.zeros(200_000))
    opt = torch.optim.AdamW(list(model.parameters()), lr=LR)
    states = {}
    for step in range(1, steps + 1):
        x = torch.randint(0, 50, (32,), generator=torch.Generator().manual_seed(step))
        loss = torch.nn.functional.cross_entropy(model(x), (x * 7) % 50)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():  # two changes 150000 elements apart: a gap no uint16 holds
            far[(step * 13) % 1000] += 0.5
            far[150_000 + step] -= 0.25
        tensors = {n: p for n, p in model.named_parameters()}
        tensors["router.far"] = far
        if publisher is not None:
            dt.publish(publisher, step, tensors)
        states[step] = {n: t.detach().to(torch.bfloat16).view(torch.int16).numpy().copy().view(BF16)
                        for n, t in tensors.items()}
    return states


def bits(a):
    return np.ascontiguousarray(a).view(np.uint16)


# --- deltasync writes, TRL reads ---------------------------------------------------------------

def test_trl_reader_follows_a_gap_delta_bucket(tmp_path):
    bucket = tmp_path / "bucket"
    pub = deltasync.Publisher(str(bucket), encoding="gap_delta", anchor_interval=4)
    states = train(6, pub)
    pub.close()

    anchors = sorted(p.name for p in (bucket / "anchors").iterdir())
    deltas = sorted(p.name for p in (bucket / "deltas").iterdir())
    assert anchors == ["step_000001.safetensors", "step_000004.safetensors"]
    assert deltas == [f"step_{v:06d}.safetensors" for v in range(2, 7)]

    meta, state = trl_read(bucket / "anchors" / "step_000001.safetensors")
    assert meta["model_version"] == "1"
    state = {n: a.copy() for n, a in state.items()}
    for name, a in states[1].items():
        assert state[name].dtype == BF16 and state[name].shape == a.shape
        np.testing.assert_array_equal(bits(state[name]), bits(a), err_msg=name)

    saw_u32 = False
    for v in range(2, 7):
        meta, patch = trl_read(bucket / "deltas" / f"step_{v:06d}.safetensors")
        assert meta["encoding"] == "gap_delta" and meta["model_version"] == str(v)
        assert int(meta["num_changed_params"]) == len(patch)
        changed = sum(len(idx) for idx, _ in patch.values())
        assert int(meta["total_changed_elements"]) == changed
        total = sum(a.size for a in states[v].values())
        assert int(meta["total_elements"]) == total
        assert float(meta["sparsity"]) == pytest.approx(1 - changed / total)
        with safe_open(str(bucket / "deltas" / f"step_{v:06d}.safetensors"), framework="np") as f:
            saw_u32 |= f.get_tensor("router.far.idx").dtype == np.uint32
        trl_apply(state, patch)
        for name, a in states[v].items():
            np.testing.assert_array_equal(bits(state[name]), bits(a), err_msg=f"{name} at version {v}")
        # Only elements that really changed are listed.
        for name, (idx, _) in patch.items():
            assert np.all(bits(states[v][name]).reshape(-1)[idx] != bits(states[v - 1][name]).reshape(-1)[idx])

    assert saw_u32, "the far-apart changes should need uint32 gaps"
    # The anchor at 4 is a full state TRL can start from.
    _, anchor4 = trl_read(bucket / "anchors" / "step_000004.safetensors")
    for name, a in states[4].items():
        np.testing.assert_array_equal(bits(anchor4[name]), bits(a), err_msg=name)
    # The manifest lists them under TRL's names.
    manifest = json.loads((bucket / "manifest.json").read_text())
    keys = {o["key"] for ver in manifest["versions"] for o in ver["objects"]}
    assert "deltas/step_000006.safetensors" in keys and "anchors/step_000004.safetensors" in keys


# --- TRL writes, deltasync applies -------------------------------------------------------------

def trl_metadata(version, sparse, changed_params, changed, total, encoding):
    return {"format": "sparse_weight_patch", "version": "1", "sparse": str(sparse), "model_version": str(version),
            "num_changed_params": str(changed_params), "total_changed_elements": str(changed),
            "total_elements": str(total), "sparsity": str(1.0 - changed / max(total, 1)), "encoding": encoding}


def trl_write_anchor(path, state, version):
    total = sum(a.size for a in state.values())
    save_file({n: np.ascontiguousarray(a) for n, a in state.items()}, str(path),
              metadata=trl_metadata(version, False, len(state), total, total, "gap_delta"))


def trl_write_delta(path, old, new, version, encoding, layout="idx"):
    tensors, changed, nparams = {}, 0, 0
    for name in new:
        pos = np.flatnonzero(bits(old[name]).reshape(-1) != bits(new[name]).reshape(-1))
        if len(pos) == 0:
            continue
        nparams += 1
        changed += len(pos)
        vals = np.ascontiguousarray(new[name].reshape(-1)[pos])
        if layout == "indices":  # TRL v1: {name}.indices (int32) / {name}.values
            tensors[f"{name}.indices"] = pos.astype(np.int32)
            tensors[f"{name}.values"] = vals
            continue
        if encoding == "raw":
            idx = pos.astype(np.int32)
        else:
            gaps = np.diff(pos, prepend=-1) - 1
            idx = gaps.astype(np.uint16) if gaps.max() <= 0xFFFF else gaps.astype(np.uint32)
        tensors[f"{name}.idx"] = idx
        tensors[f"{name}.val"] = vals
    total = sum(a.size for a in new.values())
    meta = trl_metadata(version, True, nparams, changed, total, encoding)
    if layout == "indices":
        meta["changed_params"] = json.dumps(sorted({k.rsplit(".", 1)[0] for k in tensors}))
    save_file(tensors, str(path), metadata=meta)


@pytest.mark.parametrize("encoding,layout", [("gap_delta", "idx"), ("raw", "idx"), ("raw", "indices")])
def test_trl_written_chain_applies_in_deltasync(tmp_path, run, encoding, layout):
    states = train(5)
    anchor = tmp_path / "anchors_step_000001.safetensors"
    trl_write_anchor(anchor, states[1], 1)
    deltas = []
    for v in range(2, 6):
        p = tmp_path / f"deltas_step_{v:06d}.safetensors"
        trl_write_delta(p, states[v - 1], states[v], v, encoding, layout)
        deltas.append(p)
    if encoding == "gap_delta":
        with safe_open(str(deltas[0]), framework="np") as f:
            assert f.get_tensor("router.far.idx").dtype == np.uint32
            assert f.get_tensor("0.weight.idx").dtype == np.uint16
    out = tmp_path / "out.safetensors"
    run("apply", anchor, *deltas, "-o", out)
    got = load_file(str(out))
    assert set(got) == set(states[5])
    for name, a in states[5].items():
        assert got[name].dtype == BF16 and got[name].shape == a.shape
        np.testing.assert_array_equal(bits(got[name]), bits(a), err_msg=name)


def test_trl_files_of_a_deltasync_bucket_apply_with_the_cli(tmp_path, run):
    # deltasync's own gap_delta objects are TRL files: `deltasync apply` replays them too.
    bucket = tmp_path / "bucket"
    pub = deltasync.Publisher(str(bucket), encoding="gap_delta", anchor_interval=10)
    states = train(4, pub)
    pub.close()
    out = tmp_path / "out.safetensors"
    run("apply", bucket / "anchors" / "step_000001.safetensors",
        *[bucket / "deltas" / f"step_{v:06d}.safetensors" for v in range(2, 5)], "-o", out)
    got = load_file(str(out))
    for name, a in states[4].items():
        np.testing.assert_array_equal(bits(got[name]), bits(a), err_msg=name)


# --- TRL v1 (the blog's layout), written with the official safetensors package ------------------

def test_trl_v1_files_apply_bit_exactly(tmp_path, run):
    """A v1 anchor and delta exactly as TRL's v1 writer made them (torch tensors,
    safetensors.torch.save_file): '{name}.indices' int32 + '{name}.values' bf16 and the
    metadata sparse / model_version / sparsity / changed_params, with no 'format' and no
    'version' key."""
    from safetensors.torch import save_file as torch_save_file

    torch.manual_seed(0)
    anchor = {"model.embed.weight": (torch.randn(64, 16) * 0.02).to(torch.bfloat16),
              "model.norm.weight": torch.ones(16, dtype=torch.bfloat16),
              "lm_head.weight": (torch.randn(64, 16) * 0.02).to(torch.bfloat16)}
    torch_save_file(anchor, str(tmp_path / "step_000010.safetensors"),
                    metadata={"sparse": "False", "model_version": "10", "sparsity": "0.0"})

    expected = {k: v.clone() for k, v in anchor.items()}
    delta, changed = {}, []
    for name in ("model.embed.weight", "lm_head.weight"):  # norm did not change
        flat = expected[name].reshape(-1)
        idx = torch.sort(torch.randperm(flat.numel())[:37]).values
        vals = (flat[idx].float() * 1.01 + 1e-4).to(torch.bfloat16)
        flat[idx] = vals
        delta[f"{name}.indices"] = idx.to(torch.int32)
        delta[f"{name}.values"] = vals
        changed.append(name)
    torch_save_file(delta, str(tmp_path / "step_000011.safetensors"),
                    metadata={"sparse": "True", "model_version": "11", "sparsity": str(1 - 74 / 2064),
                              "changed_params": json.dumps(changed)})

    # A plain checkpoint as the base, then the v1 anchor and delta.
    base = {k: torch.zeros_like(v) for k, v in anchor.items()}
    torch_save_file(base, str(tmp_path / "base.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "out.safetensors"
    run("apply", tmp_path / "base.safetensors", tmp_path / "step_000010.safetensors",
        tmp_path / "step_000011.safetensors", "-o", out)
    with safe_open(str(out), framework="pt") as f:
        assert f.metadata().get("model_version") == "11"
        for name, want in expected.items():
            got = f.get_tensor(name)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), name

    info = json.loads(run("inspect", tmp_path / "step_000011.safetensors", "--json").stdout)
    assert info["kind"] == "delta" and info["model_version"] == 11

    # A file that matches neither layout is still refused: a plain checkpoint
    # used as a patch, and a v1-looking delta without its list of names.
    plain = run("apply", tmp_path / "base.safetensors", tmp_path / "base.safetensors", "-o", out, check=False)
    assert plain.returncode == 1 and "not a sparse_weight_patch" in plain.stderr
    torch_save_file(delta, str(tmp_path / "no_list.safetensors"), metadata={"sparse": "True", "model_version": "11"})
    no_list = run("apply", tmp_path / "base.safetensors", tmp_path / "no_list.safetensors", "-o", out, check=False)
    assert no_list.returncode == 1 and "'changed_params'" in no_list.stderr
