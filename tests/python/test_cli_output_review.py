"""Session 49 (H6): an adversarial review of the CLI's output files and
inputs. No command may leave a file at its final path that looks like a good
result but is not: a TRL delta (gap_delta, raw) written by `deltasync diff`
names the state hash it applies to, and `deltasync apply` refuses any other
base (same names, dtypes and shapes, other values) or the patches out of
order, keeping what was at OUT; a TRL file without the key still applies."""
import os
import resource
import subprocess

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from test_safetensors_interop import make_weights, nudge, to_bf16_bits


def bf16(weights):
    return {k: v.astype(ml_dtypes.bfloat16) for k, v in weights.items()}


def metadata(path):
    with safe_open(str(path), "np") as f:
        return f.metadata()


def chain(tmp_path, run, encoding, n=2):
    """s0..sn (bf16) and the patches s(i-1) -> si."""
    states = [make_weights(61)]
    for step in range(n):
        states.append(nudge(states[-1], 0.05, 62 + step))
    paths = []
    for i, s in enumerate(states):
        paths.append(tmp_path / f"s{i}.safetensors")
        save_file(bf16(s), paths[-1])
    patches = []
    for i in range(1, n + 1):
        patches.append(tmp_path / f"{encoding}_{i}.safetensors")
        run("diff", paths[i - 1], paths[i], "-o", patches[-1], "--encoding", encoding, "--version", i)
    return states, paths, patches


@pytest.mark.parametrize("encoding", ["gap_delta", "raw"])
def test_apply_refuses_a_trl_delta_made_for_another_base(tmp_path, run, encoding):
    states, paths, patches = chain(tmp_path, run, encoding, n=1)
    assert len(metadata(patches[0])["deltasync_base_state_hash"]) == 32
    others = {"values": bf16(make_weights(99)),  # same names, dtypes and shapes; other values
              "extra": {**bf16(states[0]), "lm_head.bias": np.zeros(8, ml_dtypes.bfloat16)}}  # one tensor more
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"a good file the user had")
    for what, weights in others.items():
        other = tmp_path / f"other_{what}.safetensors"
        save_file(weights, other)
        proc = run("apply", other, patches[0], "-o", out, check=False)
        assert proc.returncode == 1, (what, proc.stdout)
        assert proc.stderr.startswith("deltasync: error:")
        assert str(patches[0]) in proc.stderr and "state hash" in proc.stderr
        assert out.read_bytes() == b"a good file the user had"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]
    # The right base still applies, bit for bit.
    run("apply", paths[0], patches[0], "-o", out)
    got = load_file(out)
    for name, w in states[1].items():
        np.testing.assert_array_equal(got[name].view(np.uint16), to_bf16_bits(w), err_msg=name)


def test_apply_refuses_trl_deltas_out_of_order(tmp_path, run):
    _, paths, patches = chain(tmp_path, run, "gap_delta", n=2)
    out = tmp_path / "out.safetensors"
    proc = run("apply", paths[0], patches[1], patches[0], "-o", out, check=False)
    assert proc.returncode == 1
    assert str(patches[1]) in proc.stderr and "state hash" in proc.stderr
    assert not out.exists()
    run("apply", paths[0], *patches, "-o", out)


def test_a_trl_delta_without_the_hash_still_applies(tmp_path, run):
    """TRL's own files name no state hash: applied as before (names, shapes
    and index ranges checked), the key being deltasync's extension."""
    states, paths, patches = chain(tmp_path, run, "gap_delta", n=1)
    meta = metadata(patches[0])
    del meta["deltasync_base_state_hash"]
    trl = tmp_path / "trl.safetensors"
    save_file(load_file(patches[0]), trl, metadata=meta)
    out = tmp_path / "out.safetensors"
    run("apply", paths[0], trl, "-o", out)
    got = load_file(out)
    for name, w in states[1].items():
        np.testing.assert_array_equal(got[name].view(np.uint16), to_bf16_bits(w), err_msg=name)


def test_a_malformed_base_state_hash_is_refused(tmp_path, run):
    _, paths, patches = chain(tmp_path, run, "gap_delta", n=1)
    meta = metadata(patches[0])
    meta["deltasync_base_state_hash"] = "not-a-hash"
    bad = tmp_path / "bad.safetensors"
    save_file(load_file(patches[0]), bad, metadata=meta)
    out = tmp_path / "out.safetensors"
    proc = run("apply", paths[0], bad, "-o", out, check=False)
    assert proc.returncode == 1
    assert "deltasync_base_state_hash" in proc.stderr and "not-a-hash" in proc.stderr
    assert not out.exists()


