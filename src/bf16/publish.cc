// ToPublishedState: the first version's published weights (f32 rounded to
// bf16, everything checked for NaN/Inf), in parallel chunks.

#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bf16/chunked.h"
#include "bf16/chunks.h"
#include "bf16/scan.h"
#include "bf16/simd_kernels.h"
#include "deltasync/changes.h"

namespace deltasync::bf16 {

Status ConvertAndCheck(const std::vector<ScanJob>& jobs, const DetectOptions& options, uint64_t chunk_elements) {
  const std::vector<Chunk> chunks = SplitIntoChunks(ElementCounts(jobs), chunk_elements);
  std::vector<uint64_t> first_bad(chunks.size(), kNoError);
  RunChunks(chunks.size(), options.threads, [&](size_t /*worker*/, size_t c) {
    const ScanJob& job = jobs[chunks[c].tensor];
    const uint64_t begin = chunks[c].begin;
    const size_t n = static_cast<size_t>(chunks[c].end - begin);
    const size_t size = DTypeSize(job.current_dtype);
    const uint8_t* src = job.current + begin * size;
    size_t bad = n;
    if (job.converted != nullptr) {
      const auto* in = reinterpret_cast<const uint32_t*>(src);
      auto* out = reinterpret_cast<uint16_t*>(job.converted + begin * 2);
      if (job.exp_mask != 0) {
        bad = kernels::ConvertF32ToBf16Checked(in, out, n);
      } else {
        kernels::ConvertF32ToBf16(in, out, n);
      }
    } else if (size == 2) {
      bad = kernels::FindNonFinite16(reinterpret_cast<const uint16_t*>(src), n,
                                     static_cast<uint16_t>(job.exp_mask));
    } else if (size == 4) {
      bad = kernels::FindNonFinite32(reinterpret_cast<const uint32_t*>(src), n,
                                     static_cast<uint32_t>(job.exp_mask));
    } else {
      bad = kernels::FindNonFinite64(reinterpret_cast<const uint64_t*>(src), n, job.exp_mask);
    }
    if (bad < n) first_bad[c] = begin + bad;
    return bad == n;
  });
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (first_bad[c] != kNoError) return NonFiniteError(jobs[chunks[c].tensor], first_bad[c]);
  }
  return Status::OK();
}

Result<WeightState> ToPublishedStateChunked(std::span<const TensorView> current,
                                            const DetectOptions& options, uint64_t chunk_elements) {
  // FromViews copies bytes, sorts by name and refuses duplicates. An f32
  // tensor is given to it as a bf16 view of the first half of its own bytes:
  // that sizes the published buffer without a temporary, and the rounding
  // below then overwrites those placeholder bytes.
  std::vector<TensorView> views;
  views.reserve(current.size());
  std::unordered_map<std::string_view, const TensorView*> by_name;
  for (const TensorView& v : current) {
    DS_RETURN_IF_ERROR(CheckView(v));
    TensorView view = v;
    if (v.dtype == DType::kF32 && !(options.keep_fp32 && options.keep_fp32(v.name))) {
      view.dtype = DType::kBF16;
      view.data = v.data.first(v.data.size() / 2);
    }
    views.push_back(std::move(view));
    by_name.emplace(v.name, &v);
  }
  DS_ASSIGN_OR_RETURN(WeightState state, WeightState::FromViews(views));

  std::vector<ScanJob> jobs;
  for (WeightState::Tensor& t : state.mutable_tensors()) {
    const TensorView& source = *by_name.at(t.name);
    ScanJob job;
    job.name = t.name;
    job.published_dtype = t.dtype;
    job.current_dtype = source.dtype;
    job.elements = t.num_elements();
    job.exp_mask = options.allow_nonfinite ? 0 : NonFiniteMask(t.dtype);
    if (job.f32_to_bf16()) {
      job.current = source.data.data();
      job.converted = t.data.data();
    } else {
      job.current = t.data.data();  // already copied: only checked
    }
    if (job.converted != nullptr || job.exp_mask != 0) jobs.push_back(job);
  }

  DS_RETURN_IF_ERROR(ConvertAndCheck(jobs, options, chunk_elements));
  return state;
}

}  // namespace deltasync::bf16

namespace deltasync {

Result<WeightState> ToPublishedState(std::span<const TensorView> current,
                                     const DetectOptions& options) {
  return bf16::ToPublishedStateChunked(current, options, bf16::kDefaultChunkElements);
}

}  // namespace deltasync
