// A published base read in place (ViewAsPublished) and DetectChanges against
// views of it: `deltasync diff` compares two mapped checkpoints without
// copying the old one into a WeightState.

#include <algorithm>
#include <utility>
#include <vector>

#include "bf16/chunked.h"
#include "bf16/chunks.h"
#include "bf16/scan.h"
#include "deltasync/changes.h"

namespace deltasync {

uint64_t PublishedViews::total_elements() const {
  uint64_t n = 0;
  for (const TensorView& t : tensors) n += t.num_elements();
  return n;
}

}  // namespace deltasync

namespace deltasync::bf16 {

Result<std::vector<TensorChanges>> DetectChangesChunked(std::span<const TensorView> published,
                                                        std::span<const TensorView> current,
                                                        const DetectOptions& options, uint64_t chunk_elements) {
  DS_ASSIGN_OR_RETURN(std::vector<ScanJob> jobs, PlanDetect(published, current, options));
  return DetectJobs(jobs, options, chunk_elements);
}

Result<PublishedViews> ViewAsPublishedChunked(std::span<const TensorView> current, const DetectOptions& options,
                                              uint64_t chunk_elements) {
  // ToPublishedStateChunked's checks in its order: sizes in the caller's
  // order, then duplicates in name order, then NaN/Inf in name order.
  for (const TensorView& v : current) DS_RETURN_IF_ERROR(CheckView(v));
  std::vector<const TensorView*> sorted;
  sorted.reserve(current.size());
  for (const TensorView& v : current) sorted.push_back(&v);
  std::sort(sorted.begin(), sorted.end(), [](const TensorView* a, const TensorView* b) { return a->name < b->name; });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i]->name == sorted[i - 1]->name) {
      return Status::InvalidArgument("tensor '" + sorted[i]->name + "' appears twice");
    }
  }
  auto rounds = [&](const TensorView& v) {
    return v.dtype == DType::kF32 && !(options.keep_fp32 && options.keep_fp32(v.name));
  };
  // Only the f32 tensors that round get buffers of their own.
  std::vector<WeightState::Tensor> rounded;
  for (const TensorView* v : sorted) {
    if (rounds(*v)) rounded.push_back({v->name, DType::kBF16, v->shape, std::vector<uint8_t>(v->data.size() / 2)});
  }
  PublishedViews out;
  DS_ASSIGN_OR_RETURN(out.rounded, WeightState::FromTensors(std::move(rounded)));
  std::vector<ScanJob> jobs;
  out.tensors.reserve(sorted.size());
  for (const TensorView* v : sorted) {
    ScanJob job;
    job.current_dtype = v->dtype;
    job.current = v->data.data();
    if (rounds(*v)) {
      WeightState::Tensor* t = out.rounded.FindMutable(v->name);
      job.published_dtype = DType::kBF16;
      job.converted = t->data.data();
      job.elements = t->num_elements();
      out.tensors.push_back(t->view());
    } else {
      job.published_dtype = v->dtype;
      job.elements = v->num_elements();
      out.tensors.push_back(*v);
    }
    job.name = out.tensors.back().name;
    job.exp_mask = options.allow_nonfinite ? 0 : NonFiniteMask(job.published_dtype);
    if (job.converted != nullptr || job.exp_mask != 0) jobs.push_back(job);
  }
  DS_RETURN_IF_ERROR(ConvertAndCheck(jobs, options, chunk_elements));
  return out;
}

}  // namespace deltasync::bf16

namespace deltasync {

Result<PublishedViews> ViewAsPublished(std::span<const TensorView> current, const DetectOptions& options) {
  return bf16::ViewAsPublishedChunked(current, options, bf16::kDefaultChunkElements);
}

Result<std::vector<TensorChanges>> DetectChanges(std::span<const TensorView> published,
                                                 std::span<const TensorView> current,
                                                 const DetectOptions& options) {
  return bf16::DetectChangesChunked(published, current, options, bf16::kDefaultChunkElements);
}

}  // namespace deltasync
