#!/usr/bin/env bash
# Checks, before scripts/install-deps.sh --test installs anything, that the
# disk holds what is still missing plus what one scripts/test.sh run writes,
# and stops with the figures when it does not: a full disk otherwise shows up
# minutes later as pip's "[Errno 28] No space left on device" or a failed link.
#
# The sizes are what a fresh-clone run took on Debian 12 (2026-12-03), rounded
# up; only the parts not yet there are counted, so a second run needs little.
# Pip unpacks its downloads under TMPDIR (default /tmp) before installing them
# (and frees them after); the tests write their scratch data there later. When
# the checkout and TMPDIR share a file system, the two needs add up.
# DS_WITH_TORCH / DS_WITH_VLLM as for install-deps.sh; DS_SKIP_DISK_CHECK=1
# (read by install-deps.sh) skips this check.
set -euo pipefail
cd "$(dirname "$0")/.."

need_here=0  # MiB in the checkout's file system
need_tmp=0   # MiB under TMPDIR at the peak (downloads and scratch come one after another)
parts=()
add() {  # add HERE_MIB DOWNLOAD_MIB WHAT: installed size, pip's downloads unpacked before it
  need_here=$((need_here + $1)); ((need_tmp >= $2)) || need_tmp=$2; parts+=("$3")
}

if ! .venv/bin/python -c "import pytest, numpy, safetensors, transformers" 2>/dev/null; then
  add 700 300 ".venv's test packages (~0.7 GB)"
fi
if [[ "${DS_WITH_TORCH:-1}" == 1 ]] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
  add 7300 3500 "torch 2.9.1 with its CUDA libraries (~7.3 GB, ~3.5 GB of downloads)"
fi
if [[ "${DS_WITH_VLLM:-1}" == 1 && ! -f .venv-vllm/.deltasync-recipe ]]; then
  add 4300 1500 ".venv-vllm, a real vLLM (~4.3 GB, ~1.5 GB of downloads)"
fi
[[ -d build-asan ]] || add 2500 0 "the sanitizer and fuzzer builds (~2.5 GB)"
[[ -d build-tsan ]] || add 2000 0 "the ThreadSanitizer build (~2 GB)"
# Every run: the test data (buckets, soak states, pytest's folders) and the
# builds' growth.
add 500 2000 "one test run's scratch data (~2 GB under TMPDIR)"

tmp="${TMPDIR:-/tmp}"
free_mib() { df -Pm "$1" | awk 'NR == 2 {print $4}'; }
gib() { awk -v m="$1" 'BEGIN {printf "%.1f GiB", m / 1024}'; }
here_free=$(free_mib .)
tmp_free=$(free_mib "$tmp")
short=0
if [[ "$(df -P . | awk 'NR == 2 {print $1}')" == "$(df -P "$tmp" | awk 'NR == 2 {print $1}')" ]]; then
  total=$((need_here + need_tmp))
  ((here_free >= total)) || short=1
  where="$PWD and $tmp (one file system): $(gib "$here_free") free, about $(gib "$total") needed"
else
  ((here_free >= need_here && tmp_free >= need_tmp)) || short=1
  where="$PWD: $(gib "$here_free") free, about $(gib "$need_here") needed; $tmp: $(gib "$tmp_free") free, about $(gib "$need_tmp") needed"
fi
if ((short)); then
  {
    echo "check-disk: not enough free disk space for the test run: $where."
    echo "check-disk: still to install or write:"
    printf 'check-disk:   %s\n' "${parts[@]}"
    echo "check-disk: free space (or point TMPDIR elsewhere), or leave parts out with DS_WITH_TORCH=0 /"
    echo "check-disk: DS_WITH_VLLM=0; DS_SKIP_DISK_CHECK=1 runs anyway."
  } >&2
  exit 1
fi
