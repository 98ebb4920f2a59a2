#include "sync/gap_delta_publish.h"

#include <cstring>
#include <utility>

#include "deltasync/safetensors.h"

namespace deltasync {
namespace {
// Idle pages kept for the next version's copy: one delta of up to 4 GiB
// (~1 Gi changes of a bf16 model).
constexpr size_t kPoolBytes = size_t{4} << 30;
}  // namespace

GapDeltaPublish::GapDeltaPublish() : pool_(std::make_shared<BufferPool>(kPoolBytes)) {}
GapDeltaPublish::~GapDeltaPublish() = default;

Result<StateHash> GapDeltaPublish::Run(WeightState& state, std::span<const TensorView> current,
                                       const DetectOptions& options, const PatchInfo& info, int threads) {
  decoded_ = DecodedPatch{};  // the last copy's pages go back to the pool
  DS_RETURN_IF_ERROR(DetectAndEncodeGapDelta(state, current, options, info, detected_));
  // One contiguous copy of the delta (the parts point into per-chunk
  // buffers), decoded as a replica decodes it.
  BlobBuffer copy(pool_);
  if (!copy.Resize(detected_.patch.size)) {
    return Status::Internal("out of memory for a copy of the " + std::to_string(detected_.patch.size) +
                            "-byte gap_delta delta");
  }
  uint8_t* at = copy.data();
  for (ByteSpan part : detected_.patch.parts) {
    if (!part.empty()) std::memcpy(at, part.data(), part.size());
    at += part.size();
  }
  auto internal = [&](const Status& s) {
    return Status::Internal("the publisher's own gap_delta delta for version " + std::to_string(info.model_version) +
                            " does not apply: " + s.message());
  };
  Result<SafetensorsFile> file = SafetensorsFile::Parse(Blob::FromBuffer(std::move(copy)), "gap_delta delta");
  if (!file.ok()) return internal(file.status());
  Result<DecodedPatch> decoded = DecodePatch(std::move(*file), DecodePatchOptions{.keep_gaps_encoded = true});
  if (!decoded.ok()) return internal(decoded.status());
  if (!decoded->changes.empty()) return internal(Status::Internal("its indices did not stay encoded"));
  Status valid = ValidateEncodedChanges(state, decoded->encoded);
  if (!valid.ok()) return internal(valid);
  decoded_ = std::move(*decoded);
  return ApplyGapChanges(state, decoded_.encoded, threads, undo_);
}

EncodedPatch GapDeltaPublish::TakePatch() { return std::move(detected_.patch); }

void GapDeltaPublish::Undo(WeightState& state, int threads) {
  UndoGapChanges(state, decoded_.encoded, threads, undo_);
  decoded_ = DecodedPatch{};
}

void GapDeltaPublish::Release() {
  detected_ = DetectedGapDelta{};
  decoded_ = DecodedPatch{};
  undo_ = {};
  pool_ = std::make_shared<BufferPool>(kPoolBytes);
}

}  // namespace deltasync
