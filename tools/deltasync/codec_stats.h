// Codec figures on one step of a model (shared by `deltasync bench` and
// bench/compact_bench): bytes per changed element of every delta encoding
// next to the order-0 entropy of the same data (issue 4's definition), and the
// compressed anchor's ratio next to its order-0 ceiling. Figures, never
// pass/fail.
#pragma once

#include <cstdint>
#include <span>

#include "deltasync/changes.h"
#include "deltasync/status.h"
#include "deltasync/weight_state.h"

namespace deltasync::cli {

// One compact stream version's figures.
struct CompactFigures {
  double bytes_per_changed = 0;  // whole file including its header
  // Its parts (MeasureCompactDelta), bytes per changed element.
  double header = 0, gaps = 0, diffs = 0, escapes = 0;
  double encode_gbps_1t = 0, decode_gbps_1t = 0, decode_gbps_all = 0;  // GB/s of bf16 model bytes
};

struct DeltaFigures {
  uint64_t changed = 0;
  // Bytes per changed element, whole file including its header; compact in
  // the default stream version (v2 and v3 below).
  double raw = 0, gap_delta = 0, gap_delta_zstd = 0, compact = 0;
  CompactFigures v2, v3;
  // Per tensor: changed x (H0(gap symbols) + H0(ULP-difference symbols)),
  // summed, / (8 x changed); headers excluded. A reference, not a bound.
  double entropy = 0;
  // Empirical conditional entropy with the base exponent as context
  // (changed flag | exponent + difference | exponent), model cost excluded.
  double context_entropy = 0;
  double h0_gap = 0, h0_diff = 0, ctx_flag = 0, ctx_diff = 0;
  // GB/s of bf16 model bytes, compact in the default stream version.
  double encode_gbps_1t = 0, decode_gbps_1t = 0, decode_gbps_all = 0;
};

// The entropy figures alone (the fields of DeltaFigures of the same names), in
// bytes per changed element; `changes` must be non-empty. Shared by `bench`
// and `diff --json`.
struct DeltaEntropy {
  uint64_t changed = 0;
  double entropy = 0, context_entropy = 0;
  double h0_gap = 0, h0_diff = 0, ctx_flag = 0, ctx_diff = 0;
};
DeltaEntropy MeasureDeltaEntropy(const WeightState& base, std::span<const TensorChanges> changes);
DeltaEntropy MeasureDeltaEntropy(std::span<const TensorView> base, std::span<const TensorChanges> changes);

// `changes` take `base` (version - 1) to `version`.
Result<DeltaFigures> MeasureDeltaCodecs(const WeightState& base, std::span<const TensorChanges> changes,
                                        uint64_t version, int reps);

struct AnchorFigures {
  double exponent_entropy_bits = 0;  // H(exponent byte) over bf16 elements
  double ratio = 0;                  // bf16 bytes / compressed anchor bytes
  double ceiling = 0;                // 16 / (8 + H(exponent))
  double encode_gbps = 0;            // all threads
  double decode_gbps_1t = 0;
  bool exact = false;                // decoded == input, bit for bit
};

Result<AnchorFigures> MeasureAnchorCodec(const WeightState& state, uint64_t version, int reps);

}  // namespace deltasync::cli
