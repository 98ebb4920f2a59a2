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

#include "deltasync/block.h"
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
// The same over views of the state's tensors (found by name).
StateHash HashChanges(std::span<const TensorView> tensors, std::span<const TensorChanges> changes, int threads = 0);
// The change to a state's hash when elements `indices` of the 16-bit tensor
// (name, dtype, shape) go from `old_values` to `new_values` (u16
// little-endian each, any alignment), summed by the kernel the compact
// decoder's walk sums its changes with (no gather, no widening): what
// `deltasync bench` times as the decode's hash terms. Equals HashDelta of
// the same changes. kInvalidArgument unless dtype is 2 bytes wide and each
// value span holds 2 bytes per index (indices are not range-checked).
Result<StateHash> HashChanges16(std::string_view name, DType dtype, std::span<const uint64_t> shape,
                                std::span<const uint64_t> indices, ByteSpan old_values, ByteSpan new_values);

// Parts (docs/format.md, "Parts"): a version's hash is the descriptor terms
// of its tensors plus the element terms of every block of every part, each
// element at its flat index in its full tensor.
//
// The descriptor term of tensor (name, dtype, full shape).
StateHash DescriptorTerm(std::string_view name, DType dtype, std::span<const uint64_t> full_shape);
// The element terms (no descriptor term) of a block's elements `data`
// (g.elements() x dtype bytes, row-major in the block) of tensor
// (name, dtype, g.full_shape()), on up to `threads` threads.
StateHash HashBlock(std::string_view name, DType dtype, const BlockGeometry& g, ByteSpan data, int threads = 0);
// The change to a block's element terms when its elements `local_indices`
// (block-local, any order) go from `old_values` to `new_values` (count x
// dtype bytes each).
StateHash HashBlockChanges(std::string_view name, DType dtype, const BlockGeometry& g,
                           std::span<const uint64_t> local_indices, ByteSpan old_values, ByteSpan new_values);

}  // namespace deltasync
