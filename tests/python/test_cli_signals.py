"""The CLI under signals and on buckets it did not create (issue 12):

- `demo --bucket DIR` never deletes a file it did not write;
- SIGINT/SIGTERM/SIGKILL to `demo` leave no replica process behind;
- SIGINT to `publish` leaves no temporary file;
- what a SIGKILLed `publish`, `serve --out` or `pull` leaves, `gc`, the next `serve` or the next `pull`
  removes.

Every wait is bounded, and every process a test starts is killed in `finally`.
"""
import json
import os
import queue
import socket
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

# The smallest demo: one decoder layer (the embedding still makes it ~170M
# parameters), one replica unless a test needs more.
SMALL_DEMO = ["--layers", "1", "--replicas", "1"]
MARKER = Path("ds") / "demo-bucket.json"


def run_demo(deltasync_bin, *args, cwd=None):
    return subprocess.run([deltasync_bin, "demo", *map(str, args)], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def write_checkpoint(path, elements, seed=0):
    rng = np.random.default_rng(seed)
    save_file({"w": rng.standard_normal(elements, dtype=np.float32)}, str(path))


def temp_files(root):
    """Temporary files (docs/format.md, "Temporary files") anywhere under root."""
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files
            if f.startswith(".tmp-") or f.startswith(".tmp\\")]


