"""The CLI as a new user meets it (issue 12): help and usage errors in the
user's words, messages for files that are not safetensors and for renamed
tensors, output that fits pipes (--json, --quiet, no progress line), inspect,
and `serve BUCKET`."""
import json
import os
import re
import signal
import subprocess
import time
import zipfile

import pytest
from safetensors.numpy import save_file

from test_safetensors_interop import make_weights, nudge


def publish(run, bucket, weights, tmp_path, version, *extra):
    path = tmp_path / f"v{version}.safetensors"
    save_file(weights, path)
    return run("publish", bucket, path, "--version", version, *extra)


# --- the parser -------------------------------------------------------------

def test_no_arguments_prints_the_help_and_is_a_usage_error(run):
    proc = run(check=False)
    assert proc.returncode == 2
    assert "publish" in proc.stderr and "Usage: deltasync" in proc.stderr


def test_help_and_help_command(run):
    top = run("help")
    assert "publish" in top.stdout and "pull" in top.stdout
    sub = run("help", "publish")
    assert "Usage: deltasync publish" in sub.stdout
    assert "Example:" in sub.stdout
    bad = run("help", "pubish", check=False)
    assert bad.returncode == 2
    assert "did you mean 'publish'?" in bad.stderr


def test_unknown_command_suggests_the_nearest(run):
    proc = run("pubish", "b", "f", check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("deltasync: usage error: unknown command 'pubish' (did you mean 'publish'?)")
    assert "did you mean" not in run("frobnicate", check=False).stderr


@pytest.mark.parametrize("args,message", [
    (["publish", "b", "f", "--version", "0"], "--version must be >= 1, not 0"),
    (["publish", "b", "f", "--version", "abc"], "--version must be a whole number >= 1, not 'abc'"),
    (["publish", "b", "f", "--version", "1", "--encoding", "compat"],
     "--encoding must be compact, gap_delta or raw, not 'compat' (did you mean 'compact'?)"),
    (["demo", "--layers", "30"], "--layers must be from 1 to 28, not 30"),
    (["gc", "b", "--abort-uploads-older-than", "-1"], "--abort-uploads-older-than must be >= 0, not -1"),
    (["gc", "b", "--temp-older-than", "-1"], "--temp-older-than must be >= 0, not -1"),
    (["serve", "b", "--poll", "0"], "--poll must be > 0, not 0"),
])
def test_range_errors_in_the_users_words(run, args, message):
    proc = run(*args, check=False)
    assert proc.returncode == 2
    assert f"deltasync: usage error: {message}" in proc.stderr
    assert "not in range" not in proc.stderr


@pytest.mark.parametrize("command", ["diff", "apply", "inspect", "publish", "pull", "gc", "bench", "demo", "serve"])
def test_every_help_describes_its_arguments_and_gives_an_example(run, command):
    text = run(command, "--help").stdout
    assert f"Usage: deltasync {command}" in text
    assert "Example:\n  deltasync " + command in text
    # Every positional and option has a description: a signature line is
    # followed by text on the same line or on the next (indented) one.
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("  -") or (line.startswith("  ") and " TEXT" in line and not line.startswith("   ")):
            same = len(line) > 32 and line[30:32] == "  " and line[32:].strip()
            nxt = i + 1 < len(lines) and lines[i + 1].startswith(" " * 32) and lines[i + 1].strip()
            assert same or nxt, f"no description: {line!r}"
    if command == "publish":
        # The bucket's settings are unset unless given: the help says so.
        assert "(default: the bucket's setting; 10 for a new bucket)" in text
        assert "(default: the bucket's setting; compact for a new bucket)" in text
    if command == "demo":
        assert "--steps UINT:>= 1 (default: 20)" in text


# --- messages ---------------------------------------------------------------

def _not_safetensors(run, path):
    proc = run("inspect", path, check=False)
    assert proc.returncode == 1
    return proc.stderr.strip()


def test_files_that_are_not_safetensors_say_what_they_look_like(run, tmp_path):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": {"a": "model-00001.safetensors"}}))
    assert _not_safetensors(run, index) == f"deltasync: error: {index}: not a safetensors file (it looks like JSON)"

    pickle = tmp_path / "pytorch_model.bin"
    pickle.write_bytes(bytes([0x80, 0x02, 0x7D, 0x71, 0x00, 0x28, 0x58, 0x01, 0x00, 0x00, 0x00]) + b"a" * 40)
    assert _not_safetensors(run, pickle).endswith("not a safetensors file (it looks like a PyTorch pickle)")

    archive = tmp_path / "model.bin"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    assert _not_safetensors(run, archive).endswith("not a safetensors file (it looks like a zip archive (PyTorch .bin?))")

    notes = tmp_path / "NOTES.txt"
    notes.write_text("checkpoints of run 17, see the wiki\n")
    assert _not_safetensors(run, notes).endswith("not a safetensors file (it looks like text)")

    good = tmp_path / "good.safetensors"
    save_file(make_weights(1), good)
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-100])
    assert _not_safetensors(run, cut).endswith("(truncated?)")
    cut.write_bytes(good.read_bytes()[:40])
    assert _not_safetensors(run, cut).endswith("(truncated?)")


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod."])
def test_renamed_tensors_name_the_prefix(run, bucket, tmp_path, prefix):
    weights = make_weights(2)
    publish(run, bucket, weights, tmp_path, 1)
    renamed = {prefix + k: v for k, v in weights.items()}
    save_file(renamed, tmp_path / "renamed.safetensors")
    proc = run("publish", bucket, tmp_path / "renamed.safetensors", "--version", 2, check=False)
    assert proc.returncode == 1
    assert f"all 3 tensors missing, 3 new; they differ by the prefix '{prefix}'" in proc.stderr
    # diff says the same, and nothing about "published".
    proc = run("diff", tmp_path / "v1.safetensors", tmp_path / "renamed.safetensors", "-o", tmp_path / "d", check=False)
    assert proc.returncode == 1
    assert f"they differ by the prefix '{prefix}'" in proc.stderr
    assert "published" not in proc.stderr


