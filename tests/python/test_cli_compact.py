"""The compact encoding through the CLI, checked with the official safetensors
package: compact deltas and compressed anchors are safetensors files that
`safe_open` lists; they round-trip bit-exactly; a compact delta refuses any
base but its own; a compact bucket keeps TRL's folders free of files TRL
cannot read; cumulative deltas and `gc --keep-anchors` keep every kept
version reachable."""
import json

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from test_safetensors_interop import make_weights, nudge, to_bf16_bits


def diff_compact(run, tmp_path, old, new, out="d.safetensors", version=8, *extra):
    save_file(old, tmp_path / "old.safetensors")
    save_file(new, tmp_path / "new.safetensors")
    return run("diff", tmp_path / "old.safetensors", tmp_path / "new.safetensors", "-o", tmp_path / out,
               "--encoding", "compact", "--version", version, *extra)


def varint(buf, pos):
    value, shift = 0, 0
    while True:
        b = int(buf[pos])
        value |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return value, pos
        shift += 7


def compact_streams(f, base_names):
    """{parameter: stream bytes} of an open compact delta in either container
    (docs/format.md, "Containers"), read with the official package only."""
    if f.metadata().get("deltasync_compact_container") == "2":
        assert list(f.keys()) == ["streams"]
        t = f.get_tensor("streams")
        assert t.dtype == np.uint8 and t.ndim == 1
        buf = t.tobytes()
        n, pos = varint(buf, 0)
        entries, index = [], -1
        for _ in range(n):
            gap, pos = varint(buf, pos)
            length, pos = varint(buf, pos)
            index += 1 + gap
            entries.append((sorted(base_names)[index], length))
        out = {}
        for name, length in entries:
            out[name] = buf[pos:pos + length]
            pos += length
        assert pos == len(buf)  # the lengths fill the tensor exactly
        return out
    assert "deltasync_compact_container" not in f.metadata()
    assert all(k.endswith(".cmp") and f.get_tensor(k).dtype == np.uint8 for k in f.keys())
    return {k[:-len(".cmp")]: f.get_tensor(k).tobytes() for k in f.keys()}


def test_compact_delta_is_a_safetensors_file_and_round_trips(tmp_path, run):
    old, new = make_weights(21), nudge(make_weights(21), 0.05, 22)
    save_file({k: v.astype(ml_dtypes.bfloat16) for k, v in old.items()}, tmp_path / "base_bf16.safetensors")
    streams = {}
    for container in (None, "1", "2"):
        extra = () if container is None else ("--container", container)
        diff_compact(run, tmp_path, old, new, "d.safetensors", 8, *extra)
        with safe_open(tmp_path / "d.safetensors", framework="np") as f:
            meta = f.metadata()
            assert meta["format"] == "sparse_weight_patch"
            assert meta["encoding"] == "compact"
            assert meta["model_version"] == "8"
            assert meta["deltasync_base_version"] == "7"
            assert len(meta["deltasync_base_state_hash"]) == 32
            # The default is container 2 (one tensor) on a delta of many tensors.
            assert meta.get("deltasync_compact_container") == ("2" if container != "1" else None)
            streams[container] = compact_streams(f, old)
            assert streams[container] and set(streams[container]) <= set(old)
            assert int(meta["num_changed_params"]) == len(streams[container])
        run("apply", tmp_path / "base_bf16.safetensors", tmp_path / "d.safetensors", "-o", tmp_path / "out.safetensors")
        out = load_file(tmp_path / "out.safetensors")
        for name, w in new.items():
            np.testing.assert_array_equal(out[name].view(np.uint16), to_bf16_bits(w), err_msg=name)
    # The same stream bytes in both containers.
    assert streams[None] == streams["1"] == streams["2"]
    proc = run("diff", tmp_path / "old.safetensors", tmp_path / "new.safetensors", "-o", tmp_path / "x.safetensors",
               "--container", 2, check=False)
    assert proc.returncode != 0 and "--container applies only to --encoding compact" in proc.stderr


