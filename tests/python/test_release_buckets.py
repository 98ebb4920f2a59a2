"""Buckets written by earlier releases still read, bit for bit.

Every folder under tests/python/data/release_buckets/ is a bucket as a release wrote it (with
tests/python/data/make_release_bucket.py, by that release's CLI) and the state each of its versions must pull to.
A later release that changes a stream, container or manifest version must still read them: `verify --all`
passes, and `pull` of every version gives exactly the expected tensors (names, dtypes, shapes, bytes), checked
with the official safetensors package.
"""
import json
import shutil
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("ml_dtypes")  # registers bfloat16 with numpy, for safetensors.numpy
safetensors_numpy = pytest.importorskip("safetensors.numpy")

DATA = Path(__file__).resolve().parent / "data" / "release_buckets"
RELEASES = sorted(p.name for p in DATA.iterdir() if (p / "bucket" / "manifest.json").is_file())


def test_there_is_a_release_bucket():
    assert RELEASES, f"no release bucket under {DATA}"


@pytest.fixture(params=RELEASES)
def release(request, tmp_path):
    """A copy of one release's folder (the checked-in files stay untouched)."""
    shutil.copytree(DATA / request.param, tmp_path / request.param)
    return tmp_path / request.param


def expected_versions(release: Path) -> list[int]:
    return sorted(int(p.stem[1:]) for p in (release / "expected").glob("v*.safetensors"))


def test_the_release_bucket_covers_what_it_is_for(release, run):
    """The log names every version expected, and every kind of object the generator meant to write."""
    log = json.loads(run("log", release / "bucket", "--json").stdout)
    versions = [v["version"] for v in log["versions"]]
    assert versions == expected_versions(release)
    kinds = {(o["role"], o["encoding"]) for v in log["versions"] for o in v["objects"]}
    assert {("anchor", "compact"), ("delta", "compact"), ("delta", "gap_delta")} <= kinds, kinds
    assert any(role == "cumulative" for role, _ in kinds), kinds
    # Compact deltas in both stream versions (version 3 names its tables in the header's metadata).
    from safetensors import safe_open
    tables = set()
    for v in log["versions"]:
        for o in v["objects"]:
            if (o["role"], o["encoding"]) == ("delta", "compact"):
                with safe_open(str(release / "bucket" / o["key"]), framework="numpy") as f:
                    tables.add("deltasync_compact_tables" in (f.metadata() or {}))
    assert tables == {True, False}, "compact deltas of stream versions 2 and 3 expected"


def test_the_release_bucket_verifies(release, run):
    run("verify", release / "bucket", "--all")


def test_every_version_pulls_to_the_expected_tensors(release, run, tmp_path):
    for v in expected_versions(release):
        out = tmp_path / f"pulled_v{v}.safetensors"
        run("pull", release / "bucket", "-o", out, "--version", v, "--quiet")
        got = safetensors_numpy.load_file(str(out))
        want = safetensors_numpy.load_file(str(release / "expected" / f"v{v}.safetensors"))
        assert sorted(got) == sorted(want), f"version {v}"
        for name, w in want.items():
            g = got[name]
            assert (g.dtype, g.shape) == (w.dtype, w.shape), f"version {v}: {name}"
            assert g.tobytes() == w.tobytes(), f"version {v}: {name} differs"
