// DetectAndEncodeGapDelta (include/deltasync/detect_encode.h): the detect's
// chunks write the gap_delta streams themselves.
//
// Each chunk is scanned in blocks of kBlock elements. For fp32 masters of a
// bf16 tensor (the common case) one kernel, CompareF32ToBf16Gaps, writes a
// block's gaps and values straight into the chunk's gap and value streams
// (on AVX-512 CPUs 32 elements a step by VPCOMPRESSW: detect_gaps_avx512.h).
// For other dtypes the Compare kernel writes the values into the value
// stream and its 64-bit indices into a per-worker scratch of one block,
// which is still in L2 when they are turned into 16-bit gaps. So a change
// costs the bytes of its gap and value, written once, where DetectChanges +
// EncodeDelta write each change's index and value into a growing scratch,
// copy them into the TensorChanges and read them back to encode (~40 bytes
// of memory traffic more per change).
//
// What a chunk cannot know while it scans is settled after the scan, per
// tensor: the gap of its first change (it depends on the last change of the
// chunk before), and whether the tensor's gaps all fit 16 bits. When one
// does not (rare: a gap of 64 Ki unchanged elements), the tensor's gaps are
// widened into one buffer from the 16-bit streams and the chunks' lists of
// the gaps that did not fit.
//
// The Publisher's route also applies each block's changes as the block is
// scanned (detect_encode_apply.h: ApplyGapBlock, called from ScanChunk).
#include "deltasync/detect_encode.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "bf16/chunked.h"
#include "bf16/chunks.h"
#include "bf16/gap_streams.h"
#include "bf16/scan.h"
#include "bf16/scratch.h"
#include "bf16/simd_kernels.h"
#include "codec/delta_header.h"
#include "codec/index_codec.h"
#include "codec/patch_metadata.h"
#include "common/parallel.h"

