"""Session 49's adversarial review of `deltasync gc` from the command line:
gc never strands versions behind a damaged anchor, deletes exactly what it
reports (nothing with --dry-run), and leaves files it did not write alone.
The races with a publisher are in tests/sync/gc_review_test.cc."""
import json
import os

from test_cli_compact import publish_versions, pull_and_check


def tree(root):
    """Every file under root (symlinks as links) with its size."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = os.lstat(path).st_size
    return out


def flip_middle_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    tmp = path.with_name(path.name + ".damaged")
    tmp.write_bytes(bytes(data))
    os.replace(tmp, path)


def test_gc_refuses_to_strand_versions_behind_a_damaged_oldest_kept_anchor(tmp_path, run):
    bucket = tmp_path / "bucket"
    # anchors 1, 3, 6, 9 (interval 3)
    expected = publish_versions(run, tmp_path, bucket, list(range(1, 11)), "--anchor-interval", 3)
    anchor9 = bucket / "ds/anchors/step_000009.safetensors"
    flip_middle_byte(anchor9)
    pull_and_check(run, tmp_path, bucket, 10, expected[10])  # routed around through anchor 6
    before = tree(bucket)
    for extra in (["--dry-run"], [], ["--json"]):
        proc = run("gc", bucket, "--keep-anchors", 1, *extra, check=False)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "ds/anchors/step_000009.safetensors" in proc.stderr and "--keep-anchors" in proc.stderr
    assert tree(bucket) == before
    # --anchor-check size reads nothing, so it cannot see a flip in place (a dry run shows it)
    cheap = json.loads(run("gc", bucket, "--keep-anchors", 1, "--dry-run", "--anchor-check", "size",
                           "--json").stdout)
    assert cheap["pruned"]["anchor_check"] == "size" and cheap["pruned"]["anchor_bytes_read"] == 0
    assert cheap["pruned"]["anchor_checked"] == 9
    text = run("gc", bucket, "--keep-anchors", 2, "--dry-run").stdout
    assert "checked the oldest kept anchor (version 6) first: read and hashed" in text, text
    assert tree(bucket) == before
    out = json.loads(run("gc", bucket, "--keep-anchors", 2, "--json").stdout)
    assert out["pruned"]["kept_anchors"] == [6, 9]
    assert out["pruned"]["anchor_checked"] == 6 and out["pruned"]["anchor_check"] == "full"
    assert out["pruned"]["anchor_bytes_read"] == before["ds/anchors/step_000006.safetensors"]
    for v in (6, 9, 10):
        pull_and_check(run, tmp_path, bucket, v, expected[v])


def test_gc_json_numbers_are_what_it_deleted_and_a_dry_run_deletes_nothing(tmp_path, run):
    bucket = tmp_path / "bucket"
    expected = publish_versions(run, tmp_path, bucket, list(range(1, 11)), "--anchor-interval", 3,
                                "--cumulative-every", 2)
    before = tree(bucket)
    dry = json.loads(run("gc", bucket, "--keep-anchors", 1, "--dry-run", "--json").stdout)
    assert tree(bucket) == before
    real = json.loads(run("gc", bucket, "--keep-anchors", 1, "--json").stdout)
    assert dry["pruned"] == real["pruned"]
    after = tree(bucket)
    gone = {k: s for k, s in before.items() if k not in after}
    assert "manifest.json" in after and set(after) - set(before) == set()
    assert real["pruned"]["objects_deleted"] == len(gone) > 0
    assert real["pruned"]["bytes_deleted"] == sum(gone.values())
    assert real["pruned"]["removed_versions"] == list(range(1, 9))
    for v in (9, 10):
        pull_and_check(run, tmp_path, bucket, v, expected[v])


def test_gc_leaves_files_it_did_not_write_alone(tmp_path, run):
    bucket = tmp_path / "bucket"
    publish_versions(run, tmp_path, bucket, list(range(1, 8)), "--anchor-interval", 3)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"the user's own file")
    # A user's files: beside the objects, under the object folders, with
    # names close to a temporary's, and symlinks (to a file, to a folder).
    own = {
        "notes.txt": b"mine",
        "ds/anchors/step_000001.safetensors.bak": b"a backup",
        "ds/deltas/README": b"mine too",
        ".tmp-notatemporary": b"not a writer's name",
        ".tmpfile": b"nor this",
    }
    for rel, data in own.items():
        (bucket / rel).write_bytes(data)
    os.symlink(outside, bucket / "link-to-file")
    os.symlink(tmp_path, bucket / "ds/link-to-folder")
    # A run beside this one whose name starts like it.
    publish_versions(run, tmp_path, tmp_path / "bucket10", [1, 2, 3, 4], "--anchor-interval", 3)
    other = tree(tmp_path / "bucket10")
    run("gc", bucket, "--keep-anchors", 1, "--temp-older-than", 0)
    for rel, data in own.items():
        assert (bucket / rel).read_bytes() == data, rel
    assert os.path.islink(bucket / "link-to-file") and os.path.islink(bucket / "ds/link-to-folder")
    assert outside.read_bytes() == b"the user's own file"
    assert tree(tmp_path / "bucket10") == other
    manifest = json.loads((bucket / "manifest.json").read_text())
    assert [v["version"] for v in manifest["versions"]] == [6, 7]


def test_gc_checks_the_route_to_a_version_a_removed_delta_leads_into(tmp_path, run):
    """Session 50: a kept version reached through a delta from a removed
    version (here a cumulative delta from anchor 1, spliced in from a second
    bucket of the same checkpoints: the format allows any base) is checked
    before pruning; when its route through the kept objects is broken, gc
    refuses and changes nothing."""
    bucket, other = tmp_path / "bucket", tmp_path / "other"
    expected = publish_versions(run, tmp_path, bucket, list(range(1, 11)), "--anchor-interval", 4)  # anchors 1, 4, 8
    for v in range(1, 11):
        run("publish", other, tmp_path / f"c{v}.safetensors", "--version", v, "--anchor-interval", 100,
            "--cumulative-every", 9)
    theirs = json.loads((other / "manifest.json").read_text())
    ours = json.loads((bucket / "manifest.json").read_text())
    [cumulative] = [o for v in theirs["versions"] if v["version"] == 10 for o in v["objects"]
                    if o.get("base_version") == 1]
    (bucket / cumulative["key"]).parent.mkdir(parents=True, exist_ok=True)
    (bucket / cumulative["key"]).write_bytes((other / cumulative["key"]).read_bytes())
    next(v for v in ours["versions"] if v["version"] == 10)["objects"].append(cumulative)
    (bucket / "manifest.json").write_text(json.dumps(ours))
    pull_and_check(run, tmp_path, bucket, 10, expected[10])
    sizes = tree(bucket)
    step = "ds/deltas/step_{:06d}.safetensors"
    out = json.loads(run("gc", bucket, "--keep-anchors", 1, "--dry-run", "--json").stdout)["pruned"]
    assert out["routes_checked"] == [8, 10] and out["check_objects"] == 3, out
    assert out["check_bytes_read"] == (sizes["ds/anchors/step_000008.safetensors"] + sizes[step.format(9)]
                                       + sizes[step.format(10)]), out
    assert out["anchor_bytes_read"] == sizes["ds/anchors/step_000008.safetensors"]
    text = run("gc", bucket, "--keep-anchors", 1, "--dry-run").stdout
    assert "and the routes to version(s) 10, which deltas from removed versions lead into: 3 object(s)" in text, text

    os.remove(bucket / step.format(9))
    before = tree(bucket)
    for extra in (["--dry-run"], [], ["--anchor-check", "size"]):
        proc = run("gc", bucket, "--keep-anchors", 1, *extra, check=False)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert "version 10," in proc.stderr and step.format(9) in proc.stderr, proc.stderr
    assert tree(bucket) == before
