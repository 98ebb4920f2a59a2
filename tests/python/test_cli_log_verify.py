"""`deltasync log` (alias `ls`) and `deltasync verify` on buckets published
with the CLI, cumulative deltas included: log's lines and JSON against the
manifest; verify passes a good bucket and names the object it finds bad."""
import json
from datetime import datetime, timezone

from safetensors.numpy import save_file

from test_cli_compact import publish_versions
from test_safetensors_interop import make_weights, nudge


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
        "file_objects": 0, "file_bytes": 0,
    }
    assert all(v["files"] is None for v in out["versions"])  # published from plain files


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


def published_folders(run, tmp_path):
    """Versions 1-4 from model folders: config.json changes at 3, chat_template.jinja
    arrives at 3, tokenizer_config.json leaves at 4."""
    bucket, weights = tmp_path / "bucket", make_weights(30)
    side = {1: {"config.json": '{"a": 1}', "tokenizer_config.json": "{}"},
            2: {"config.json": '{"a": 1}', "tokenizer_config.json": "{}"},
            3: {"config.json": '{"a": 3}', "tokenizer_config.json": "{}", "chat_template.jinja": "{{ x }}"},
            4: {"config.json": '{"a": 3}', "chat_template.jinja": "{{ x }}"}}
    for v in range(1, 5):
        if v > 1:
            weights = nudge(weights, 0.03, v)
        folder = tmp_path / f"ckpt{v}"
        folder.mkdir()
        save_file(weights, folder / "model.safetensors")
        for name, text in side[v].items():
            (folder / name).write_text(text)
        run("publish", bucket, folder, "--version", v)
    return bucket


def test_log_shows_side_file_changes(tmp_path, run):
    bucket = published_folders(run, tmp_path)
    out = json.loads(run("log", bucket, "--json").stdout)
    files = {v["version"]: v["files"] for v in out["versions"]}
    assert files[1] == {"count": 2, "bytes": 10, "added": ["config.json", "tokenizer_config.json"],
                        "changed": [], "removed": []}
    assert files[2] is None  # the set of version 1, unchanged
    assert files[3] == {"count": 3, "bytes": 17, "added": ["chat_template.jinja"], "changed": ["config.json"],
                        "removed": []}
    assert files[4] == {"count": 2, "bytes": 15, "added": [], "changed": [], "removed": ["tokenizer_config.json"]}
    # Distinct objects: two configs, the tokenizer config, the template.
    assert (out["totals"]["file_objects"], out["totals"]["file_bytes"]) == (4, 8 + 2 + 8 + 7)

    lines = run("log", bucket).stdout.splitlines()
    rows = {int(line.split()[0]): line for line in lines[2:-2]}
    assert rows[1].endswith("; files: 2 (10 B)"), rows[1]
    assert "files" not in rows[2]
    assert rows[3].endswith("; files: 3 (17 B), config.json changed, chat_template.jinja added"), rows[3]
    assert rows[4].endswith("; files: 2 (15 B), tokenizer_config.json removed"), rows[4]
    assert lines[-1] == "side files: 4 object(s), 25 B"


def test_verify_checks_side_files(tmp_path, run):
    bucket = published_folders(run, tmp_path)
    m = manifest_of(bucket)
    config3 = m["versions"][2]["files"]["config.json"]["key"]
    template = m["versions"][2]["files"]["chat_template.jinja"]["key"]
    report = json.loads(run("verify", bucket, "--all", "--json").stdout)
    assert report["ok"] and report["objects_checked"] == len(
        [o for v in m["versions"] for o in v["objects"]]) + 4

    (bucket / config3).write_text('{"a": 4}')  # same size, other bytes
    (bucket / template).unlink()
    proc = run("verify", bucket, check=False)
    assert proc.returncode == 1
    # Version 4's set, as version 4 lists it.
    assert f"bad object: {config3} (version 4): side file config.json ({config3}): XXH3-128 " in proc.stdout
    assert f"bad object: {template} (version 4): side file chat_template.jinja" in proc.stdout
    assert "failed verification: 2 bad object(s)" in proc.stderr
    report = json.loads(run("verify", bucket, "--all", "--json", check=False).stdout)
    assert not report["ok"] and report["unreachable"] == []
    assert sorted((p["version"], p["key"], p["error"]) for p in report["bad_objects"]) == sorted(
        [(3, config3, "integrity"), (3, template, "not found"), (4, config3, "integrity"), (4, template, "not found")])
