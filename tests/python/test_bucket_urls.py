"""Bucket arguments: a misspelt URL is refused (never a local directory), `~` is expanded in Python."""
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

import deltasync

BAD = [("s3:/mybucket/run1", "s3://mybucket/run1"), ("S3://bucket", "s3://bucket"),
       ("file:/data/x", "file:///data/x"), ("run:1", "./run:1")]


@pytest.mark.parametrize("url,hint", BAD)
def test_python_refuses_malformed_urls(tmp_path, monkeypatch, url, hint):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(deltasync.InvalidArgumentError, match="file:///abs/dir or s3://bucket/prefix") as err:
        deltasync.Publisher(url)
    assert hint in str(err.value)
    with pytest.raises(deltasync.InvalidArgumentError):
        deltasync.Replica(url)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("url,hint", BAD)
def test_cli_refuses_malformed_urls(tmp_path, monkeypatch, run, url, hint):
    save_file({"w": np.ones((4, 4), np.float32)}, str(tmp_path.parent / f"{tmp_path.name}.safetensors"))
    monkeypatch.chdir(tmp_path)
    proc = run("publish", url, tmp_path.parent / f"{tmp_path.name}.safetensors", "--version", 1, check=False)
    assert proc.returncode == 1, proc.stderr
    assert hint in proc.stderr and "s3://bucket/prefix" in proc.stderr
    assert os.listdir(tmp_path) == []


def test_tilde_is_expanded(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    with deltasync.Publisher("~/b") as pub:
        pub.publish(1, {"w": np.ones((4, 4), np.float32)})
    assert pub.bucket == str(home / "b")
    assert (home / "b" / "manifest.json").exists()
    assert os.listdir(work) == []
    replica = deltasync.Replica("~/b")
    assert replica.update() == 1