def test_diff_shape_mismatch_does_not_say_published(run, tmp_path):
    old = make_weights(3)
    new = dict(old)
    new["model.norm.weight"] = new["model.norm.weight"][:32]
    save_file(old, tmp_path / "old.safetensors")
    save_file(new, tmp_path / "new.safetensors")
    proc = run("diff", tmp_path / "old.safetensors", tmp_path / "new.safetensors", "-o", tmp_path / "d", check=False)
    assert proc.returncode == 1
    assert "tensor 'model.norm.weight': shape [32] does not match the base's [64]" in proc.stderr
    assert "published" not in proc.stderr


def test_no_internal_names_in_messages(run, tmp_path):
    weights = make_weights(4)
    weights["model.norm.weight"][3] = float("nan")
    save_file(weights, tmp_path / "nan.safetensors")
    proc = run("publish", tmp_path / "b", tmp_path / "nan.safetensors", "--version", 1, check=False)
    assert proc.returncode == 1
    assert "--allow-nonfinite" in proc.stderr and "DetectOptions" not in proc.stderr
    proc = run("pull", tmp_path / "missing", "-o", tmp_path / "o.safetensors", check=False)
    assert proc.returncode == 1
    assert "open with create" not in proc.stderr
    # The bucket is named once, not "X: X:".
    proc = run("serve", tmp_path / "missing", "--listen", "127.0.0.1:0", check=False)
    assert proc.returncode == 1
    missing = str(tmp_path / "missing")
    assert proc.stderr.count(missing) == 1, proc.stderr


# --- output for pipes and logs -----------------------------------------------

def test_publish_pull_gc_json_and_quiet(run, bucket, tmp_path):
    w1 = make_weights(5)
    out = json.loads(publish(run, bucket, w1, tmp_path, 1, "--json").stdout)
    assert out["version"] == 1 and out["wrote_anchor"] is True and out["wrote_delta"] is False
    assert out["changed_elements"] == out["total_elements"] > 0
    assert len(out["state_hash"]) == 32
    quiet = publish(run, bucket, nudge(w1, 0.1, 6), tmp_path, 2, "--quiet")
    assert quiet.stdout == "" and quiet.stderr == ""

    pulled = json.loads(run("pull", bucket, "-o", tmp_path / "p.safetensors", "--json").stdout)
    assert pulled["version"] == 2 and pulled["anchors_applied"] == 1 and pulled["deltas_applied"] == 1
    assert pulled["bytes_downloaded"] > 0 and pulled["output"] == str(tmp_path / "p.safetensors")
    # The one compact delta applied in place, filling the class totals (none held yet).
    assert (pulled["compact_applies"], pulled["held_applies"], pulled["stale_applies"]) == (1, 0, 0)
    assert run("pull", bucket, "-o", tmp_path / "q.safetensors", "-q").stdout == ""

    gc = json.loads(run("gc", bucket, "--keep-anchors", "1", "--dry-run", "--json").stdout)
    assert gc["dry_run"] is True and gc["pruned"]["kept_anchors"] == [1] and gc["aborted_uploads"] is None
    assert run("gc", bucket, "--keep-anchors", "1", "--quiet").stdout == ""
    assert run("gc", bucket, "--json", "--quiet", check=False).returncode == 2


def test_no_progress_line_on_a_pipe(run, tmp_path):
    proc = run("demo", "--bucket", tmp_path / "demo", "--layers", 2, "--steps", 3, "--replicas", 1)
    assert "\r" not in proc.stderr and "\033[" not in proc.stderr
    assert "\r" not in proc.stdout and "\033[" not in proc.stdout
    pulled = run("pull", tmp_path / "demo", "-o", tmp_path / "p.safetensors")
    assert "\r" not in pulled.stderr and pulled.stderr == ""


# --- inspect ----------------------------------------------------------------

