"""Hugging Face model folders in and out (issue 11, items 1-3), with transformers 4.x.

A tiny Llama (hidden 64, 2 layers) trained with real AdamW steps is saved with
save_pretrained(max_shard_size=...) into shards, with config.json, a tokenizer
built locally with `tokenizers` and a chat template; five versions are
published from those folders (the CLI), pulled back as folders, and loaded
with from_pretrained: the loaded bf16 weights equal the trainer's weights
rounded to bf16 and the logits equal a model built from those weights.
"""
import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # DS_WITH_TORCH=0 installs leave torch out
import tokenizers  # noqa: E402  (scripts/install-deps.sh installs both)
import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402

VERSIONS = range(1, 6)
WORDS = "the cat sat on a mat and then ran off to see dog bird fish".split()


def make_tokenizer():
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return fast


def make_model():
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                      max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def bf16_state(model):
    return {k: v.detach().to(torch.bfloat16).clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def history(tmp_path_factory, deltasync_bin):
    """Five versions: checkpoint folders, the bucket they were published to, the bf16 weights of each."""
    import subprocess

    root = tmp_path_factory.mktemp("hf")
    bucket = root / "bucket"
    model = make_model()
    tokenizer = make_tokenizer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.tensor([[1, 3, 4, 5, 6, 7, 2]])
    folders, expected = {}, {}
    for v in VERSIONS:
        if v > 1:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        if v == 3:
            model.config.rope_theta = 20000.0  # config.json changes at version 3 only
        ckpt = root / f"ckpt-{v}"
        model.save_pretrained(ckpt, max_shard_size="150KB", safe_serialization=True)  # fp32 masters: 3 shards
        tokenizer.save_pretrained(ckpt)
        (ckpt / "optimizer.pt").write_bytes(b"never travels")
        proc = subprocess.run([deltasync_bin, "publish", str(bucket), str(ckpt), "--version", str(v),
                               "--anchor-interval", "3"], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert "not carried: optimizer.pt" in proc.stdout
        folders[v], expected[v] = ckpt, bf16_state(model)
    return {"root": root, "bucket": bucket, "folders": folders, "expected": expected}


def shard_names(folder: Path):
    return sorted(p.name for p in folder.glob("*.safetensors"))


def assert_loads_as(out: Path, history, v):
    """The folder loads with from_pretrained; bf16 weights and logits equal the trainer's at version v."""
    weights = history["expected"][v]
    config = transformers.AutoConfig.from_pretrained(history["folders"][v])  # the trainer's own config
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16)
    state = loaded.state_dict()
    assert set(state) == set(weights)
    for name, w in weights.items():
        assert torch.equal(state[name].view(torch.int16), w.view(torch.int16)), name
    # The trainer's own bf16 weights, loaded the same way (from_pretrained
    # builds the model in bf16; its rotary buffers stay fp32).
    reference = transformers.LlamaForCausalLM.from_pretrained(None, config=config, state_dict=weights,
                                                              dtype=torch.bfloat16)
    ids = torch.tensor([[1, 3, 4, 5, 9, 10, 2]])
    with torch.no_grad():
        assert torch.equal(loaded.eval()(input_ids=ids).logits, reference.eval()(input_ids=ids).logits)


def test_every_version_pulls_as_a_folder_that_transformers_loads(history, run):
    for v in VERSIONS:
        out = history["root"] / f"pulled-{v}"
        run("pull", history["bucket"], "--hf-dir", out, "--version", v)
        ckpt = history["folders"][v]
        assert shard_names(out) == shard_names(ckpt) and len(shard_names(out)) == 3
        index = json.loads((out / "model.safetensors.index.json").read_text())
        assert index["weight_map"] == json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
        for shard in shard_names(out):
            with safe_open(out / shard, framework="pt") as f:
                assert f.metadata() == {"format": "pt", "model_version": str(v)}
        for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                     "special_tokens_map.json", "chat_template.jinja"):
            assert (out / name).read_bytes() == (ckpt / name).read_bytes(), name
        assert not (out / "optimizer.pt").exists()
        assert_loads_as(out, history, v)
        tok = transformers.AutoTokenizer.from_pretrained(out)
        assert tok("the cat sat")["input_ids"] == make_tokenizer()("the cat sat")["input_ids"]
        assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi "


def test_a_changed_config_is_carried_and_listed_only_when_it_changes(history, run, tmp_path):
    manifest = json.loads((history["bucket"] / "manifest.json").read_text())
    listed = [v["version"] for v in manifest["versions"] if "files" in v]
    assert listed == [1, 3]
    assert "config.json" in manifest["versions"][2]["files"]
    for v, theta in ((2, 10000.0), (3, 20000.0), (5, 20000.0)):
        run("pull", history["bucket"], "--hf-dir", tmp_path / f"v{v}", "--version", v)
        assert json.loads((tmp_path / f"v{v}" / "config.json").read_text())["rope_theta"] == theta


def test_max_shard_size_reshards(history, run, tmp_path):
    out = tmp_path / "resharded"
    run("pull", history["bucket"], "--hf-dir", out, "--max-shard-size", "30KB")
    names = shard_names(out)
    assert len(names) > 3 and names[0] == f"model-00001-of-{len(names):05d}.safetensors"
    assert_loads_as(out, history, 5)
    one = tmp_path / "one"
    run("pull", history["bucket"], "--hf-dir", one, "--max-shard-size", "1GB")
    assert shard_names(one) == ["model.safetensors"] and not (one / "model.safetensors.index.json").exists()
    bad = run("pull", history["bucket"], "--hf-dir", tmp_path / "x", "--max-shard-size", "lots", check=False)
    assert bad.returncode == 1 and "--max-shard-size takes a size" in bad.stderr


