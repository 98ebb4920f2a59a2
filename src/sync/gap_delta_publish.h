// The Publisher's gap_delta route (internal to src/sync): the delta is
// detected, encoded and applied to the published state in one pass
// (bf16/detect_encode_apply.h): each block's changes are applied from the
// gap and value streams the patch's parts point at, right after the block's
// compare wrote them, while its elements are in cache. The state the
// publisher hashes and keeps is therefore what the uploaded delta gives a
// replica (tests/sync/gap_delta_publish_test.cc checks it against a
// replica's decode and apply of the same bytes).
#pragma once

#include <cstdint>
#include <span>

#include "bf16/detect_encode_apply.h"
#include "deltasync/changes.h"
#include "deltasync/detect_encode.h"
#include "deltasync/patch.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"
#include "deltasync/weight_state.h"

namespace deltasync {

class GapDeltaPublish {
 public:
  GapDeltaPublish();
  ~GapDeltaPublish();
  GapDeltaPublish(const GapDeltaPublish&) = delete;
  GapDeltaPublish& operator=(const GapDeltaPublish&) = delete;

  // The gap_delta delta of `current` against `state` (info.encoding must be
  // gap_delta, info.total_elements the state's element count), applied to
  // `state`. On success returns the change to the state's hash; TakePatch()
  // gives the delta (the bytes DetectChanges + EncodeDelta give), changed()
  // counts its changes, and Undo() puts `state` back. On an error (the
  // detect's and the encoder's errors) `state` is unchanged. What a previous
  // call returned must no longer be in use.
  Result<StateHash> Run(WeightState& state, std::span<const TensorView> current, const DetectOptions& options,
                        const PatchInfo& info);
  // Run with the hash terms of its 2-byte changes (nearly all) left out: the
  // result is the other changes' hash change, HashLater(threads) the rest
  // (their sum is Run's result). HashLater reads only the delta's streams
  // and the old values, so it may run beside the delta's write; call it
  // after a successful RunHashLater, before Undo, the next Run or Release.
  // It may throw std::bad_alloc (bf16::GapDeltaApply::HashLater).
  Result<StateHash> RunHashLater(WeightState& state, std::span<const TensorView> current,
                                 const DetectOptions& options, const PatchInfo& info);
  StateHash HashLater(int threads) const { return apply_.HashLater(detected_, threads); }
  // The delta of the last successful Run; its parts point into buffers this
  // object keeps until the next Run or Release.
  EncodedPatch TakePatch();
  uint64_t changed() const { return detected_.changed; }
  // Puts back in `state` what the last successful Run overwrote (once).
  void Undo(WeightState& state, int threads);
  // Frees every buffer kept for the next Run.
  void Release();

 private:
  DetectedGapDelta detected_;  // the delta's streams and the old values, per chunk
  bf16::GapDeltaApply apply_;
};

}  // namespace deltasync
