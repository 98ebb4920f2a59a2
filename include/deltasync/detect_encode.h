// Detect and encode a gap_delta delta in one pass: what DetectChanges
// followed by EncodeDelta (gap_delta) give, the same bytes, without the
// intermediate TensorChanges. Each chunk of a tensor writes its gaps (16-bit)
// and values straight into buffers of its own while it scans, through a
// block-sized index scratch that stays in cache; the patch's parts point into
// those buffers (a tensor's .idx and .val each span its chunks' buffers, in
// order). A training loop's repeated calls reuse them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "deltasync/changes.h"
#include "deltasync/patch.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"
#include "deltasync/weight_state.h"

namespace deltasync {

// What DetectAndEncodeGapDelta writes into; keep one across calls. Movable,
// not copyable (`patch.parts` point into `buffers`).
struct DetectedGapDelta {
  DetectedGapDelta();
  ~DetectedGapDelta();
  DetectedGapDelta(DetectedGapDelta&&) noexcept;
  DetectedGapDelta& operator=(DetectedGapDelta&&) noexcept;

  // The delta: parts point into patch.owned (the header) and `buffers`.
  EncodedPatch patch;
  uint64_t changed = 0;         // changed elements, all tensors
  uint64_t changed_tensors = 0;  // tensors with at least one change

  struct Buffers;  // per-chunk gap and value buffers, reused by the next call
  std::unique_ptr<Buffers> buffers;
};

// The gap_delta delta of `current` against `published`: on success
// out.patch holds exactly the bytes (concatenated parts) that
//   DetectChanges(published, current, options) followed by
//   EncodeDelta(info, those changes)
// give, and out.changed / out.changed_tensors count its changes. The same
// errors as those two calls (the detect's first), and before them
// kInvalidArgument when info.encoding is not gap_delta; on an error
// out.patch holds no patch
// (`parts` empty, `size` 0). info.total_elements must be the state's element
// count, as for EncodeDelta. Whatever `out` held before is overwritten: its
// parts must no longer be in use. The memory held is the buffers of the
// largest delta so far per chunk of 2 Mi elements (~4 bytes per change,
// rounded up to 64 KiB per chunk), plus one block's index scratch per thread.
Status DetectAndEncodeGapDelta(const WeightState& published, std::span<const TensorView> current,
                               const DetectOptions& options, const PatchInfo& info, DetectedGapDelta& out);
// The same against a base given as views (DetectChanges' view overload:
// its checks and errors), e.g. a PublishedViews' tensors.
Status DetectAndEncodeGapDelta(std::span<const TensorView> published, std::span<const TensorView> current,
                               const DetectOptions& options, const PatchInfo& info, DetectedGapDelta& out);

}  // namespace deltasync
