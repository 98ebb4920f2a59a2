"""`serve --out` writes model folders (issue 11, item 4): every version the
daemon holds appears as OUT/step_NNNNNN/ with its original sharding and side
files, OUT/latest links the newest, and from_pretrained(OUT/latest) gives the
trainer's bf16 weights bit for bit; --keep 2 prunes the daemon's old folders
and nothing else."""
import json
import signal
import subprocess
import time

import pytest

pytest.importorskip("torch")  # DS_WITH_TORCH=0 installs leave torch out
from test_hf_folders import VERSIONS, assert_loads_as, history, shard_names  # noqa: E402,F401 (history: fixture)


def latest_version(out):
    try:
        return json.loads((out / "latest.json").read_text())["version"]
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def test_serve_out_folders_load_with_from_pretrained(history, deltasync_bin, run, tmp_path):
    bucket, out = tmp_path / "bucket", tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("the engine's own file")
    run("publish", bucket, history["folders"][1], "--version", 1)
    daemon = subprocess.Popen([deltasync_bin, "serve", "--bucket", str(bucket), "--out", str(out), "--keep", "2",
                               "--listen", "127.0.0.1:0", "--poll", "0.2", "--threads", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for v in VERSIONS:
            if v > 1:
                run("publish", bucket, history["folders"][v], "--version", v)
            deadline = time.monotonic() + 60
            while latest_version(out) != v and daemon.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert latest_version(out) == v, f"serve exited {daemon.poll()}"
            folder = f"step_{v:06d}"
            assert (out / "latest").readlink().as_posix() == folder  # relative
            latest = json.loads((out / "latest.json").read_text())
            assert latest["dir"] == folder and latest["file"] == f"{folder}/model.safetensors.index.json"
            ckpt = history["folders"][v]
            assert shard_names(out / "latest") == shard_names(ckpt) and len(shard_names(ckpt)) == 3
            assert latest["size"] == sum((out / folder / name).stat().st_size for name in shard_names(ckpt))
            for name in ("config.json", "tokenizer.json", "chat_template.jinja"):
                assert (out / "latest" / name).read_bytes() == (ckpt / name).read_bytes(), (v, name)
            assert not (out / "latest" / "optimizer.pt").exists()
            assert_loads_as(out / "latest", history, v)
        assert sorted(p.name for p in out.iterdir()) == ["latest", "latest.json", "notes.txt", "step_000004",
                                                         "step_000005"]
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0, daemon.stderr.read()
