// Detecting, encoding and applying a gap_delta delta in one pass
// (detect_encode_apply.h): the per-block apply the scan's chunks call, the
// per-chunk undo, and the entry point.
#include "bf16/detect_encode_apply.h"

#include <algorithm>
#include <cstring>

#include "bf16/detect_apply.h"
#include "bf16/gap_walk.h"
#include "bf16/simd_kernels.h"
#include "common/parallel.h"

namespace deltasync::bf16 {

void ApplyGapBlock(const ScanJob& job, uint64_t begin, const uint16_t* gaps, const uint8_t* values, size_t added,
                   bool gaps_kernel, uint64_t* indices, uint8_t* old, const state_hash::TensorSeeds& seeds,
                   bool hash_later, uint64_t hash[2]) {
  if (gaps_kernel) {
    // The kernel wrote the block's first change as its offset and each
    // later one as the gap from the one before.
    GapWalk(begin + gaps[0], gaps).Next(added, indices);
  }
  // The published state is the caller's mutable WeightState
  // (GapDeltaApply::Run); each chunk writes only its own elements.
  if (hash_later) {
    // ApplyBlock's 2-byte case without its hash terms (HashLater's).
    uint16_t* const data = reinterpret_cast<uint16_t*>(const_cast<uint8_t*>(job.published));
    for (size_t k = 0; k < added; ++k) std::memcpy(old + 2 * k, &data[indices[k]], 2);
    for (size_t k = 0; k < added; ++k) std::memcpy(&data[indices[k]], values + 2 * k, 2);
    return;
  }
  ApplyBlock(const_cast<uint8_t*>(job.published), DTypeSize(job.published_dtype), indices, values, old, added, seeds,
             hash);
}

void UndoGapChunk(uint8_t* data, size_t value_size, const ChunkGaps& found,
                  const DetectedGapDelta::Buffers::ChunkStreams& streams) {
  if (found.count == 0) return;
  const uint16_t* gaps = reinterpret_cast<const uint16_t*>(streams.gaps.data());
  const uint8_t* old = streams.old.data();
  // Slot 0 holds the chunk's gap from the chunk before (or nothing yet):
  // the walk starts from its first index instead.
  GapWalk walk(found.first, gaps, found.wide);
  uint64_t index[512];
  for (size_t k = 0; k < found.count; k += 512) {
    const size_t n = std::min<size_t>(512, found.count - k);
    walk.Next(n, index);
    UndoBlock(data, value_size, index, old + k * value_size, n);
  }
}

Result<StateHash> GapDeltaApply::Run(WeightState& published, std::span<const TensorView> current,
                                     const DetectOptions& options, const PatchInfo& info, uint64_t chunk_elements,
                                     DetectedGapDelta& out) {
  return Scan(published, current, options, info, chunk_elements, out, /*hash_later=*/false);
}

Result<StateHash> GapDeltaApply::RunHashLater(WeightState& published, std::span<const TensorView> current,
                                              const DetectOptions& options, const PatchInfo& info,
                                              uint64_t chunk_elements, DetectedGapDelta& out) {
  return Scan(published, current, options, info, chunk_elements, out, /*hash_later=*/true);
}

StateHash GapDeltaApply::HashLater(const DetectedGapDelta& out, int threads) const {
  if (!apply_.hash_later) return StateHash{};  // Run summed every term
  std::vector<StateHash> terms(chunks_.size());
  ParallelFor(chunks_.size(), threads, [&](size_t c) {
    const ChunkGaps& f = found_[c];
    const size_t tensor = chunks_[c].tensor;
    if (!apply_.HashedLater(tensor) || f.count == 0) return;
    const DetectedGapDelta::Buffers::ChunkStreams& streams = *out.buffers->chunks[c];
    // The walk of UndoGapChunk: slot 0 of the gaps is the chunk's gap from
    // the chunk before, so it starts from the chunk's first index.
    GapWalk walk(f.first, reinterpret_cast<const uint16_t*>(streams.gaps.data()), f.wide);
    uint64_t index[512];
    uint64_t hash[2] = {0, 0};
    for (size_t k = 0; k < f.count; k += 512) {
      const size_t n = std::min<size_t>(512, f.count - k);
      walk.Next(n, index);
      kernels::HashTermDiffs16(index, streams.values.data() + 2 * k, streams.old.data() + 2 * k, n,
                               apply_.seeds[tensor].element_seed, hash);
    }
    terms[c] = StateHash{hash[0], hash[1]};
  });
  StateHash change;
  for (const StateHash& t : terms) change += t;
  return change;
}

Result<StateHash> GapDeltaApply::Scan(WeightState& published, std::span<const TensorView> current,
                                      const DetectOptions& options, const PatchInfo& info, uint64_t chunk_elements,
                                      DetectedGapDelta& out, bool hash_later) {
  applied_ = false;
  DS_RETURN_IF_ERROR(StartPatch(info, out));
  DS_ASSIGN_OR_RETURN(std::vector<ScanJob> jobs, PlanDetect(published, current, options));
  // PlanDetect makes one job per tensor of `published`, in order.
  apply_.seeds.clear();
  apply_.value_sizes.clear();
  apply_.seeds.reserve(jobs.size());
  apply_.value_sizes.reserve(jobs.size());
  for (const WeightState::Tensor& t : published.tensors()) {
    apply_.seeds.push_back(state_hash::SeedsFor(t.name, t.dtype, t.shape));
    apply_.value_sizes.push_back(DTypeSize(t.dtype));
  }
  apply_.hash_later = hash_later;
  StateHash delta;
  Status done = DetectAndEncodeJobs(jobs, options, info, chunk_elements, out, chunks_, found_, &apply_, &delta);
  if (!done.ok()) {
    // Every chunk that ran (a chunk not run found nothing) puts back what it
    // applied, the failed ones included.
    applied_ = true;
    Undo(published, out, options.threads);
    out.patch.parts.clear();
    out.patch.size = 0;
    out.changed = out.changed_tensors = 0;
    return done;
  }
  applied_ = true;
  return delta;
}

void GapDeltaApply::Undo(WeightState& published, const DetectedGapDelta& out, int threads) {
  if (!applied_) return;
  applied_ = false;
  std::vector<WeightState::Tensor>& tensors = published.mutable_tensors();
  ParallelFor(chunks_.size(), threads, [&](size_t c) {
    WeightState::Tensor& t = tensors[chunks_[c].tensor];
    UndoGapChunk(t.data.data(), DTypeSize(t.dtype), found_[c], *out.buffers->chunks[c]);
  });
}

}  // namespace deltasync::bf16
