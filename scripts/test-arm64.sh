#!/usr/bin/env bash
# Cross-builds deltasync for aarch64 (Graviton, Grace) and runs its unit
# tests under qemu-aarch64 with several emulated CPUs, so that the kernels'
# every-target loops (ForEachTarget, ForEachCodecCopy) run Highway's NEON,
# SVE, SVE2, SVE_256 and SVE2_128 code on an x86-64 Debian 12 host. See
# docs/arm64.md.
#
#   scripts/test-arm64.sh            the quick set (~11 min on 2 busy cores
#                                    with a warm build): bf16_tests with SVE
#                                    at 128 bits (Grace, Graviton4), 256
#                                    (Graviton3) and 2048, codec_tests on the
#                                    first
#   scripts/test-arm64.sh --full     the whole unit suite (ctest -L unit) on
#                                    five CPUs: NEON only, SVE2 at 128, 256,
#                                    512 and 2048 bits. Not timed end to end;
#                                    its parts (session 45, 2 busy cores, 2
#                                    gtest shards): codec_tests 3.5 min on
#                                    neon, 8 on sve512, 11 on sve2048, 20 on
#                                    sve256; the other binaries ~5 min a CPU
#                                    (sve128); bf16_tests 1-2 min + the 278 s
#                                    gap test: ~2 hours in all (the parts
#                                    summed; not a person's check)
#   --no-install                     skips the package check (scripts/
#                                    install-deps.sh's arm64 counterpart)
#
# DS_ARM64_CPUS="name ..." picks CPUs from the table below; JOBS (default
# nproc) sets the build's and the tests' parallelism. Installs (idempotent,
# as root or with sudo): the arm64 architecture in dpkg, g++-aarch64-linux-gnu,
# qemu-user and the arm64 -dev packages. Builds into build-arm64/ (Release).
# Each run prints the Highway targets it saw ("kernel targets: ..."), and
# fails if one that the CPU should bring is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"
FULL=0
INSTALL=1
for arg in "$@"; do
  case "$arg" in
    --full) FULL=1 ;;
    --no-install) INSTALL=0 ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    *) echo "test-arm64: unknown argument '$arg' (expected --full, --no-install)" >&2; exit 2 ;;
  esac
done
step() { printf '\n=== %s\n' "$*"; }
elapsed() { echo "($(( $(date +%s) - $1 )) s)"; }
T0=$(date +%s)

# name | QEMU_CPU | Highway targets it must bring | targets it must not
CPU_TABLE=(
  "neon|max,sve=off|NEON|SVE SVE2"
  "sve128|max,sve128=on|NEON SVE SVE2 SVE2_128|SVE_256"
  "sve256|max,sve256=on|NEON SVE SVE2 SVE_256|SVE2_128"
  "sve512|max,sve512=on|NEON SVE SVE2|SVE_256 SVE2_128"
  "sve2048|max,sve-default-vector-length=256|NEON SVE SVE2|SVE_256 SVE2_128"
)
if ((FULL)); then
  CPUS="${DS_ARM64_CPUS:-neon sve128 sve256 sve512 sve2048}"
else
  CPUS="${DS_ARM64_CPUS:-sve128 sve256 sve2048}"
fi

if ((INSTALL)); then
  step "dependencies (arm64 cross toolchain, qemu-user, arm64 -dev packages)"
  t=$(date +%s)
  SUDO=""
  [[ $(id -u) == 0 ]] || SUDO="sudo"
  updated=0
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "test-arm64: dpkg --add-architecture arm64"
    $SUDO dpkg --add-architecture arm64
    $SUDO apt-get update -qq
    updated=1
  fi
  # The build's arm64 libraries (scripts/install-deps.sh's list, less the
  # benchmarks' libbenchmark-dev: DS_BENCH is off here). The header-only
  # ones (nlohmann-json3-dev, libcli11-dev) are architecture-independent.
  PACKAGES=(
    g++-aarch64-linux-gnu qemu-user cmake ninja-build pkg-config
    nlohmann-json3-dev libcli11-dev
    libgtest-dev:arm64 libgmock-dev:arm64 libzstd-dev:arm64 libxxhash-dev:arm64 libhwy-dev:arm64
    libcurl4-openssl-dev:arm64 libssl-dev:arm64 libcpp-httplib-dev:arm64
  )
  missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "test-arm64: apt-get install ${missing[*]}"
    ((updated)) || $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  echo "dependencies $(elapsed "$t")"
