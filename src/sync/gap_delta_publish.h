// The Publisher's gap_delta route (internal to src/sync): the delta is
// detected and encoded in one pass (DetectAndEncodeGapDelta, no change list),
// then applied to the published state from its own bytes the way a replica
// applies it (DecodePatch keeping the gaps encoded, ApplyGapChanges with an
// undo log). The state the publisher hashes and keeps is therefore exactly
// what the uploaded delta gives a replica.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "deltasync/blob.h"
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
  // detect's and the encoder's errors, or kInternal when the delta's own
  // bytes do not decode and apply: a bug) `state` is unchanged. What a
  // previous call returned must no longer be in use.
  Result<StateHash> Run(WeightState& state, std::span<const TensorView> current, const DetectOptions& options,
                        const PatchInfo& info, int threads);
  // The delta of the last successful Run; its parts point into buffers this
  // object keeps until the next Run or Release.
  EncodedPatch TakePatch();
  uint64_t changed() const { return detected_.changed; }
  // Puts back in `state` what the last successful Run overwrote (once).
  void Undo(WeightState& state, int threads);
  // Frees every buffer kept for the next Run.
  void Release();

 private:
  DetectedGapDelta detected_;
  std::shared_ptr<BufferPool> pool_;  // the delta's contiguous copy's pages, reused
  DecodedPatch decoded_;              // views into that copy
  std::vector<uint8_t> undo_;         // ApplyGapChanges' old values
};

}  // namespace deltasync
