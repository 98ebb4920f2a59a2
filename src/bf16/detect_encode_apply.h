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
  // Run with the hash change's terms of 2-byte values (nearly all of it)
  // left out of the scan: the result is the change of the other dtypes'
  // changes only, and HashLater() gives the rest. Run's result is their sum.
  Result<StateHash> RunHashLater(WeightState& published, std::span<const TensorView> current,
                                 const DetectOptions& options, const PatchInfo& info, uint64_t chunk_elements,
                                 DetectedGapDelta& out);
  // After a successful RunHashLater into `out`, before its Undo (`out` not
  // written since): the hash change of its 2-byte changes, summed from the
  // chunks' gap, value and old-value streams (the values the scan wrote into
  // `published` and the delta carries, and the ones they replaced). Reads
  // only those streams and what the Run kept, so it may run beside a write
  // of the patch's parts. Allocates (a StateHash a chunk) and may start a
  // thread: it can throw std::bad_alloc or std::system_error.
  StateHash HashLater(const DetectedGapDelta& out, int threads) const;
  // Puts back in `published` what the last successful Run into `out`
  // applied (once; `out` not written since).
  void Undo(WeightState& published, const DetectedGapDelta& out, int threads);

 private:
  Result<StateHash> Scan(WeightState& published, std::span<const TensorView> current, const DetectOptions& options,
                         const PatchInfo& info, uint64_t chunk_elements, DetectedGapDelta& out, bool hash_later);

  std::vector<Chunk> chunks_;     // the last Run's
  std::vector<ChunkGaps> found_;  // what each of its chunks found and applied
  GapApply apply_;                // its tensors' seeds, and whether it left the hash for later
  bool applied_ = false;          // a Run succeeded and was not undone
};

}  // namespace deltasync::bf16