def test_compact_delta_refuses_any_other_base(tmp_path, run):

    old, new = make_weights(23), nudge(make_weights(23), 0.05, 24)
    diff_compact(run, tmp_path, old, new)
    other = nudge(old, 0.001, 25)  # a few elements one ULP off is enough
    assert any((to_bf16_bits(other[k]) != to_bf16_bits(old[k])).any() for k in old)
    save_file({k: v.astype(ml_dtypes.bfloat16) for k, v in other.items()}, tmp_path / "other.safetensors")
    proc = run("apply", tmp_path / "other.safetensors", tmp_path / "d.safetensors", "-o", tmp_path / "out.safetensors",
               check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("deltasync: error:")
    assert "base" in proc.stderr
    assert not (tmp_path / "out.safetensors").exists()


def test_inspect_shows_compact_streams(tmp_path, run):
    old, new = make_weights(26), nudge(make_weights(26), 0.1, 27)
    diff_compact(run, tmp_path, old, new)
    info = json.loads(run("inspect", tmp_path / "d.safetensors", "--json").stdout)
    changed = sum(int((to_bf16_bits(old[k]) != to_bf16_bits(new[k])).sum()) for k in old)
    assert info["encoding"] == "compact"
    assert info["changed_elements"] == changed
    streams = info["streams"]
    assert set(streams) == {"header", "gaps", "ulp_diffs", "escapes", "raw_values"}
    assert sum(s["bytes"] for s in streams.values()) == info["size_bytes"]
    assert streams["gaps"]["bytes_per_changed_element"] == pytest.approx(streams["gaps"]["bytes"] / changed)
    text = run("inspect", tmp_path / "d.safetensors").stdout
    assert "ulp_diffs" in text


def publish_versions(run, tmp_path, bucket, versions, *extra):
    weights, expected = make_weights(30), {}
    for v in versions:
        if v > versions[0]:
            weights = nudge(weights, 0.03, v)
        save_file(weights, tmp_path / f"c{v}.safetensors")
        run("publish", bucket, tmp_path / f"c{v}.safetensors", "--version", v, *extra)
        expected[v] = {k: to_bf16_bits(w) for k, w in weights.items()}
    return expected


def pull_and_check(run, tmp_path, bucket, version, bits):
    out = tmp_path / f"pulled{version}.safetensors"
    run("pull", bucket, "-o", out, "--version", version)
    pulled = load_file(out)
    for name in bits:
        np.testing.assert_array_equal(pulled[name].view(np.uint16), bits[name], err_msg=f"v{version} {name}")


def test_compact_bucket_keeps_trl_folders_clean(tmp_path, run):
    bucket = tmp_path / "bucket"
    expected = publish_versions(run, tmp_path, bucket, list(range(1, 8)), "--anchor-interval", 3,
                                "--cumulative-every", 2)
    # Nothing a TRL reader would list, and everything native under ds/.
    assert not (bucket / "anchors").exists() and not (bucket / "deltas").exists()
    files = sorted(str(p.relative_to(bucket)) for p in bucket.rglob("*.safetensors"))
    assert files and all(f.startswith("ds/") for f in files)
    assert any(f.startswith("ds/cumulative/") for f in files)
    manifest = json.loads((bucket / "manifest.json").read_text())
    encodings = {o["encoding"] for v in manifest["versions"] for o in v["objects"]}
    assert encodings == {"compact"}
    with safe_open(bucket / "ds/anchors/step_000003.safetensors", framework="np") as f:
        assert f.metadata()["format"] == "deltasync_compressed_anchor"
        assert all(k.endswith(".zan") for k in f.keys())
    info = json.loads(run("inspect", bucket / "ds/anchors/step_000003.safetensors", "--json").stdout)
    assert info["kind"] == "anchor" and info["compression_ratio"] > 1.2
    for v, bits in expected.items():
        pull_and_check(run, tmp_path, bucket, v, bits)


def test_gc_keep_anchors_removes_only_what_no_kept_chain_needs(tmp_path, run):
    bucket = tmp_path / "bucket"
    expected = publish_versions(run, tmp_path, bucket, list(range(1, 11)), "--anchor-interval", 3)
    before = (bucket / "manifest.json").read_text()
    dry = run("gc", bucket, "--keep-anchors", 2, "--dry-run")
    assert "would remove 5 version(s)" in dry.stdout  # anchors 1, 3, 6, 9: keep 6 and 9
    assert (bucket / "manifest.json").read_text() == before
    run("gc", bucket, "--keep-anchors", 2)
    manifest = json.loads((bucket / "manifest.json").read_text())
    assert [v["version"] for v in manifest["versions"]] == [6, 7, 8, 9, 10]
    listed = {o["key"] for v in manifest["versions"] for o in v["objects"]}
    on_disk = {str(p.relative_to(bucket)) for p in bucket.rglob("*.safetensors")}
    assert on_disk == listed
    for v in range(6, 11):
        pull_and_check(run, tmp_path, bucket, v, expected[v])
    proc = run("pull", bucket, "-o", tmp_path / "old.safetensors", "--version", 4, check=False)
    assert proc.returncode == 1 and "version 4" in proc.stderr
    assert run("gc", bucket, "--keep-anchors", 0, check=False).returncode == 2


def test_diff_stream_versions_2_and_3_apply_alike(tmp_path, run):
    old, new = make_weights(28), nudge(make_weights(28), 0.05, 29)
    save_file(old, tmp_path / "old.safetensors")
    save_file(new, tmp_path / "new.safetensors")
    save_file({k: v.astype(ml_dtypes.bfloat16) for k, v in old.items()}, tmp_path / "base_bf16.safetensors")
    for version in (2, 3):
        patch = tmp_path / f"d{version}.safetensors"
        run("diff", tmp_path / "old.safetensors", tmp_path / "new.safetensors", "-o", patch, "--encoding", "compact",
            "--stream-version", version)
        with safe_open(patch, framework="np") as f:
            assert ("deltasync_compact_tables" in f.metadata()) == (version == 3)
            assert {s[0] for s in compact_streams(f, old).values()} == {version}  # each stream's version byte
        info = json.loads(run("inspect", patch, "--json").stdout)
        assert sum(s["bytes"] for s in info["streams"].values()) == info["size_bytes"]
        out = tmp_path / f"out{version}.safetensors"
        run("apply", tmp_path / "base_bf16.safetensors", patch, "-o", out)
        got = load_file(out)
        for name, w in new.items():
            np.testing.assert_array_equal(got[name].view(np.uint16), to_bf16_bits(w), err_msg=f"v{version} {name}")
    proc = run("diff", tmp_path / "old.safetensors", tmp_path / "new.safetensors", "-o", tmp_path / "x.safetensors",
               "--stream-version", 3, check=False)
    assert proc.returncode != 0 and "--stream-version applies only to --encoding compact" in proc.stderr
    proc = run("diff", tmp_path / "old.safetensors", tmp_path / "new.safetensors", "-o", tmp_path / "x.safetensors",
               "--encoding", "compact", "--stream-version", 4, check=False)
    assert proc.returncode != 0 and "--stream-version" in proc.stderr
    assert not (tmp_path / "x.safetensors").exists()