def test_a_non_empty_folder_is_replaced_only_with_force(history, run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    refused = run("pull", history["bucket"], "--hf-dir", out, check=False)
    assert refused.returncode == 1
    assert "exists and is not empty; pass --force to replace it" in refused.stderr
    assert (out / "old.txt").exists()
    run("pull", history["bucket"], "--hf-dir", out, "--version", 4, "--force")
    assert not (out / "old.txt").exists()
    assert_loads_as(out, history, 4)
    assert [p.name for p in tmp_path.iterdir()] == ["out"], "nothing left beside it"
    usage = run("pull", history["bucket"], check=False)
    assert usage.returncode == 2 and "-o FILE or --hf-dir DIR" in usage.stderr


def test_pull_to_a_file_is_a_pt_checkpoint_that_apply_and_inspect_accept(history, run, tmp_path):
    run("pull", history["bucket"], "-o", tmp_path / "v4.safetensors", "--version", 4)
    with safe_open(tmp_path / "v4.safetensors", framework="pt") as f:
        assert f.metadata() == {"format": "pt", "model_version": "4"}
        for name, w in history["expected"][4].items():
            assert torch.equal(f.get_tensor(name).view(torch.int16), w.view(torch.int16))
    run("inspect", tmp_path / "v4.safetensors")
    run("apply", tmp_path / "v4.safetensors", history["bucket"] / "ds/deltas/step_000005.safetensors",
        "-o", tmp_path / "v5.safetensors")
    with safe_open(tmp_path / "v5.safetensors", framework="pt") as f:
        assert f.metadata()["model_version"] == "5"
        for name, w in history["expected"][5].items():
            assert torch.equal(f.get_tensor(name).view(torch.int16), w.view(torch.int16))


def copy_of(history, tmp_path, v=1) -> Path:
    return Path(shutil.copytree(history["folders"][v], tmp_path / "ckpt"))


def publish_fails(run, bucket, path, phrase):
    proc = run("publish", bucket, path, "--version", 1, check=False)
    assert proc.returncode == 1, proc.stdout
    assert phrase in proc.stderr, proc.stderr
    return proc


def test_a_shard_or_the_index_as_file_says_to_pass_the_folder(history, run, tmp_path):
    ckpt = history["folders"][1]
    shard = ckpt / shard_names(ckpt)[0]
    publish_fails(run, tmp_path / "b", shard, f"is one shard of the sharded checkpoint in {ckpt}")
    publish_fails(run, tmp_path / "b", shard, f"pass the folder {ckpt}")
    publish_fails(run, tmp_path / "b", ckpt / "model.safetensors.index.json",
                  "is the index of a sharded checkpoint, not a weight file; pass the folder")
    assert not (tmp_path / "b" / "manifest.json").exists()


def test_a_broken_index_is_refused(history, run, tmp_path):
    ckpt = copy_of(history, tmp_path)
    index_path = ckpt / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    first, second = shard_names(ckpt)[:2]

    # A tensor the index places in a shard that does not hold it.
    broken = json.loads(json.dumps(index))
    broken["weight_map"]["model.extra.weight"] = first
    index_path.write_text(json.dumps(broken))
    publish_fails(run, tmp_path / "b", ckpt, f"places tensor 'model.extra.weight' in {first}, but")

    # A tensor in two files.
    index_path.write_text(json.dumps(index))
    name = next(k for k, f in index["weight_map"].items() if f == first)
    with safe_open(ckpt / second, framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    with safe_open(ckpt / first, framework="pt") as f:
        tensors[name] = f.get_tensor(name)
    from safetensors.torch import save_file

    save_file(tensors, ckpt / second, metadata={"format": "pt"})
    publish_fails(run, tmp_path / "b", ckpt, f"tensor '{name}' is in both")

    # An unlisted shard.
    shutil.rmtree(ckpt)
    ckpt = copy_of(history, tmp_path)
    shutil.copy(ckpt / first, ckpt / "consolidated.safetensors")
    publish_fails(run, tmp_path / "b", ckpt,
                  "consolidated.safetensors is a .safetensors file that model.safetensors.index.json does not name")
    assert not (tmp_path / "b" / "manifest.json").exists()


def test_python_publish_dir_and_save_hf_dir(history, tmp_path):
    import deltasync

    bucket = str(tmp_path / "bucket")
    with deltasync.Publisher(bucket) as pub:
        for v in (1, 2):
            result = pub.publish_dir(v, history["folders"][v])
            assert result.version == v
    replica = deltasync.Replica(bucket)
    with pytest.raises(deltasync.FailedPreconditionError):
        replica.save_hf_dir(tmp_path / "none")
    for v in (1, 2):
        replica.update(v)
        out = replica.save_hf_dir(tmp_path / f"py-{v}")
        assert shard_names(Path(out)) == shard_names(history["folders"][v])
        assert_loads_as(Path(out), history, v)
    with pytest.raises(deltasync.FailedPreconditionError, match="pass --force"):
        replica.save_hf_dir(tmp_path / "py-2")
    replica.save_hf_dir(tmp_path / "py-2", force=True, max_shard_size="1GB")
    assert shard_names(tmp_path / "py-2") == ["model.safetensors"]
    with pytest.raises(deltasync.InvalidArgumentError, match="pass the folder"):
        with deltasync.Publisher(str(tmp_path / "b2")) as pub:
            pub.publish_dir(1, history["folders"][1] / "model.safetensors.index.json")
