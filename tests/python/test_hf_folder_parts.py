"""`deltasync publish BUCKET DIR --parts per-file` (issue 13, item 5): a sharded
Hugging Face folder, written with the official `safetensors` package, published
as one part per shard file over several versions; `pull` is bit-exact with the
folder every version, `log --json` shows the parts, `verify --all` passes, a
refused setting names itself, and a part that fails mid-publish commits nothing.
"""
import json
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # DS_WITH_TORCH=0 installs leave torch out
from safetensors.torch import load_file, save_file  # noqa: E402

SHARDS = [  # tensors per shard file, with their shapes and dtypes
    {"model.embed_tokens.weight": ((37, 16), torch.bfloat16), "model.norm.weight": ((16,), torch.float32)},
    {"model.layers.0.mlp.up_proj.weight": ((48, 16), torch.bfloat16),
     "model.layers.0.self_attn.q_proj.weight": ((16, 16), torch.bfloat16)},
    {"lm_head.weight": ((37, 16), torch.bfloat16), "model.layers.0.input_layernorm.weight": ((16,), torch.bfloat16)},
]


def write_folder(path: Path, tensors: dict, shards=SHARDS, config=None):
    """save_pretrained's layout: model-0000k-of-0000K.safetensors, the index, config.json."""
    path.mkdir(parents=True)
    weight_map = {}
    for k, names in enumerate(shards, 1):
        name = "model.safetensors" if len(shards) == 1 else f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in names}, str(path / name), metadata={"format": "pt"})
        weight_map.update({n: name for n in names})
    if len(shards) > 1:
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2))
    (path / "config.json").write_text(json.dumps(config or {"model_type": "llama"}))
    return path


def step(tensors: dict, seed: int):
    """A training step: about 5% of each tensor's elements move."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in tensors.items():
        mask = torch.rand(t.shape, generator=g) < 0.05
        out[name] = torch.where(mask, t.float() + 0.01 * torch.randn(t.shape, generator=g), t.float()).to(t.dtype)
    return out


def initial():
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(shape, generator=g).to(dt) for s in SHARDS for n, (shape, dt) in s.items()}


def assert_pulled(run, bucket, folder: Path, version: int, out: Path):
    """`pull` of `version` equals the folder's tensors in bf16, bit for bit."""
    run("pull", bucket, "-o", out, "--version", version)
    got = load_file(str(out))
    want = {}
    for f in sorted(folder.glob("*.safetensors")):
        want.update({n: t.to(torch.bfloat16) for n, t in load_file(str(f)).items()})
    assert sorted(got) == sorted(want)
    for name, t in want.items():
        assert torch.equal(got[name].view(torch.int16), t.view(torch.int16)), f"version {version}: {name}"


def publish(run, bucket, folder, version, *extra, check=True):
    proc = run("publish", bucket, folder, "--version", version, "--parts", "per-file", "--json", *extra, check=check)
    return json.loads(proc.stdout) if proc.returncode == 0 else proc


