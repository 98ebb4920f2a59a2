"""Session 51's review of the vLLM layout map (``_vllm_layout.EngineLayout``) without vLLM: what
the map does with modules it meets in every model. The TP shards, fused layers, padded vocabulary
and tied embeddings run in the real engine: tests/python/vllm_real/test_vllm_layout_real.py."""
import pytest

torch = pytest.importorskip("torch")
from deltasync._vllm_layout import EngineLayout  # noqa: E402


def test_scatter_writes_a_replicated_parameter_in_place():
    """A norm's weight (replicated whole on every rank) takes its changed elements in place.
    Its Place leaves ``k`` 0 (whole rows); the scatter read that as a 0-column shard, the native
    call refused it, and the engine redelivered every tensor of the version through load_weights."""
    model = torch.nn.Module()
    model.norm = torch.nn.LayerNorm(300, dtype=torch.bfloat16)
    layout = EngineLayout(model)
    want = model.norm.weight.detach().clone()
    idx = torch.tensor([0, 7, 150, 299])
    vals = torch.tensor([0.5, -2.0, 3.0, 1e-3], dtype=torch.bfloat16)
    want[idx] = vals
    assert layout.scatter("norm.weight", idx, vals)
    assert torch.equal(model.norm.weight.detach().view(torch.int16), want.view(torch.int16))
