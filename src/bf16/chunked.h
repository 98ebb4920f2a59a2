// The chunked entry points behind DetectChanges, ToPublishedState and
// HashTensors, with the chunk size explicit (internal: tests use tiny chunks
// to put chunk boundaries everywhere in small tensors).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "deltasync/changes.h"
#include "deltasync/detect_encode.h"
#include "deltasync/state_hash.h"

namespace deltasync::bf16 {

// DetectChanges / ToPublishedState / ViewAsPublished / HashTensors, splitting tensors into
// chunks of `chunk_elements` (see chunks.h). Results do not depend on it.
Result<std::vector<TensorChanges>> DetectChangesChunked(const WeightState& published,
                                                        std::span<const TensorView> current,
                                                        const DetectOptions& options,
                                                        uint64_t chunk_elements);
Status DetectChangesChunked(const WeightState& published, std::span<const TensorView> current,
                            const DetectOptions& options, uint64_t chunk_elements,
                            std::vector<TensorChanges>& out);
Result<WeightState> ToPublishedStateChunked(std::span<const TensorView> current,
                                            const DetectOptions& options, uint64_t chunk_elements);
Result<std::vector<TensorChanges>> DetectChangesChunked(std::span<const TensorView> published,
                                                        std::span<const TensorView> current,
                                                        const DetectOptions& options,
                                                        uint64_t chunk_elements);
Result<PublishedViews> ViewAsPublishedChunked(std::span<const TensorView> current, const DetectOptions& options,
                                              uint64_t chunk_elements);
StateHash HashTensorsChunked(std::span<const TensorView> tensors, int threads,
                             uint64_t chunk_elements);

// DetectAndEncodeGapDelta with chunks of `chunk_elements`: the same bytes
// whatever the chunk size.
Status DetectAndEncodeGapDeltaChunked(const WeightState& published, std::span<const TensorView> current,
                                      const DetectOptions& options, const PatchInfo& info,
                                      uint64_t chunk_elements, DetectedGapDelta& out);
Status DetectAndEncodeGapDeltaChunked(std::span<const TensorView> published, std::span<const TensorView> current,
                                      const DetectOptions& options, const PatchInfo& info,
                                      uint64_t chunk_elements, DetectedGapDelta& out);

}  // namespace deltasync::bf16