def test_diff_refuses_to_write_over_its_inputs(tmp_path, run):
    """`diff OLD NEW -o OLD` replaced the base weights (the only thing the
    patch applies to) with the patch, exit 0."""
    _, paths, _ = chain(tmp_path, run, "gap_delta", n=1)
    before = [p.read_bytes() for p in paths]
    os.symlink(paths[0], tmp_path / "link.safetensors")
    for out in (paths[0], paths[1], tmp_path / "link.safetensors", tmp_path / "." / "s0.safetensors"):
        proc = run("diff", paths[0], paths[1], "-o", out, check=False)
        assert proc.returncode == 1, out
        assert "would replace that input" in proc.stderr
    assert [p.read_bytes() for p in paths] == before


def test_apply_writes_over_its_base_but_not_over_a_patch(tmp_path, run):
    states, paths, patches = chain(tmp_path, run, "gap_delta", n=1)
    patch_bytes = patches[0].read_bytes()
    proc = run("apply", paths[0], patches[0], "-o", patches[0], check=False)
    assert proc.returncode == 1 and "would replace that input" in proc.stderr
    assert patches[0].read_bytes() == patch_bytes
    run("apply", paths[0], patches[0], "-o", paths[0])  # in place: allowed, atomic
    got = load_file(paths[0])
    for name, w in states[1].items():
        np.testing.assert_array_equal(got[name].view(np.uint16), to_bf16_bits(w), err_msg=name)


def bucket_files(root):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            out[os.path.relpath(os.path.join(d, f), root)] = open(os.path.join(d, f), "rb").read()
    return out


def test_pull_refuses_an_output_inside_or_holding_its_local_bucket(tmp_path, run):
    """`pull BUCKET -o BUCKET/manifest.json` replaced the bucket's manifest
    with model weights and said "pulled version 2", exit 0: the bucket was
    gone. The same for an object's path, or --hf-dir on a folder of it."""
    _, paths, _ = chain(tmp_path, run, "gap_delta", n=1)
    bucket = tmp_path / "bk"
    run("publish", bucket, paths[0], "--version", 1, "--quiet")
    run("publish", bucket, paths[1], "--version", 2, "--quiet")
    before = bucket_files(bucket)
    anchor = next(k for k in before if "anchors" in k)
    os.symlink(bucket, tmp_path / "bk_link")
    cases = [("-o", bucket / "manifest.json"), ("-o", bucket / anchor), ("-o", bucket / "model.safetensors"),
             ("-o", tmp_path / "bk_link" / "manifest.json"), ("-o", bucket / "ds" / ".." / "manifest.json"),
             ("--hf-dir", bucket / "ds"), ("--hf-dir", bucket), ("--hf-dir", tmp_path)]
    for flag, out in cases:
        for extra in ([], ["--force"]) if flag == "--hf-dir" else ([],):
            proc = run("pull", bucket, flag, out, *extra, check=False)
            assert proc.returncode == 1, (flag, out, extra, proc.stdout)
            assert "bucket" in proc.stderr and "outside" in proc.stderr, proc.stderr
            assert bucket_files(bucket) == before, (flag, out)
    # Beside the bucket is fine.
    run("pull", bucket, "-o", tmp_path / "bk2.safetensors")
    run("pull", bucket, "--hf-dir", tmp_path / "bk_model")
    assert bucket_files(bucket) == before


def test_a_file_size_limit_is_a_clear_error_and_leaves_no_temporary(tmp_path, run, deltasync_bin):
    """`ulimit -f` reached while writing OUT: the command died by SIGXFSZ and
    left its .tmp-* file beside OUT; now the write fails (EFBIG), the error
    names OUT, the temporary is removed and a good OUT already there stays."""
    _, paths, patches = chain(tmp_path, run, "gap_delta", n=1)
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"a good file the user had")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))

    proc = subprocess.run([deltasync_bin, "apply", str(paths[0]), str(patches[0]), "-o", str(out)],
                          capture_output=True, text=True, preexec_fn=limit, timeout=60)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert str(out) in proc.stderr and "File too large" in proc.stderr
    assert out.read_bytes() == b"a good file the user had"
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]
