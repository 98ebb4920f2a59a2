"""`deltasync log` (alias `ls`) and `deltasync verify` on buckets published
with the CLI, cumulative deltas included: log's lines and JSON against the
manifest; verify passes a good bucket and names the object it finds bad."""
import json
from datetime import datetime, timezone

from test_cli_compact import publish_versions


def manifest_of(bucket):
    return json.loads((bucket / "manifest.json").read_text())


def published(run, tmp_path):
    bucket = tmp_path / "bucket"
    publish_versions(run, tmp_path, bucket, list(range(1, 8)), "--anchor-interval", 3, "--cumulative-every", 2)
    return bucket


def test_log_json_matches_the_manifest(tmp_path, run):
    bucket = published(run, tmp_path)
    m = manifest_of(bucket)
    out = json.loads(run("log", bucket, "--json").stdout)
    assert [v["version"] for v in out["versions"]] == list(range(1, 8))
    roles = {}
    previous = None
    for entry, v in zip(m["versions"], out["versions"]):
        assert v["state_hash"] == entry["state_hash"]
        assert v["created_unix_ms"] == entry["created_unix_ms"]
        created = datetime.fromtimestamp(entry["created_unix_ms"] / 1000, timezone.utc)
        assert v["created"] == created.strftime("%Y-%m-%dT%H:%M:%S.") + f"{entry['created_unix_ms'] % 1000:03d}Z"
        assert v["changed_fraction"] == entry["changed_elements"] / entry["total_elements"]
        assert v["encoding"] == "compact"
        assert [o["key"] for o in v["objects"]] == [o["key"] for o in entry["objects"]]
        assert [o["size_bytes"] for o in v["objects"]] == [o["size"] for o in entry["objects"]]
        assert v["bytes"] == sum(o["size"] for o in entry["objects"])
        for o, listed in zip(v["objects"], entry["objects"]):
            expected = ("anchor" if listed["kind"] == "anchor"
                        else "delta" if listed["base_version"] == previous else "cumulative")
            assert o["role"] == expected, (v["version"], o)
            assert o["base_version"] == listed.get("base_version")
        roles[v["version"]] = sorted(o["role"] for o in v["objects"])
        step = [o for o in v["objects"] if o["role"] == "delta"]
        if step:
            assert v["bytes_per_changed_element"] == step[0]["size_bytes"] / entry["changed_elements"]
        else:
            assert v["bytes_per_changed_element"] is None
        previous = v["version"]
    # Anchors at 1, 3, 6; cumulative deltas 2 after each anchor (5 from 3).
    assert roles[1] == ["anchor"]
    assert roles[3] == ["anchor", "delta"]
    assert roles[5] == ["cumulative", "delta"]
    objects = [o for entry in m["versions"] for o in entry["objects"]]
    assert out["totals"] == {
        "versions": 7, "objects": len(objects), "bytes": sum(o["size"] for o in objects),
        "anchors": 3, "anchor_bytes": sum(o["size"] for o in objects if o["kind"] == "anchor"),
        "deltas": 6,
        "delta_bytes": sum(o["size_bytes"] for v in out["versions"] for o in v["objects"] if o["role"] == "delta"),
        "cumulative": 1,
        "cumulative_bytes": sum(o["size_bytes"] for v in out["versions"] for o in v["objects"] if o["role"] == "cumulative"),
    }


def test_ls_prints_one_line_per_version_and_totals(tmp_path, run):
    bucket = published(run, tmp_path)
    lines = run("ls", bucket).stdout.splitlines()
    assert lines[0] == f"file://{bucket}"
    rows = {int(line.split()[0]): line for line in lines[2:-1]}
    assert sorted(rows) == list(range(1, 8))
    assert rows[1].split()[4] == "compact" and "anchor" in rows[1]
    assert "cumulative" in rows[5] and "(from 3)" in rows[5]
    assert rows[2].split()[2].endswith("%")
    assert lines[-1].startswith("totals: 7 version(s), 10 object(s)")
    assert "3 anchor(s)" in lines[-1]


def test_verify_passes_a_good_bucket_and_names_a_corrupted_object(tmp_path, run):
    bucket = published(run, tmp_path)
    good = run("verify", bucket)
    assert good.stdout.splitlines()[-1] == "ok"
    everything = json.loads(run("verify", bucket, "--all", "--json").stdout)
    assert everything["ok"] and everything["verified"] == list(range(1, 8))
    assert everything["objects_checked"] == 10 and everything["bad_objects"] == []

    # The cumulative delta 3 -> 5 is on the cheapest chain to 5.
    key = "ds/cumulative/step_000005_from_000003.compact.safetensors"
    path = bucket / key
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))
    for args in (["--version", "5"], ["--all"]):
        proc = run("verify", bucket, *args, check=False)
        assert proc.returncode == 1, args
        assert f"bad object: {key} (version 5): xxh3-128 mismatch" in proc.stdout
        err = proc.stderr.splitlines()
        assert len(err) == 1 and err[0].startswith("deltasync: error: ")
        assert key in err[0] and "failed verification" in err[0]
    report = json.loads(run("verify", bucket, "--all", "--json", check=False).stdout)
    assert not report["ok"]
    assert [(p["version"], p["key"], p["error"]) for p in report["bad_objects"]] == [(5, key, "integrity")]
    assert report["unreachable"] == [] and report["verified"] == list(range(1, 8))  # 5 by its step delta

    # A deleted step delta: its version has no other way in.
    (bucket / "ds/deltas/step_000007.safetensors").unlink()
    proc = run("verify", bucket, "--json", check=False)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["targets"] == [7] and report["unreachable"] == [7]
    assert [(p["key"], p["error"]) for p in report["bad_objects"]] == [("ds/deltas/step_000007.safetensors", "not found")]


def test_log_and_verify_refuse_a_directory_without_a_manifest(tmp_path, run):
    (tmp_path / "empty").mkdir()
    for command in ("log", "verify"):
        proc = run(command, tmp_path / "empty", check=False)
        assert proc.returncode == 1
        assert "has no manifest.json" in proc.stderr
