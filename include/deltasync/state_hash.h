// StateHash: a 128-bit fingerprint of a complete weight state that a replica
// can update in time proportional to a delta.
//
// It is a sum (mod 2^64, in each of two independent lanes) of one
// pseudo-random term per tensor descriptor (name, dtype, shape) and one per
// element (tensor, flat index, element bits). Changing elements replaces their
// terms, so Update() costs O(changed elements); a full recomputation (at
// anchors, or to check a replica) walks every element. The exact function is
// specified in docs/format.md ("State hash"). It detects accidental
// corruption and mis-application, not adversaries: object bytes are also
// checked with XXH3-128, and the manifest is the root of trust.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "deltasync/changes.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"
#include "deltasync/weight_state.h"

namespace deltasync {

struct StateHash {
  uint64_t lo = 0;
  uint64_t hi = 0;

  // 32 lower-case hex digits: hi then lo, each big-endian.
  std::string Hex() const;
  static Result<StateHash> FromHex(std::string_view hex);

  StateHash& operator+=(const StateHash& o) { lo += o.lo; hi += o.hi; return *this; }
  StateHash& operator-=(const StateHash& o) { lo -= o.lo; hi -= o.hi; return *this; }
  friend StateHash operator+(StateHash a, const StateHash& b) { return a += b; }
  friend StateHash operator-(StateHash a, const StateHash& b) { return a -= b; }
  friend bool operator==(const StateHash&, const StateHash&) = default;
};

// The full hash of `state` (all tensors), using up to `threads` threads
// (0 = hardware concurrency).
StateHash HashState(const WeightState& state, int threads = 0);
StateHash HashTensors(std::span<const TensorView> tensors, int threads = 0);

// The change to a state's hash when the elements `changes.indices` of tensor
// `changes.name` go from their values in `before` to `changes.values`.
// REQUIRES: `before` is that tensor (same name and dtype), indices in range.
StateHash HashDelta(const TensorView& before, const TensorChanges& changes);

// The sum of HashDelta over every entry of `changes` against the matching
// tensor of `state`, computed on up to `threads` threads (0 = hardware
// concurrency). REQUIRES: ValidateChanges(state, changes) is OK.
StateHash HashChanges(const WeightState& state, std::span<const TensorChanges> changes, int threads = 0);

}  // namespace deltasync