fi

step "cross build (build-arm64/, Release, aarch64-linux-gnu-g++)"
t=$(date +%s)
cmake -S . -B build-arm64 -G Ninja -DCMAKE_BUILD_TYPE=Release -DDS_BENCH=OFF \
  -DCMAKE_TOOLCHAIN_FILE=cmake/toolchains/aarch64-linux-gnu.cmake >/dev/null
if ((FULL)); then
  cmake --build build-arm64 -j "$JOBS"
else
  cmake --build build-arm64 -j "$JOBS" --target bf16_tests codec_tests
fi
echo "build $(elapsed "$t")"

QEMU=$(command -v qemu-aarch64 || command -v qemu-aarch64-static)
# No QEMU_LD_PREFIX: libc6:arm64's own loader runs (see the toolchain file).
unset QEMU_LD_PREFIX
failed=()
for cpu in $CPUS; do
  row=""
  for r in "${CPU_TABLE[@]}"; do [[ "${r%%|*}" == "$cpu" ]] && row="$r"; done
  if [[ -z "$row" ]]; then
    echo "test-arm64: unknown CPU '$cpu' (one of: neon sve128 sve256 sve512 sve2048)" >&2
    exit 2
  fi
  IFS='|' read -r _ qemu_cpu want unwanted <<<"$row"
  step "tests on $cpu (QEMU_CPU=$qemu_cpu)"
  t=$(date +%s)
  export QEMU_CPU="$qemu_cpu" DS_EXPECT_TARGETS="$want" DS_EXPECT_NO_TARGETS="$unwanted"
  "$QEMU" build-arm64/tests/bf16_tests --gtest_filter='KernelTargets.*' --gtest_brief=1 | grep '^kernel targets:' \
    || { echo "test-arm64: $cpu does not bring the targets $want (not $unwanted)" >&2; failed+=("$cpu"); continue; }
  ok=1
  if ((FULL)); then
    # ctest runs each test through CMAKE_CROSSCOMPILING_EMULATOR (qemu), which
    # reads QEMU_CPU and QEMU_LD_PREFIX from the environment.
    ctest --test-dir build-arm64 -L unit -j "$JOBS" --output-on-failure --timeout 900 || ok=0
  else
    # Each binary whole, in JOBS gtest shards at once (one qemu start per
    # shard instead of one per test). Left out: GapsPastThirtyTwoBitsWidenToU64
    # (~280 s under qemu, over half the quick set's time: 2^32 elements of
    # default dispatch, no per-target loop; --full runs it).
    # codec_tests (no Highway code of its own, ~9 min under qemu on a busy
    # 2-core machine) on the first CPU only.
    bins="bf16_tests"
    [[ "$cpu" == "${CPUS%% *}" ]] && bins="bf16_tests codec_tests"
    for bin in $bins; do
      pids=()
      for ((s = 0; s < JOBS; ++s)); do
        GTEST_TOTAL_SHARDS=$JOBS GTEST_SHARD_INDEX=$s "$QEMU" "build-arm64/tests/$bin" --gtest_brief=1 \
          --gtest_filter="-DetectAndEncodeGapDeltaTest.GapsPastThirtyTwoBitsWidenToU64" \
          >"build-arm64/$bin.$cpu.$s.log" 2>&1 &
        pids+=($!)
      done
      for ((s = 0; s < JOBS; ++s)); do
        if ! wait "${pids[$s]}"; then
          ok=0
          echo "--- $bin shard $s on $cpu failed:"
          cat "build-arm64/$bin.$cpu.$s.log"
        fi
      done
      grep -h -E '^\[  (PASSED|SKIPPED) ' "build-arm64/$bin.$cpu."*.log | sed "s/^/$bin: /" || true
    done
  fi
  echo "tests on $cpu $(elapsed "$t")"
  ((ok)) || failed+=("$cpu")
done

step "done $(elapsed "$T0")"
if ((${#failed[@]})); then
  echo "test-arm64: FAILED on: ${failed[*]}" >&2
  exit 1
fi
echo "test-arm64: all passed on: $CPUS"
