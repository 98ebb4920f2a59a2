// Detecting, encoding and applying a gap_delta delta in one pass (internal;
// the Publisher's gap_delta route, sync/gap_delta_publish.h).
//
// DetectAndEncodeGapDelta followed by an apply of the delta reads the
// published state twice: once to compare, then, at every changed element, to
// log its old value, sum its state-hash change and write the new one. At a
// few percent changed nearly every cache line of the state holds a change,
// so the second pass streams the state again. Here each block of 16 Ki
// elements applies its changes right after its compare wrote them into the
// chunk's gap and value streams (the bytes the patch's parts point at),
// while the block's published elements are still in cache.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "bf16/chunks.h"
#include "bf16/gap_streams.h"
#include "deltasync/detect_encode.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/weight_state.h"

namespace deltasync::bf16 {

class GapDeltaApply {
 public:
  // DetectAndEncodeGapDeltaChunked(published, current, options, info,
  // chunk_elements, out) (the same patch bytes, counts and errors), with the
  // changes applied to `published` as they are found: on success
  // `published` equals what the patch gives it, and the result is the change
  // to its state hash (HashChanges against the state before). On an error
  // `published` is as it was and out.patch holds no patch.
  Result<StateHash> Run(WeightState& published, std::span<const TensorView> current, const DetectOptions& options,
                        const PatchInfo& info, uint64_t chunk_elements, DetectedGapDelta& out);
  // Puts back in `published` what the last successful Run into `out`
  // applied (once; `out` not written since).
  void Undo(WeightState& published, const DetectedGapDelta& out, int threads);

 private:
  std::vector<Chunk> chunks_;     // the last Run's
  std::vector<ChunkGaps> found_;  // what each of its chunks found and applied
  bool applied_ = false;          // a Run succeeded and was not undone
};

}  // namespace deltasync::bf16
