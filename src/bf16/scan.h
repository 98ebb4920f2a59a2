// What DetectChanges and ToPublishedState share (internal): the plan for
// scanning one tensor, validation and error messages, and running chunks of
// tensors on worker threads.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/parallel.h"
#include "deltasync/changes.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"
#include "deltasync/weight_state.h"

namespace deltasync::bf16 {

inline constexpr uint64_t kNoError = UINT64_MAX;

// How one tensor is scanned: compared against its published form
// (DetectChanges), or rounded/checked into it (ToPublishedState).
struct ScanJob {
  std::string_view name;
  DType published_dtype = DType::kU8;
  DType current_dtype = DType::kU8;
  const uint8_t* published = nullptr;  // nullptr in ToPublishedState
  const uint8_t* current = nullptr;
  uint8_t* converted = nullptr;  // ToPublishedState: where f32 -> bf16 goes
  uint64_t elements = 0;
  // Bits that are all set in a non-finite value of the published dtype
  // (current values are checked after rounding), or 0 for no check.
  uint64_t exp_mask = 0;

  bool f32_to_bf16() const {
    return published_dtype == DType::kBF16 && current_dtype == DType::kF32;
  }
};

// Bits that are all set exactly in the Inf/NaN values of `dtype`, or 0 for
// dtypes that are not checked.
uint64_t NonFiniteMask(DType dtype);

// "tensor 'name'"
std::string Quoted(std::string_view name);

// kInvalidArgument unless v.data holds exactly shape x dtype bytes.
Status CheckView(const TensorView& v);

// The refusal of element `index` of `job`'s current tensor, naming the tensor,
// the index and the value (NaN, +Inf, -Inf, or an fp32 that rounds to Inf).
Status NonFiniteError(const ScanJob& job, uint64_t index);

// DetectChanges' validation and plan: one job per tensor of `published`, in
// its order, each matched by name with a tensor of `current`. The jobs point
// into the tensors' names and bytes (a WeightState's, or a mapped file's for
// `diff`).
Result<std::vector<ScanJob>> PlanDetect(std::span<const TensorView> published, std::span<const TensorView> current,
                                        const DetectOptions& options);
Result<std::vector<ScanJob>> PlanDetect(const WeightState& published, std::span<const TensorView> current,
                                        const DetectOptions& options);

// DetectChanges over the given jobs only (chunks of `chunk_elements`); the
// second into `out`, reusing its entries' memory (DetectChanges into `out`).
Result<std::vector<TensorChanges>> DetectJobs(const std::vector<ScanJob>& jobs, const DetectOptions& options,
                                              uint64_t chunk_elements);
// With `apply` (DetectAndApply, detect_apply.h): each chunk applies its
// changes to the jobs' published bytes as it finds them; `old` gets each
// entry's old values and *delta the state-hash change (added to it); on an
// error every applied change is put back and `old` is cleared.
struct InScanApply;
Status DetectJobs(const std::vector<ScanJob>& jobs, const DetectOptions& options, uint64_t chunk_elements,
                  std::vector<TensorChanges>& out, const InScanApply* apply = nullptr,
                  std::vector<std::vector<uint8_t>>* old = nullptr, StateHash* delta = nullptr);

// ToPublishedState's pass over `jobs` (chunks of `chunk_elements`): rounds
// each f32_to_bf16 job's current into its `converted`, and checks every job
// with an exp_mask for NaN/Inf; the first non-finite element in (job, index)
// order is the error.
Status ConvertAndCheck(const std::vector<ScanJob>& jobs, const DetectOptions& options, uint64_t chunk_elements);

// Compares elements [begin, begin + n) of `job` with the Compare kernel of
// its dtypes (simd_kernels.h): writes each changed element's flat index to
// idx_out and its published-dtype value to val_out (both with room for n +
// kernels::kCompareOutputSlack), returns how many; *first_bad as the kernels'.
size_t CompareSpan(const ScanJob& job, uint64_t begin, size_t n, uint64_t* idx_out, uint8_t* val_out,
                   size_t* first_bad);

// The element counts of `jobs`, for SplitIntoChunks.
std::vector<uint64_t> ElementCounts(const std::vector<ScanJob>& jobs);

// Runs fn(worker, chunk), which returns false on failure, over all chunks
// on up to `threads` workers; `worker` < the returned worker count, and no
// two calls with the same worker overlap. Chunks are handed out in ascending
// order, so every chunk before a failed one has started and will report:
// chunks after the first failure are skipped, yet the first failure in
// chunk order is always found, whatever the thread count.
template <typename Fn>
inline size_t RunChunks(size_t chunks, int threads, const Fn& fn) {
  const size_t workers =
      std::max<size_t>(1, std::min(static_cast<size_t>(ResolveThreads(threads)), chunks));
  std::atomic<size_t> next{0};
  std::atomic<size_t> first_failed{SIZE_MAX};
  ParallelFor(workers, static_cast<int>(workers), [&](size_t worker) {
    for (size_t c = next.fetch_add(1); c < chunks; c = next.fetch_add(1)) {
      if (c > first_failed.load(std::memory_order_relaxed)) continue;
      if (fn(worker, c)) continue;
      size_t seen = first_failed.load(std::memory_order_relaxed);
      while (c < seen && !first_failed.compare_exchange_weak(seen, c)) {
      }
    }
  });
  return workers;
}

}  // namespace deltasync::bf16