namespace deltasync {

DetectedGapDelta::DetectedGapDelta() = default;
DetectedGapDelta::~DetectedGapDelta() = default;
DetectedGapDelta::DetectedGapDelta(DetectedGapDelta&&) noexcept = default;
DetectedGapDelta& DetectedGapDelta::operator=(DetectedGapDelta&&) noexcept = default;

namespace bf16 {
namespace {

using ChunkStreams = DetectedGapDelta::Buffers::ChunkStreams;

// 16 Ki elements: a block's indices (128 KiB) stay in L2 from the kernel's
// stores to the gaps' loads.
constexpr uint64_t kBlock = uint64_t{1} << 14;
constexpr uint64_t kU16Max = std::numeric_limits<uint16_t>::max();
static_assert(kBlock <= kU16Max + 1, "the gaps inside a block must fit 16 bits");
static_assert(kBlock <= kernels::kCompareGapsMaxElements, "a block is one CompareF32ToBf16Gaps call");
// Below this many changes in total, the per-tensor finishing stays on the
// calling thread (EncodeDelta's threshold).
constexpr uint64_t kParallelMinChanges = uint64_t{1} << 18;

// Compares elements [begin, begin + n) of a job whose fp32 masters round to
// its bf16 (the common case): the kernel writes the gaps itself (the first
// one as its offset in the block). Returns the changes; *first and *last as
// their first and last index.
size_t CompareGapsBlock(const ScanJob& job, uint64_t begin, size_t n, uint16_t* gaps, uint8_t* values,
                        uint64_t* first, uint64_t* last, size_t* first_bad) {
  size_t last_offset = 0;
  const size_t added = kernels::CompareF32ToBf16Gaps(
      reinterpret_cast<const uint16_t*>(job.published) + begin, reinterpret_cast<const uint32_t*>(job.current) + begin,
      n, job.exp_mask != 0, gaps, reinterpret_cast<uint16_t*>(values), &last_offset, first_bad);
  if (added > 0) {
    *first = begin + gaps[0];
    *last = begin + last_offset;
  }
  return added;
}

// The same for any other job: the Compare kernel's 64-bit indices into
// `indices` (one block's, still in L2), turned into gaps 1 .. added - 1.
size_t CompareIndicesBlock(const ScanJob& job, uint64_t begin, size_t n, uint64_t* indices, uint16_t* gaps,
                           uint8_t* values, uint64_t* first, uint64_t* last, size_t* first_bad) {
  const size_t added = CompareSpan(job, begin, n, indices, values, first_bad);
  if (*first_bad < n || added == 0) return added;
  for (size_t k = 1; k < added; ++k) gaps[k] = static_cast<uint16_t>(indices[k] - indices[k - 1] - 1);
  *first = indices[0];
  *last = indices[added - 1];
  return added;
}

// With `apply` (the job's seeds), each block's changes are applied to the
// job's published bytes right after the compare (ApplyGapBlock), while the
// block's elements are in cache; with `hash_later`, without their hash terms.
void ScanChunk(const ScanJob& job, const Chunk& chunk, ScratchBuffer& indices, ChunkStreams& streams,
               ChunkGaps& out, const state_hash::TensorSeeds* apply, bool hash_later) {
  const size_t value_size = DTypeSize(job.published_dtype);
  const bool gaps_kernel = job.f32_to_bf16();
  const size_t slack = gaps_kernel ? kernels::kCompareGapsSlack : kernels::kCompareOutputSlack;
  for (uint64_t begin = chunk.begin; begin < chunk.end; begin += kBlock) {
    const size_t n = static_cast<size_t>(std::min(kBlock, chunk.end - begin));
    const size_t room = out.count + n + slack;
    if (!streams.values.Reserve(room * value_size) || !streams.gaps.Reserve(room * sizeof(uint16_t)) ||
        ((!gaps_kernel || apply) && !indices.Reserve((n + slack) * sizeof(uint64_t))) ||
        (apply && !streams.old.Reserve(room * value_size))) {
      out.out_of_memory = true;
      return;
    }
    uint16_t* const gaps = reinterpret_cast<uint16_t*>(streams.gaps.data()) + out.count;
    uint8_t* const values = streams.values.data() + out.count * value_size;
    uint64_t first = 0, last = 0;
    size_t first_bad = n;
    const size_t added =
        gaps_kernel ? CompareGapsBlock(job, begin, n, gaps, values, &first, &last, &first_bad)
                    : CompareIndicesBlock(job, begin, n, reinterpret_cast<uint64_t*>(indices.data()), gaps, values,
                                          &first, &last, &first_bad);
    if (first_bad < n) {
      out.first_bad = begin + first_bad;
      return;
    }
    if (added == 0) continue;
    if (apply) {
      ApplyGapBlock(job, begin, gaps, values, added, gaps_kernel, reinterpret_cast<uint64_t*>(indices.data()),
                    streams.old.data() + out.count * value_size, *apply, hash_later, out.hash);
    }
    // The gaps after a block's first are below kBlock. The chunk's own first
    // gap waits for the scan's end; a block's first may be wide.
    const bool chunk_first = out.count == 0;
    const uint64_t gap0 = chunk_first ? 0 : first - out.last - 1;
    if (gap0 > kU16Max) out.wide.emplace_back(out.count, gap0);
    out.or_gap |= gap0;
    gaps[0] = static_cast<uint16_t>(gap0);
    if (chunk_first) out.first = first;
    out.last = last;
    out.count += added;
  }
}

// One changed tensor of the patch: chunks [first_chunk, end_chunk).
struct TensorGaps {
  size_t job = 0;
  size_t first_chunk = 0, end_chunk = 0;
  uint64_t count = 0;
  DType index_dtype = DType::kU16;
  bool out_of_memory = false;
};

// The tensor's gaps as T, from its chunks' 16-bit streams, first gaps and
// lists of wide gaps, into `wide`.
template <typename T>
bool Widen(const TensorGaps& t, std::span<const ChunkGaps> found,
           const std::vector<std::unique_ptr<ChunkStreams>>& streams, ScratchBuffer& wide) {
  if (!wide.Reserve(t.count * sizeof(T))) return false;
  T* out = reinterpret_cast<T*>(wide.data());
  for (size_t c = t.first_chunk; c < t.end_chunk; ++c) {
    const ChunkGaps& f = found[c];
    if (f.count == 0) continue;
    const uint16_t* gaps = reinterpret_cast<const uint16_t*>(streams[c]->gaps.data());
    for (size_t k = 0; k < f.count; ++k) out[k] = gaps[k];
    out[0] = static_cast<T>(f.gap0);
    for (const auto& [k, gap] : f.wide) out[k] = static_cast<T>(gap);
    out += f.count;
  }
  return true;
}

void AppendPart(EncodedPatch& out, const uint8_t* data, size_t bytes) {
  if (bytes == 0) return;
  out.parts.push_back(ByteSpan(data, bytes));
  out.size += bytes;
}

}  // namespace

Status StartPatch(const PatchInfo& info, DetectedGapDelta& out) {
  out.patch.parts.clear();
  out.patch.size = 0;
  out.changed = out.changed_tensors = 0;
  if (info.encoding == IndexEncoding::kGapDelta) return Status::OK();
  return Status::InvalidArgument("DetectAndEncodeGapDelta writes gap_delta deltas, not " +
                                 std::string(EncodingName(info.encoding)));
}

Status DetectAndEncodeJobs(const std::vector<ScanJob>& jobs, const DetectOptions& options, const PatchInfo& info,
                           uint64_t chunk_elements, DetectedGapDelta& out, std::vector<Chunk>& chunks,
                           std::vector<ChunkGaps>& found, const GapApply* apply, StateHash* delta) {
  if (!out.buffers) out.buffers = std::make_unique<DetectedGapDelta::Buffers>();
  DetectedGapDelta::Buffers& buffers = *out.buffers;

  chunks = SplitIntoChunks(ElementCounts(jobs), chunk_elements);
  while (buffers.chunks.size() < chunks.size()) buffers.chunks.push_back(std::make_unique<ChunkStreams>());
  const size_t workers = std::max<size_t>(
      1, std::min(static_cast<size_t>(ResolveThreads(options.threads)), chunks.size()));
  while (buffers.indices.size() < workers) buffers.indices.push_back(std::make_unique<ScratchBuffer>());
  found.assign(chunks.size(), ChunkGaps{});
  RunChunks(chunks.size(), options.threads, [&](size_t worker, size_t c) {
    ScanChunk(jobs[chunks[c].tensor], chunks[c], *buffers.indices[worker], *buffers.chunks[c], found[c],
              apply ? &apply->seeds[chunks[c].tensor] : nullptr, apply && apply->HashedLater(chunks[c].tensor));
    return !found[c].failed();
  });
  if (apply) {
    for (const ChunkGaps& f : found) *delta += StateHash{f.hash[0], f.hash[1]};
  }
  // The first failure in chunk order is the first in (tensor, index) order.
  for (size_t c = 0; c < chunks.size(); ++c) {
    const ScanJob& job = jobs[chunks[c].tensor];
    if (found[c].first_bad != kNoError) return NonFiniteError(job, found[c].first_bad);
    if (found[c].out_of_memory) return Status::Internal(Quoted(job.name) + ": out of memory while collecting changes");
  }

  // The changed tensors, in name order (the patch's).
  std::vector<TensorGaps> tensors;
  uint64_t changed = 0;
  for (size_t c = 0; c < chunks.size();) {
    TensorGaps t{chunks[c].tensor, c, c};
    for (; t.end_chunk < chunks.size() && chunks[t.end_chunk].tensor == t.job; ++t.end_chunk) {
      t.count += found[t.end_chunk].count;
    }
    c = t.end_chunk;
    changed += t.count;
    if (t.count > 0) tensors.push_back(t);
  }
  std::stable_sort(tensors.begin(), tensors.end(),
                   [&](const TensorGaps& a, const TensorGaps& b) { return jobs[a.job].name < jobs[b.job].name; });
  DS_RETURN_IF_ERROR(codec::CheckDeltaInfo(info, changed));

  // Each chunk's first gap, now that the chunk before is known; the width of
  // each tensor's gaps, widened where 16 bits do not hold them all.
  while (buffers.wide.size() < tensors.size()) buffers.wide.push_back(std::make_unique<ScratchBuffer>());
  ParallelFor(tensors.size(), changed >= kParallelMinChanges ? options.threads : 1, [&](size_t i) {
    TensorGaps& t = tensors[i];
    uint64_t prev = ~uint64_t{0};  // idx[-1] = -1
    uint64_t or_gap = 0;
    for (size_t c = t.first_chunk; c < t.end_chunk; ++c) {
      ChunkGaps& f = found[c];
      if (f.count == 0) continue;
      f.gap0 = f.first - prev - 1;
      reinterpret_cast<uint16_t*>(buffers.chunks[c]->gaps.data())[0] = static_cast<uint16_t>(f.gap0);
      or_gap |= f.gap0 | f.or_gap;
      prev = f.last;
    }
    t.index_dtype = indexcodec::GapDType(or_gap);
    if (t.index_dtype == DType::kU16) return;
    const bool ok = t.index_dtype == DType::kU32 ? Widen<uint32_t>(t, found, buffers.chunks, *buffers.wide[i])
                                                 : Widen<uint64_t>(t, found, buffers.chunks, *buffers.wide[i]);
    t.out_of_memory = !ok;
  });

  std::vector<std::string> names;
  names.reserve(2 * tensors.size());
  std::vector<std::vector<uint64_t>> shapes;
  shapes.reserve(tensors.size());
  std::vector<TensorLayout> layouts;
  layouts.reserve(2 * tensors.size());
  for (const TensorGaps& t : tensors) {
    const ScanJob& job = jobs[t.job];
    if (t.out_of_memory) return Status::Internal(Quoted(job.name) + ": out of memory while widening its gaps");
    names.push_back(std::string(job.name) + std::string(patchmeta::kIdxSuffix));
    names.push_back(std::string(job.name) + std::string(patchmeta::kValSuffix));
    shapes.push_back({t.count});
    layouts.push_back({names[names.size() - 2], t.index_dtype, shapes.back(), t.count * DTypeSize(t.index_dtype)});
    layouts.push_back({names.back(), job.published_dtype, shapes.back(), t.count * DTypeSize(job.published_dtype)});
  }
  DS_ASSIGN_OR_RETURN(std::vector<uint8_t> header, codec::EncodeDeltaHeader(info, tensors.size(), changed, layouts));
  out.patch.owned.resize(1);
  out.patch.owned[0] = std::move(header);

  EncodedPatch& patch = out.patch;
  AppendPart(patch, patch.owned[0].data(), patch.owned[0].size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorGaps& t = tensors[i];
    if (t.index_dtype == DType::kU16) {
      for (size_t c = t.first_chunk; c < t.end_chunk; ++c) {
        AppendPart(patch, buffers.chunks[c]->gaps.data(), found[c].count * sizeof(uint16_t));
      }
    } else {
      AppendPart(patch, buffers.wide[i]->data(), t.count * DTypeSize(t.index_dtype));
    }
    const size_t value_size = DTypeSize(jobs[t.job].published_dtype);
    for (size_t c = t.first_chunk; c < t.end_chunk; ++c) {
      AppendPart(patch, buffers.chunks[c]->values.data(), found[c].count * value_size);
    }
  }
  out.changed = changed;
  out.changed_tensors = tensors.size();
  return Status::OK();
}

Status DetectAndEncodeGapDeltaChunked(const WeightState& published, std::span<const TensorView> current,
                                      const DetectOptions& options, const PatchInfo& info,
                                      uint64_t chunk_elements, DetectedGapDelta& out) {
  DS_RETURN_IF_ERROR(StartPatch(info, out));
  DS_ASSIGN_OR_RETURN(std::vector<ScanJob> jobs, PlanDetect(published, current, options));
  std::vector<Chunk> chunks;
  std::vector<ChunkGaps> found;
  return DetectAndEncodeJobs(jobs, options, info, chunk_elements, out, chunks, found, nullptr, nullptr);
}

Status DetectAndEncodeGapDeltaChunked(std::span<const TensorView> published, std::span<const TensorView> current,
                                      const DetectOptions& options, const PatchInfo& info,
                                      uint64_t chunk_elements, DetectedGapDelta& out) {
  DS_RETURN_IF_ERROR(StartPatch(info, out));
  DS_ASSIGN_OR_RETURN(std::vector<ScanJob> jobs, PlanDetect(published, current, options));
  std::vector<Chunk> chunks;
  std::vector<ChunkGaps> found;
  return DetectAndEncodeJobs(jobs, options, info, chunk_elements, out, chunks, found, nullptr, nullptr);
}

}  // namespace bf16

Status DetectAndEncodeGapDelta(const WeightState& published, std::span<const TensorView> current,
                               const DetectOptions& options, const PatchInfo& info, DetectedGapDelta& out) {
  return bf16::DetectAndEncodeGapDeltaChunked(published, current, options, info, bf16::kDefaultChunkElements, out);
}

Status DetectAndEncodeGapDelta(std::span<const TensorView> published, std::span<const TensorView> current,
                               const DetectOptions& options, const PatchInfo& info, DetectedGapDelta& out) {
  return bf16::DetectAndEncodeGapDeltaChunked(published, current, options, info, bf16::kDefaultChunkElements, out);
}

}  // namespace deltasync
