// bench: a replica's whole apply of a compact delta, the way Replica::Update
// does it (object digest, parse, decode against the held state, state-hash
// update and check, scatter), and how its time grows with model size and
// change rate. Figures, never pass/fail.
#pragma once

#include <cstdint>
#include <vector>

#include "deltasync/changes.h"
#include "deltasync/status.h"
#include "deltasync/weight_state.h"
#include "bench_decode_floor.h"

namespace deltasync::cli {

struct CompactApplyFigures {
  uint64_t model_bytes = 0;
  uint64_t changed = 0;
  uint64_t delta_bytes = 0;
  double apply_s = 0;         // the whole apply (best of reps)
  double decode_s = 0;        // DecodeCompactDelta alone, same threads
  double decode_1thread_s = 0;
  double memcpy_s = 0;        // memcpy of the model, same threads (set by the sweep)
  DecodeFloorFigures floor;   // the same delta's stages alone (bench_decode_floor.h)
};

// Encodes `changes` (of `state`) as a compact delta, then times the whole
// apply on `threads` threads, restoring `state` (untimed) after each run.
// `state` is left as it was. memcpy_s is left for the caller (its baseline).
// Then the floor of the same delta's decode and apply (MeasureDecodeFloor).
Result<CompactApplyFigures> MeasureCompactApply(WeightState& state, const std::vector<TensorChanges>& changes,
                                                int threads, int reps);

// A bf16 model of Qwen3-0.6B's shapes scaled by `scale` (layers and
// vocabulary), ~N(0, 0.02) (norm weights 1.0): generated directly, no fp32
// masters. Deterministic.
Result<WeightState> GenerateState(double scale, int threads);
// Changes of about `rate` of `state`'s elements by +-1 ULP (the lowest
// mantissa bit flipped), chosen by a hash of (seed, element).
std::vector<TensorChanges> GenerateChanges(const WeightState& state, double rate, uint64_t seed, int threads);

// memcpy of `bytes` bytes on `threads` threads between two buffers it holds
// (their pages faulted in by the constructor): the baseline every figure is
// a ratio to, kept so that it can be timed in turns with a stage
// (PairedSeconds, timing.h).
class MemcpyReference {
 public:
  MemcpyReference(uint64_t bytes, int threads);
  void Copy();

 private:
  std::vector<uint8_t> src_, dst_;
  int threads_;
};

// The best of `reps` MemcpyReference(bytes, threads).Copy() calls.
double MemcpySeconds(uint64_t bytes, int threads, int reps);

// Sizes for the sweep.
struct SweepArgs {
  std::vector<double> scales;
  std::vector<double> rates;
  int threads = 2;
  int reps = 3;
};
// Prints one table row per (scale, rate) and returns them as JSON-ready
// figures in the same order.
Result<std::vector<CompactApplyFigures>> RunSweep(const SweepArgs& args);

}  // namespace deltasync::cli