def children_of(pid):
    """Pids whose parent is pid (from /proc/*/stat)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def wait_until(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class LineReader:
    """Reads a pipe line by line in a thread, so that waits can time out."""

    def __init__(self, pipe):
        self.lines = queue.Queue()
        self.text = []
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self.thread.start()

    def _read(self, pipe):
        for line in pipe:
            self.text.append(line)
            self.lines.put(line)

    def wait_for(self, predicate, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if predicate(line):
                return line
        raise AssertionError("timed out; output so far:\n" + "".join(self.text))


def sigint_at_default():
    """preexec_fn of every CLI a test sends SIGINT to: the child starts with SIGINT at its default, as a
    command typed at a terminal does. A test run started in the background by a script (`.ci/run > log &`,
    nohup) inherits SIGINT ignored, and the CLI leaves an ignored signal ignored by design (nohup's
    contract), so the test's SIGINT would not reach it (the publish ran to the end, the demo did not stop)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_demo_until_first_version(deltasync_bin, bucket, *extra):
    """Starts a long demo and returns (proc, stdout reader, stderr reader, child pids) once version 1 is
    in the table."""
    proc = subprocess.Popen([deltasync_bin, "demo", "--bucket", str(bucket), "--layers", "1", "--steps", "50",
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_at_default)
    out, err = LineReader(proc.stdout), LineReader(proc.stderr)
    try:
        out.wait_for(lambda line: line.split()[:1] == ["1"], timeout=240)
    except AssertionError:
        proc.kill()
        raise
    return proc, out, err, children_of(proc.pid)


# --- the demo's bucket -----------------------------------------------------------------------------------


def test_demo_refuses_a_bucket_it_did_not_create_and_force_keeps_other_files(tmp_path, run, deltasync_bin):
    bucket = tmp_path / "b"
    ckpt = tmp_path / "ckpt.safetensors"
    write_checkpoint(ckpt, 64)
    run("publish", bucket, ckpt, "--version", "1")
    (bucket / "NOTES.txt").write_text("my notes\n")

    refused = run_demo(deltasync_bin, "--bucket", bucket, *SMALL_DEMO, "--steps", "1")
    assert refused.returncode == 1, refused.stderr
    assert "not created by 'deltasync demo'" in refused.stderr
    assert "--force" in refused.stderr
    assert (bucket / "NOTES.txt").read_text() == "my notes\n"
    assert (bucket / "manifest.json").exists()  # nothing deleted
    assert not (bucket / MARKER).exists()

    forced = run_demo(deltasync_bin, "--bucket", bucket, *SMALL_DEMO, "--steps", "1", "--force")
    assert forced.returncode == 0, forced.stderr
    assert (bucket / "NOTES.txt").read_text() == "my notes\n"
    assert (bucket / MARKER).exists()  # from now on the bucket is the demo's: no --force needed


def test_demo_reuses_its_own_default_bucket_and_keeps_other_files(tmp_path, deltasync_bin):
    # The README command, twice, from the same directory.
    first = run_demo(deltasync_bin, *SMALL_DEMO, "--steps", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    bucket = tmp_path / "deltasync-demo"
    assert (bucket / MARKER).exists()
    assert (bucket / "ds" / "deltas" / "step_000002.safetensors").exists()
    (bucket / "NOTES.txt").write_text("my notes\n")
    (bucket / "ds" / "deltas" / "keep-me.txt").write_text("mine\n")

    second = run_demo(deltasync_bin, *SMALL_DEMO, "--steps", "1", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert (bucket / "NOTES.txt").read_text() == "my notes\n"
    assert (bucket / "ds" / "deltas" / "keep-me.txt").read_text() == "mine\n"
    # The first run's objects are gone; the second run's are there.
    assert not (bucket / "ds" / "deltas" / "step_000002.safetensors").exists()
    assert (bucket / "ds" / "anchors" / "step_000001.safetensors").exists()


# --- signals to the demo ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sig,code,extra", [
    (signal.SIGTERM, 143, ["--replicas", "2"]),
    (signal.SIGINT, 130, ["--replicas", "1", "--serve"]),
], ids=["sigterm-follow", "sigint-serve"])
def test_signal_to_demo_stops_its_replicas_and_says_interrupted(tmp_path, deltasync_bin, sig, code, extra):
    proc, children = None, []
    try:
        proc, _, err, children = start_demo_until_first_version(deltasync_bin, tmp_path / "b", *extra)
        assert len(children) == int(extra[1]), children
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == code
        err.thread.join(timeout=10)
        stderr = "".join(err.text)
        assert "\ninterrupted\n" in "\n" + stderr.replace("\r\033[K", "\n"), repr(stderr)
        assert stderr.endswith("interrupted\n"), repr(stderr)
        assert wait_until(lambda: not any(alive(pid) for pid in children), timeout=5), children
        assert not temp_files(tmp_path / "b")
    finally:
        kill_all(children)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_sigkilled_demo_leaves_no_orphans(tmp_path, deltasync_bin):
    proc, children = None, []
    try:
        proc, _, _, children = start_demo_until_first_version(deltasync_bin, tmp_path / "b", "--replicas", "2")
        assert len(children) == 2, children
        proc.kill()
        proc.wait(timeout=10)
        # PR_SET_PDEATHSIG: the kernel sends each replica SIGTERM.
        assert wait_until(lambda: not any(alive(pid) for pid in children), timeout=10), children
    finally:
        kill_all(children)
        if proc is not None and proc.poll() is None:
            proc.kill()


def test_child_started_for_a_dead_parent_exits_at_once(tmp_path, deltasync_bin, run):
    # A `follow` replica whose demo died before it could ask for PR_SET_PDEATHSIG.
    ckpt = tmp_path / "ckpt.safetensors"
    write_checkpoint(ckpt, 64)
    run("publish", tmp_path / "b", ckpt, "--version", "1")
    env = dict(os.environ, DELTASYNC_PARENT_PID="999999999")
    proc = subprocess.run([deltasync_bin, "follow", str(tmp_path / "b"), "--until", "5"], env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "the demo that started this process is gone" in proc.stderr


# --- signals to publish ----------------------------------------------------------------------------------


@pytest.mark.parametrize("runner_sigint", [signal.SIG_DFL, signal.SIG_IGN], ids=["runner-default", "runner-ignores"])
def test_sigint_during_publish_leaves_no_temporary_file(tmp_path, deltasync_bin, runner_sigint):
    # 100M fp32 elements (400 MB): the bf16 anchor is ~200 MB, long enough to
    # catch its temporary file in the bucket. "runner-ignores": the tests run
    # as from a script in the background (SIGINT ignored, inherited).
    ckpt = tmp_path / "big.safetensors"
    write_checkpoint(ckpt, 100_000_000)
    bucket = tmp_path / "b"
    was = signal.signal(signal.SIGINT, runner_sigint)
    try:
        proc = subprocess.Popen([deltasync_bin, "publish", str(bucket), str(ckpt), "--version", "1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=sigint_at_default)
    finally:
        signal.signal(signal.SIGINT, was)
    try:
        deadline = time.monotonic() + 120
        seen = []
        while not seen and proc.poll() is None and time.monotonic() < deadline:
            seen = temp_files(bucket) if bucket.exists() else []
        assert seen, f"no temporary file appeared (publish exited {proc.poll()})"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        # Killed by the signal, not finished: the test caught the write.
        assert proc.returncode == -signal.SIGINT, proc.stderr.read()
        assert temp_files(bucket) == [], temp_files(bucket)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_sigterm_to_serve_mid_export_leaves_no_temporary_file(tmp_path, deltasync_bin, run):
    # serve handles SIGTERM itself: it finishes the --out file it is writing
    # (then renames it) and exits 0, so no temporary file stays.
    ckpt = tmp_path / "big.safetensors"
    write_checkpoint(ckpt, 60_000_000)
    bucket, out_dir = tmp_path / "b", tmp_path / "out"
    run("publish", bucket, ckpt, "--version", "1")
    proc = subprocess.Popen([deltasync_bin, "serve", "--bucket", str(bucket), "--listen", "127.0.0.1:0",
                             "--out", str(out_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        seen = []
        while not seen and proc.poll() is None and time.monotonic() < deadline:
            seen = temp_files(out_dir) if out_dir.exists() else []
        assert seen, f"no temporary file appeared (serve exited {proc.poll()})"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        assert temp_files(out_dir) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


# --- what SIGKILL leaves, and who removes it ---------------------------------------------------------------


def catch_temp_file_then_kill(proc, root):
    """Waits for a temporary file under root, SIGKILLs proc; returns the files left."""
    deadline = time.monotonic() + 120
    seen = []
    while not seen and proc.poll() is None and time.monotonic() < deadline:
        seen = temp_files(root) if root.exists() else []
    assert seen, f"no temporary file appeared (exited {proc.poll()})"
    proc.kill()
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return temp_files(root)


def test_sigkilled_publish_leaves_a_temporary_that_gc_removes(tmp_path, deltasync_bin, run):
    ckpt = tmp_path / "big.safetensors"
    write_checkpoint(ckpt, 60_000_000)
    bucket = tmp_path / "b"
    proc = subprocess.Popen([deltasync_bin, "publish", str(bucket), str(ckpt), "--version", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        left = catch_temp_file_then_kill(proc, bucket)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert left, "SIGKILL gave no chance to clean up: the temporary file must still be there"
    host = "".join(c if c.isalnum() or c == "." else "_" for c in socket.gethostname())[:40]
    for path in left:
        name = os.path.basename(path)
        assert "\\" not in name
        assert name.startswith(f".tmp-{host}-{proc.pid}-"), name
    # Too young for the default age: kept.
    kept = json.loads(run("gc", bucket, "--json").stdout)
    assert kept["temporaries"] == {"removed_files": 0, "removed_bytes": 0, "kept_files": len(left)}
    assert sorted(temp_files(bucket)) == sorted(left)
    # Age 0: its writer is gone, so it goes.
    size = sum(os.path.getsize(p) for p in left)
    gone = json.loads(run("gc", bucket, "--temp-older-than", "0", "--json").stdout)
    assert gone["temporaries"] == {"removed_files": len(left), "removed_bytes": size, "kept_files": 0}
    assert temp_files(bucket) == []
    text = run("gc", bucket, "--temp-older-than", "0").stdout
    assert "removed 0 stale temporary file(s)" in text, text


def test_pull_removes_what_a_sigkilled_pull_left_beside_its_output(tmp_path, run):
    """A pull SIGKILLed mid-write leaves its temporary file (or half-built folder) beside OUT; the soak found
    that nothing ever removed it. The next pull to the same path removes those whose writer is gone."""
    ckpt = tmp_path / "c.safetensors"
    write_checkpoint(ckpt, 1000)
    bucket = tmp_path / "b"
    run("publish", bucket, ckpt, "--version", "1")
    host = "".join(c if c.isalnum() or c == "." else "_" for c in socket.gethostname())[:40]
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, live, hexa = gone.pid, os.getpid(), "0123456789abcdef"
    out = tmp_path / "out"
    out.mkdir()
    removed = [out / f".tmp-{host}-{dead}-{hexa}-model.safetensors", out / f".tmp\\model.safetensors.{dead}.{hexa}"]
    kept = [out / f".tmp-{host}-{live}-{hexa}-model.safetensors",  # a running writer's
            out / f".tmp-{host}-{dead}-{hexa}-other.safetensors",  # another output's
            out / f".tmp-elsewhere-{dead}-{hexa}-model.safetensors"]  # another host's (a shared file system)
    folder = out / f".tmp-{host}-{dead}-{hexa}-model"  # a half-built --hf-dir folder
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x" * 100)
    for f in removed + kept:
        f.write_bytes(b"x" * 100)
    run("pull", bucket, "-o", out / "model.safetensors")
    assert [f.name for f in removed if f.exists()] == []
    assert [f.name for f in kept if not f.exists()] == []
    assert folder.exists()
    run("pull", bucket, "--hf-dir", out / "model")
    assert not folder.exists()
    assert (out / "model" / "model.safetensors").exists()
    assert sorted(f.name for f in out.iterdir() if f.name.startswith(".tmp")) == sorted(f.name for f in kept)


def test_restarted_serve_removes_what_a_sigkilled_one_left_in_out(tmp_path, deltasync_bin, run):
    ckpt = tmp_path / "big.safetensors"
    write_checkpoint(ckpt, 60_000_000)
    bucket, out_dir = tmp_path / "b", tmp_path / "out"
    run("publish", bucket, ckpt, "--version", "1")
    serve = [deltasync_bin, "serve", "--bucket", str(bucket), "--listen", "127.0.0.1:0", "--out", str(out_dir),
             "--out-layout", "file"]
    proc = subprocess.Popen(serve, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        left = catch_temp_file_then_kill(proc, out_dir)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert left
    again = subprocess.Popen(serve, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_until(lambda: (out_dir / "latest.json").exists(), 120), "the restarted serve exported nothing"
        assert not any(os.path.exists(p) for p in left), left
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=60) == 0
        assert temp_files(out_dir) == []
    finally:
        if again.poll() is None:
            again.kill()
            again.wait(timeout=10)