def test_inspect_lists_what_a_user_needs(run, bucket, tmp_path):
    w1 = make_weights(7)
    publish(run, bucket, w1, tmp_path, 1)
    publish(run, bucket, nudge(w1, 0.05, 8), tmp_path, 2)
    anchor = os.path.join(bucket, "ds", "anchors", "step_000001.safetensors")
    delta = os.path.join(bucket, "ds", "deltas", "step_000002.safetensors")

    # A compact delta in one tensor (container 2) lists the changed tensors
    # by index in the base's name order; --base names them.
    base = tmp_path / "v1.safetensors"
    d = json.loads(run("inspect", delta, "--json", "--base", base).stdout)
    assert d["kind"] == "delta" and d["container"] == 2
    names = {t["name"] for t in d["changed_tensors"]}
    assert names and names <= set(w1) and not any(n.endswith(".cmp") for n in names)
    assert all(sorted(w1)[t["base_index"]] == t["name"] for t in d["changed_tensors"])
    assert sum(t["changed"] for t in d["changed_tensors"]) == d["changed_elements"]
    text = run("inspect", delta, "--base", base).stdout
    assert "changed tensors (" in text and "model.layers.0.mlp.up_proj.weight" in text
    bare = json.loads(run("inspect", delta, "--json").stdout)
    assert [t["name"] for t in bare["changed_tensors"]] == [None] * len(d["changed_tensors"])
    assert [t["base_index"] for t in bare["changed_tensors"]] == [t["base_index"] for t in d["changed_tensors"]]
    assert "(name it with --base)" in run("inspect", delta).stdout
    # A base other than the delta's is refused, not used to name tensors.
    wrong = run("inspect", delta, "--base", tmp_path / "v2.safetensors", check=False)
    assert wrong.returncode == 1 and "not the delta's base state hash" in wrong.stderr

    a = json.loads(run("inspect", anchor, "--json").stdout)
    assert {t["name"] for t in a["tensors"]} == set(w1)
    assert all(t["dtype"] == "BF16" for t in a["tensors"])
    assert {tuple(t["shape"]) for t in a["tensors"]} == {w.shape for w in w1.values()}
    assert ".zan" not in run("inspect", anchor).stdout

    plain = tmp_path / "v1.safetensors"
    p = json.loads(run("inspect", plain, "--json").stdout)
    assert p["kind"] == "plain" and p["bytes_per_changed_element"] is None
    assert "bytes per changed element" not in run("inspect", plain).stdout


# --- serve ------------------------------------------------------------------

def test_serve_takes_the_bucket_as_a_positional_and_logs_with_time_and_level(deltasync_bin, run, bucket, tmp_path):
    publish(run, bucket, make_weights(9), tmp_path, 1)
    env = dict(os.environ, DELTASYNC_LOG_LEVEL="debug")
    # "--listen 0": a bare port, on loopback.
    proc = subprocess.Popen([deltasync_bin, "serve", bucket, "--listen", "0", "--poll", "0.05"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:")
        time.sleep(0.5)  # a few polls, each logged at debug
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = err.splitlines()
    assert lines
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (debug|info|warn|error) deltasync serve: "
    assert all(re.match(stamp, l) for l in lines), err
    assert any(" info deltasync serve: following " in l for l in lines)
    assert any(" debug deltasync serve: up to date: holding version 1" in l for l in lines)

    # Both forms agree; different ones are a usage error; none is one too.
    assert run("serve", bucket, "--bucket", tmp_path / "other", check=False).returncode == 2
    assert run("serve", check=False).returncode == 2
    assert run("serve", bucket, "--log-level", "loud", check=False).returncode == 2


def test_serve_waits_for_the_first_version_without_an_error(deltasync_bin, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = subprocess.Popen([deltasync_bin, "serve", "--bucket", str(empty), "--listen", "127.0.0.1:0",
                             "--log-level", "info"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("listening on")
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert "info deltasync serve: waiting for the first version" in err
    assert " error " not in err and "failed" not in err
    assert " debug " not in err  # --log-level info


def test_python_renamed_tensors_say_the_same(bucket):
    """Publisher.publish (C++ detection) and the torch sparse path use the CLI's wording."""
    deltasync = pytest.importorskip("deltasync")
    weights = make_weights(10)
    with deltasync.Publisher(bucket) as pub:
        pub.publish(1, weights)
        with pytest.raises(deltasync.InvalidArgumentError, match="they differ by the prefix 'module.'"):
            pub.publish(2, {"module." + k: v for k, v in weights.items()})
    torch = pytest.importorskip("torch")
    import deltasync.torch as dt
    tensors = {k: torch.from_numpy(v) for k, v in weights.items()}
    with deltasync.Publisher(bucket + "-sparse") as pub:
        dt.publish(pub, 1, tensors, sparse=True)
        with pytest.raises(deltasync.InvalidArgumentError,
                           match=r"all 3 tensors missing, 3 new; they differ by the prefix '_orig_mod\.'"):
            dt.publish(pub, 2, {"_orig_mod." + k: t for k, t in tensors.items()}, sparse=True)
