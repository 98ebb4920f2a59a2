"""Shared fixtures: the deltasync binary and helpers to run it."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def deltasync_bin() -> str:
    path = os.environ.get("DELTASYNC_BIN", str(ROOT / "build" / "deltasync"))
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is not built; run scripts/build.sh first")
    return path


@pytest.fixture
def run(deltasync_bin):
    """Runs `deltasync ARGS...`; returns the CompletedProcess."""

    def _run(*args, check=True):
        proc = subprocess.run([deltasync_bin, *map(str, args)], capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(f"deltasync {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}")
        return proc

    return _run


@pytest.fixture
def bucket(tmp_path) -> str:
    """A fresh local bucket directory (not created yet: the Publisher creates it)."""
    return str(tmp_path / "bucket")
