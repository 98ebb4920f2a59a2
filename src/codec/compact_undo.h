// What a fused compact apply keeps past itself (internal to src/codec;
// compact_undo.cc): the class totals (CompactClassTotals) it hands the next
// apply, prepared before its walk (PrepareTotals) and named after it
// (KeepTotals) by the decoder's apply (compact_decode.cc). The undo log's
// CompactUndo::Restore is in compact_undo.cc too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "codec/compact_walk.h"
#include "deltasync/compact.h"
#include "deltasync/state_hash.h"
#include "deltasync/tensor.h"

namespace deltasync::compact {

// The class totals a fused apply keeps (CompactClassTotals): `before` is
// the state it applies to (its held totals, or the other slot when none are
// held), `after` the state it produces, in the other slot, its tensors
// updated in place (their vectors keep their memory from apply to apply).
// Before the walk: each walked tensor's chunks of `after` (and, where not
// held, of `before`) sized, the walker told to write them (Keep); the
// tensors not walked copied from `before` (few: a real delta changes most).
// After it: both states named (KeepTotals).
struct KeptTotals {
  CompactClassTotals::State* before = nullptr;
  CompactClassTotals::State* after = nullptr;
};

KeptTotals PrepareTotals(ChunkWalker& walker, const std::vector<Bf16Tensor*>& walked,
                         const std::vector<uint8_t>& tensor_held, const std::vector<size_t>& first_chunk,
                         std::span<const TensorView> base, CompactClassTotals::State* held,
                         CompactClassTotals& totals);

// After a successful fused apply from the state `from` to `to`: both held.
void KeepTotals(const KeptTotals& kept, const StateHash& from, const StateHash& to, uint64_t chunk_elements);

}  // namespace deltasync::compact
