// Detecting and applying in one pass (internal; the Publisher's gap_delta and
// raw route).
//
// DetectChanges followed by an apply with an undo log reads the published
// state twice: once to compare, then once more, at every changed element, to
// keep its old value, sum its state-hash change and write the new one. At a
// few percent changed nearly every cache line of the state holds a change,
// so that second pass streams the whole state again. DetectAndApply does it
// block by block inside the detection, while the block's published elements
// are still in cache.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "bf16/hash_term.h"
#include "deltasync/changes.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/weight_state.h"

namespace deltasync::bf16 {

// What the detection's chunks need to apply their changes (scan.h's
// DetectJobs, `apply`): per job, its tensor's hash seeds.
struct InScanApply {
  std::vector<state_hash::TensorSeeds> seeds;
};

// Applies the n changes (indices idx, values val, width `size`) found in a
// block of a tensor whose bytes are `data`: each old value goes to old (same
// layout as val), the state-hash change is added to hash[2], and each new
// value is written. Indices ascend within the tensor. Also the apply of
// ApplyChangesWithUndo (patch.h), per chunk of a change list.
void ApplyBlock(uint8_t* data, size_t size, const uint64_t* idx, const uint8_t* val, uint8_t* old, size_t n,
                const state_hash::TensorSeeds& seeds, uint64_t hash[2]);
// Puts back what ApplyBlock(data, size, idx, ..., old, n, ...) wrote.
void UndoBlock(uint8_t* data, size_t size, const uint64_t* idx, const uint8_t* old, size_t n);

// DetectChanges(published, current, options, out), with the changes applied
// to `published` as they are found: old[k] gets the old values of out[k]'s
// changes (its dtype's bytes per change, as out[k].values), and *delta the
// change to published's state hash (HashChanges against the state before).
// The result equals DetectChanges then ApplyChanges; the memory of `out` and
// `old` is reused as DetectChanges into `out` reuses it. On an error (the
// same errors as DetectChanges) `published` is as it was, `out` and `old`
// are empty and *delta is zero.
Status DetectAndApply(WeightState& published, std::span<const TensorView> current, const DetectOptions& options,
                      uint64_t chunk_elements, std::vector<TensorChanges>& out,
                      std::vector<std::vector<uint8_t>>& old, StateHash* delta);

}  // namespace deltasync::bf16
