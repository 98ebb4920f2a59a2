"""A tiny random-init Qwen3 (hidden 256, 2 layers, bf16) made locally, and its trainer.

No downloads: the config, the weights (transformers' random init, seeded)
and a word-level tokenizer ("<unk>", "w1".."w1023", split on whitespace) are written
into a folder that vLLM loads as a model.
"""
import json
import os

import torch

VOCAB = 1024


def make_model_dir(path, *, seed=0, tie_word_embeddings=False):
    """Writes the model folder at ``path``; returns the (fp32) transformers model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                         tie_word_embeddings=tie_word_embeddings, bos_token_id=1, eos_token_id=2,
                         torch_dtype="bfloat16")
    model = Qwen3ForCausalLM(config).float()
    with torch.no_grad():  # a visible distribution for greedy decoding: larger than init's 0.02
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    model.float()
    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="w1", eos_token="w2")
    fast.save_pretrained(path)
    cfg = json.loads(open(os.path.join(path, "config.json")).read())
    cfg["torch_dtype"] = cfg["dtype"] = "bfloat16"
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return model


def make_06b_widths_dir(path, layers):
    """A random-init Qwen3 with Qwen3-0.6B's widths (hidden 1024, intermediate 3072, 16/8 heads of
    128, vocabulary 151936) and ``layers`` layers, bf16, written at ``path`` with the word-level
    tokenizer (the benchmarks' model); returns its parameters (bf16 clones)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=1024,
                      tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path)
    tok = Tokenizer(models.WordLevel(vocab={"<unk>": 0, **{f"w{i}": i for i in range(1, 1024)}}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(path)
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def prompt_words(n, seed):
    g = torch.Generator().manual_seed(seed)
    return " ".join(f"w{int(i)}" for i in torch.randint(3, VOCAB, (n,), generator=g))


def bf16_bits(model):
    """{name: bf16 tensor} of the model's parameters as the trainer publishes them."""
    return {n: p.detach().to(torch.bfloat16).clone() for n, p in model.named_parameters()}


def make_qwen2_dir(path, *, vocab, kv_heads, tie_word_embeddings, seed=0):
    """A tiny random-init Qwen2 (hidden 256, 2 layers, 4 query heads of 64, q/k/v biases, bf16) with
    ``vocab`` words and ``kv_heads`` KV heads, written at ``path`` with a word-level tokenizer of
    that vocabulary; returns its checkpoint tensors (bf16, as saved)."""
    from safetensors.torch import load_file
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=1024,
                         tie_word_embeddings=tie_word_embeddings, bos_token_id=1, eos_token_id=2)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # biases and norms away from their init's zeros and ones: every element tells
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    tok = Tokenizer(models.WordLevel(vocab={"<unk>": 0, **{f"w{i}": i for i in range(1, vocab)}}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="w1",
                            eos_token="w2").save_pretrained(path)
    cfg = json.loads(open(os.path.join(path, "config.json")).read())
    cfg["torch_dtype"] = cfg["dtype"] = "bfloat16"
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return {n: t.contiguous() for n, t in load_file(os.path.join(path, "model.safetensors")).items()}