def test_sharded_folder_published_one_part_per_file(tmp_path, bucket, run):
    tensors = initial()
    config = {"model_type": "llama", "rope_theta": 10000.0}
    for v in range(1, 6):
        if v > 1:
            tensors = step(tensors, v)
        if v == 3:
            config = {"model_type": "llama", "rope_theta": 20000.0}  # the side file changes at 3 only
        folder = write_folder(tmp_path / f"ckpt-{v}", tensors, config=config)
        out = publish(run, bucket, folder, v, "--anchor-interval", "3")
        assert out["parts"] == 3
        assert out["weight_files"] == 3
        assert out["wrote_delta"] == (v > 1)
        assert out["wrote_anchor"] == (v in (1, 3))
        assert_pulled(run, bucket, folder, v, tmp_path / f"pulled-{v}.safetensors")

    log = json.loads(run("log", bucket, "--json").stdout)
    assert [e["parts"] for e in log["versions"]] == [3] * 5
    v4 = log["versions"][3]
    (delta,) = v4["objects"]
    assert [p["key"] for p in delta["parts"]] == [
        f"ds/parts/step_000004.delta_from_000003.part_{p:05d}_of_00003.safetensors" for p in range(3)]
    assert "in 3 parts" in run("log", bucket).stdout
    assert run("verify", bucket, "--all").returncode == 0

    # inspect of a part object: which part, its blocks (the whole tensors of its file), the part's counts.
    key = Path(bucket) / "ds/parts/step_000004.delta_from_000003.part_00001_of_00003.safetensors"
    info = json.loads(run("inspect", key, "--json").stdout)
    assert (info["kind"], info["model_version"], info["base_version"]) == ("delta", 4, 3)
    assert {k: info["part"][k] for k in ("part", "parts", "listed")} == {"part": 1, "parts": 3, "listed": True}
    assert len(info["part"]["layout"]) == 32
    assert info["part"]["blocks"] == [{"name": n, "offset": [0] * len(shape), "shape": list(shape),
                                       "full_shape": list(shape)} for n, (shape, _) in sorted(SHARDS[1].items())]
    assert info["total_elements"] == 48 * 16 + 16 * 16
    assert 0 < info["changed_elements"] < info["total_elements"]
    # A part delta in one tensor (container 2) names its tensors by index in
    # the part's blocks, which the listed layout names.
    blocks = [b["name"] for b in info["part"]["blocks"]]
    assert info["container"] == 2 and info["changed_tensors"]
    assert all(t["name"] == blocks[t["base_index"]] for t in info["changed_tensors"])
    assert "part 1 of 3" in run("inspect", key).stdout
    shutil.copy(key, tmp_path / key.name)  # out of its bucket: part and parts from the name only
    out_of_bucket = json.loads(run("inspect", tmp_path / key.name, "--json").stdout)
    alone = out_of_bucket["part"]
    assert alone == {"part": 1, "parts": 3, "layout": None, "listed": False, "blocks": None}
    assert [t["name"] for t in out_of_bucket["changed_tensors"]] == [None] * len(info["changed_tensors"])
    assert json.loads(run("inspect", tmp_path / "pulled-4.safetensors", "--json").stdout)["part"] is None

    # The folder comes back with its sharding and the side file of version 3.
    run("pull", bucket, "--hf-dir", tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["rope_theta"] == 20000.0
    assert sorted(p.name for p in (tmp_path / "hf").glob("*.safetensors")) == [
        f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]

    # Another split of the same tensors (two files) is a new layout: a delta in 2 parts.
    tensors = step(tensors, 6)
    two = [{**SHARDS[0], **SHARDS[1]}, SHARDS[2]]
    folder = write_folder(tmp_path / "ckpt-6", tensors, shards=two, config=config)
    out = publish(run, bucket, folder, 6)
    assert (out["parts"], out["wrote_delta"], out["wrote_anchor"]) == (2, True, True)  # 6: on the cadence
    assert_pulled(run, bucket, folder, 6, tmp_path / "pulled-6.safetensors")
    # And one file is one unparted version, as without --parts.
    tensors = step(tensors, 7)
    folder = write_folder(tmp_path / "ckpt-7", tensors, shards=[{k: v for s in SHARDS for k, v in s.items()}])
    out = publish(run, bucket, folder, 7)
    assert (out["parts"], out["wrote_delta"]) == (1, True)
    assert_pulled(run, bucket, folder, 7, tmp_path / "pulled-7.safetensors")
    log = json.loads(run("log", bucket, "--json").stdout)
    assert [e["parts"] for e in log["versions"]] == [3, 3, 3, 3, 3, 2, None]
    assert run("verify", bucket, "--all").returncode == 0


@pytest.mark.parametrize("flags,bucket_flags,words", [
    (["--encoding", "gap_delta"], None, "--parts per-file needs --encoding compact, not --encoding gap_delta"),
    (["--cumulative-every", "2"], None, "--parts per-file cannot be combined with --cumulative-every 2"),
    (["--anchor-max-fraction", "0.5"], None, "--parts per-file cannot be combined with --anchor-max-fraction"),
    ([], ["--encoding", "raw"], "is published as raw; parts are compact only"),
    ([], ["--cumulative-every", "3"], "writes cumulative deltas (every 3 versions), which parted publishing does "
                                      "not support: leave out --parts, or pass --change-settings --cumulative-every 0"),
])
def test_a_setting_parts_cannot_follow_is_refused_by_name(tmp_path, bucket, run, flags, bucket_flags, words):
    folder = write_folder(tmp_path / "ckpt", initial())
    if bucket_flags:  # the bucket's own setting, from an unparted first version
        run("publish", bucket, folder, "--version", 1, *bucket_flags)
    proc = publish(run, bucket, folder, 2, *flags, check=False)
    assert proc.returncode == 1
    assert words in proc.stderr
    if bucket_flags:
        assert [e["version"] for e in json.loads(run("log", bucket, "--json").stdout)["versions"]] == [1]
    else:
        assert not os.path.exists(os.path.join(bucket, "manifest.json"))


def test_a_file_is_refused(tmp_path, bucket, run):
    folder = write_folder(tmp_path / "ckpt", initial(), shards=[{k: v for s in SHARDS for k, v in s.items()}])
    proc = run("publish", bucket, folder / "model.safetensors", "--version", 1, "--parts", "per-file", check=False)
    assert proc.returncode == 1
    assert "--parts per-file publishes a model folder one part per weight file" in proc.stderr


def test_a_part_that_fails_commits_nothing_and_the_next_publish_works(tmp_path, bucket, run):
    tensors = initial()
    for v in (1, 2):
        tensors = step(tensors, v)
        publish(run, bucket, write_folder(tmp_path / f"ckpt-{v}", tensors), v)
    tensors = step(tensors, 3)
    folder = write_folder(tmp_path / "ckpt-3", tensors)
    # Part 1's delta key cannot be written (a directory holds it): parts 0 and 2 upload, part 1 fails.
    blocker = Path(bucket) / "ds/parts/step_000003.delta_from_000002.part_00001_of_00003.safetensors"
    blocker.mkdir(parents=True)
    (blocker / "x").write_bytes(b"x")
    proc = publish(run, bucket, folder, 3, check=False)
    assert proc.returncode == 1
    assert "part 1 (" in proc.stderr and "model-00002-of-00003.safetensors" in proc.stderr
    assert (Path(bucket) / "ds/parts/step_000003.delta_from_000002.part_00000_of_00003.safetensors").exists()
    log = json.loads(run("log", bucket, "--json").stdout)
    assert [e["version"] for e in log["versions"]] == [1, 2]
    assert run("verify", bucket, "--all").returncode == 0
    shutil.rmtree(blocker)
    out = publish(run, bucket, folder, 3)
    assert (out["parts"], out["wrote_delta"]) == (3, True)
    assert_pulled(run, bucket, folder, 3, tmp_path / "pulled-3.safetensors")
    assert run("verify", bucket, "--all").returncode == 0


def test_a_truncated_shard_commits_nothing(tmp_path, bucket, run):
    tensors = initial()
    publish(run, bucket, write_folder(tmp_path / "ckpt-1", tensors), 1)
    tensors = step(tensors, 2)
    folder = write_folder(tmp_path / "ckpt-2", tensors)
    shard = folder / "model-00003-of-00003.safetensors"
    whole = shard.read_bytes()
    shard.write_bytes(whole[:-64])
    proc = publish(run, bucket, folder, 2, check=False)
    assert proc.returncode == 1
    assert "model-00003-of-00003.safetensors" in proc.stderr
    assert [e["version"] for e in json.loads(run("log", bucket, "--json").stdout)["versions"]] == [1]
    shard.write_bytes(whole)
    assert publish(run, bucket, folder, 2)["parts"] == 3
    assert_pulled(run, bucket, folder, 2, tmp_path / "pulled-2.safetensors")


def test_change_settings_lets_a_cumulative_bucket_go_parted(tmp_path, bucket, run):
    tensors = initial()
    run("publish", bucket, write_folder(tmp_path / "ckpt-1", tensors), "--version", 1, "--cumulative-every", 3)
    tensors = step(tensors, 2)
    folder = write_folder(tmp_path / "ckpt-2", tensors)
    out = publish(run, bucket, folder, 2, "--change-settings", "--cumulative-every", "0")
    assert (out["parts"], out["wrote_delta"]) == (3, True)
    assert out["changed_settings"] == ["cumulative_interval 3 -> 0"]
    assert_pulled(run, bucket, folder, 2, tmp_path / "pulled-2.safetensors")
