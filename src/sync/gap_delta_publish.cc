#include "sync/gap_delta_publish.h"

#include <utility>

#include "bf16/chunks.h"

namespace deltasync {

GapDeltaPublish::GapDeltaPublish() = default;
GapDeltaPublish::~GapDeltaPublish() = default;

Result<StateHash> GapDeltaPublish::Run(WeightState& state, std::span<const TensorView> current,
                                       const DetectOptions& options, const PatchInfo& info) {
  return apply_.Run(state, current, options, info, bf16::kDefaultChunkElements, detected_);
}

Result<StateHash> GapDeltaPublish::RunHashLater(WeightState& state, std::span<const TensorView> current,
                                                const DetectOptions& options, const PatchInfo& info) {
  return apply_.RunHashLater(state, current, options, info, bf16::kDefaultChunkElements, detected_);
}

EncodedPatch GapDeltaPublish::TakePatch() { return std::move(detected_.patch); }

void GapDeltaPublish::Undo(WeightState& state, int threads) { apply_.Undo(state, detected_, threads); }

void GapDeltaPublish::Release() {
  detected_ = DetectedGapDelta{};
  apply_ = bf16::GapDeltaApply{};
}

}  // namespace deltasync
