// The class totals a replica holds for the compact apply (held by
// CompactUndo, filled and used by ApplyCompactDelta; src/codec/compact_decode.cc
// and compact_walk.cc): per bf16 tensor of a state, the elements of each
// exponent class (compact::ClassOf) in each chunk of the walk. With them
// every chunk's walk knows where it starts (a prefix sum) without waiting
// for the chunk before it (the look-back), so chunks can be handed out one
// ahead (ParallelForAhead) and each thread prefetches the chunk it walks
// next. Every chunk still counts the classes its tensor has changes in
// and checks them against the held ones: a mismatch (a state changed
// behind the totals, a hash collision) undoes the apply and redoes it on
// the look-back route (`stale` counts those), so wrong totals never give a
// wrong result. The counts of the other classes are carried forward with
// the class moves; a wrong one is caught by the first delta that places a
// change in its class.
//
// Memory: 64 bytes (16 u32 counts) per chunk of 64 Ki bf16 elements
// (128 KiB) per state held, i.e. 1/2048 (0.049%) of the bf16 bytes; two
// states are held (the state applied to and the one after it), so 0.098%.
// On Intel CPUs the decoder's chunks are 128 Ki elements: half of that.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "deltasync/state_hash.h"

namespace deltasync {

class CompactClassTotals {
 public:
  // One state's totals: per tensor (by its index in the views applied to),
  // per chunk, the elements of each of the 16 classes (a fill by the
  // look-back route counts them all, and applies carry them all forward).
  // `elements` 0: none held.
  struct Tensor {
    uint64_t elements = 0;
    std::vector<std::array<uint32_t, 16>> chunks;
  };
  struct State {
    bool valid = false;
    StateHash hash;
    uint64_t chunk_elements = 0;
    std::vector<Tensor> tensors;
  };

  // The held state with this hash and chunk size, or nullptr.
  const State* Find(const StateHash& hash, uint64_t chunk_elements) const;
  State* Find(const StateHash& hash, uint64_t chunk_elements);
  // Forgets every held state.
  void Invalidate();
  // The held state with hash `from` (any chunk size), if any, is held as
  // the state with hash `to` from now on: the same values, hashed in
  // another frame (a part's apply sums its change to the hash by block, the
  // manifest hashes a part's blocks by their place in the full tensors).
  void Rename(const StateHash& from, const StateHash& to);
  // The bytes the held counts take.
  uint64_t HeldBytes() const;

  // Internal (src/codec): the states held (at most 2: an apply keeps the
  // state it applied to and the state after it).
  State states[2];
  // Applies whose every walked tensor of more than one chunk started from
  // held totals (no look-back; a one-chunk tensor needs none).
  uint64_t held_applies = 0;
  // Applies that found held totals wrong, were undone and redone on the
  // look-back route.
  uint64_t stale = 0;
};

}  // namespace deltasync
