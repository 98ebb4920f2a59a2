"""`deltasync apply` of gap_delta deltas (applied straight from the encoded
gaps, as a replica does) against the raw encoding of the same changes, and
its loud refusals; `deltasync diff` reading OLD in place: bf16 and fp32 OLD
give the same patch, NaN in OLD is still refused."""
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from test_safetensors_interop import make_weights, nudge, to_bf16_bits


def bf16(weights):
    return {k: v.astype(ml_dtypes.bfloat16) for k, v in weights.items()}


def test_gap_delta_and_raw_chains_apply_to_the_same_state(tmp_path, run):
    states = [make_weights(31)]
    for step in range(3):
        states.append(nudge(states[-1], 0.04, 32 + step))
    for i, s in enumerate(states):
        save_file(bf16(s), tmp_path / f"s{i}.safetensors")
    outs = {}
    for encoding in ("gap_delta", "raw"):
        patches = []
        for i in range(1, len(states)):
            p = tmp_path / f"{encoding}_{i}.safetensors"
            run("diff", tmp_path / f"s{i - 1}.safetensors", tmp_path / f"s{i}.safetensors", "-o", p,
                "--encoding", encoding, "--version", i)
            patches.append(p)
        out = tmp_path / f"out_{encoding}.safetensors"
        run("apply", tmp_path / "s0.safetensors", *patches, "-o", out)
        outs[encoding] = load_file(out)
    for name, w in states[-1].items():
        for encoding, got in outs.items():
            np.testing.assert_array_equal(got[name].view(np.uint16), to_bf16_bits(w), err_msg=f"{encoding} {name}")


def test_gap_delta_apply_refuses_a_base_it_does_not_fit(tmp_path, run):
    old, new = make_weights(41), nudge(make_weights(41), 0.05, 42)
    save_file(bf16(old), tmp_path / "old.safetensors")
    save_file(bf16(new), tmp_path / "new.safetensors")
    patch = tmp_path / "d.safetensors"
    run("diff", tmp_path / "old.safetensors", tmp_path / "new.safetensors", "-o", patch)
    # As TRL writes it: without deltasync_base_state_hash (with it, any other
    # base is refused by its hash first: test_cli_output_review.py), so that
    # the structural checks below are what refuses.
    with safe_open(str(patch), "np") as f:
        meta = {k: v for k, v in f.metadata().items() if k != "deltasync_base_state_hash"}
    save_file(load_file(patch), patch, metadata=meta)
    out = tmp_path / "out.safetensors"

    small = dict(bf16(old))
    small["model.embed_tokens.weight"] = small["model.embed_tokens.weight"][:10]  # indices run past it
    save_file(small, tmp_path / "small.safetensors")
    proc = run("apply", tmp_path / "small.safetensors", patch, "-o", out, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("deltasync: error:")
    assert str(patch) in proc.stderr and "model.embed_tokens.weight" in proc.stderr
    assert "out of range" in proc.stderr
    assert not out.exists()

    missing = {k: v for k, v in bf16(old).items() if k != "model.layers.0.mlp.up_proj.weight"}
    save_file(missing, tmp_path / "missing.safetensors")
    proc = run("apply", tmp_path / "missing.safetensors", patch, "-o", out, check=False)
    assert proc.returncode == 1
    assert str(patch) in proc.stderr and "model.layers.0.mlp.up_proj.weight" in proc.stderr
    assert not out.exists()


def test_diff_of_fp32_and_bf16_old_is_the_same_patch(tmp_path, run):
    old, new = make_weights(51), nudge(make_weights(51), 0.05, 52)
    save_file(old, tmp_path / "old32.safetensors")
    save_file(bf16(old), tmp_path / "old16.safetensors")
    save_file(new, tmp_path / "new.safetensors")
    for encoding in ("gap_delta", "compact"):
        a, b = tmp_path / f"a_{encoding}", tmp_path / f"b_{encoding}"
        run("diff", tmp_path / "old32.safetensors", tmp_path / "new.safetensors", "-o", a, "--encoding", encoding)
        run("diff", tmp_path / "old16.safetensors", tmp_path / "new.safetensors", "-o", b, "--encoding", encoding)
        assert a.read_bytes() == b.read_bytes(), encoding


def test_diff_refuses_nan_in_old_unless_allowed(tmp_path, run):
    old, new = make_weights(61), make_weights(61)
    old["model.norm.weight"][5] = np.nan
    save_file(bf16(old), tmp_path / "old.safetensors")
    save_file(bf16(new), tmp_path / "new.safetensors")
    proc = run("diff", tmp_path / "old.safetensors", tmp_path / "new.safetensors", "-o", tmp_path / "d",
               check=False)
    assert proc.returncode == 1
    assert str(tmp_path / "old.safetensors") in proc.stderr
    assert "'model.norm.weight': element 5 is NaN" in proc.stderr
    run("diff", tmp_path / "old.safetensors", tmp_path / "new.safetensors", "-o", tmp_path / "d",
        "--allow-nonfinite")
