// Change detection: which elements of the published state the trainer's
// current weights change, and their new values.
//
// A bf16 weight changes only when its fp32 master crosses a bf16 rounding
// boundary, so between optimizer steps most elements are bit-identical.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <string>
#include <vector>

#include "deltasync/status.h"
#include "deltasync/tensor.h"
#include "deltasync/weight_state.h"

namespace deltasync {

// The changed elements of one tensor. indices are flat (row-major) element
// positions, strictly ascending, 64-bit (tensors may exceed 2^31 elements).
// values holds indices.size() elements of `dtype`, little-endian, back to back.
struct TensorChanges {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<uint64_t> indices;
  std::vector<uint8_t> values;

  size_t count() const { return indices.size(); }
};

// Rounds fp32 to bf16 with round-to-nearest-even, as PyTorch's CPU cast does
// (NaN stays NaN, quieted: 0x7FC0 with the sign kept).
uint16_t Fp32ToBf16(uint32_t fp32_bits);

// Converts `n` fp32 values to bf16 (the same rounding), vectorised.
void ConvertFp32ToBf16(const float* src, uint16_t* dst, size_t n);

struct DetectOptions {
  // Refuse NaN/Inf in bf16/fp32/fp16 weights unless true (then their bit
  // patterns pass through like any other value).
  bool allow_nonfinite = false;
  // Worker threads; 0 = std::thread::hardware_concurrency().
  int threads = 0;
  // F32 tensors for which this returns true are published as F32 (carried
  // bitwise, like other dtypes) instead of being rounded to bf16: parameters
  // that inference keeps in fp32, such as an MoE router's score-correction
  // bias. Only consulted when there is no published state yet
  // (ToPublishedState); afterwards the published dtype decides.
  std::function<bool(std::string_view name)> keep_fp32;
};

// Compares `current` against `published`, tensor by tensor (matched by name).
//   - published BF16, current BF16: compared as 16-bit patterns.
//   - published BF16, current F32: current is rounded to bf16 first.
//   - any other dtype: current must have the published dtype; elements are
//     compared bitwise and changed ones carried with their own dtype.
// Returns one TensorChanges per tensor with at least one change, in the order
// of published.tensors(); values have the published dtype.
// Errors (state untouched; nothing returned): a tensor missing on either side,
// a shape or dtype mismatch, NaN/Inf in current (naming tensor and element)
// unless allowed — each kInvalidArgument naming the tensor.
Result<std::vector<TensorChanges>> DetectChanges(const WeightState& published,
                                                 std::span<const TensorView> current,
                                                 const DetectOptions& options = {});

// The same, into `out`, for a caller that detects again and again (a
// training loop): on success `out` holds exactly what the call above
// returns; on an error (the same errors) it is empty. Entry k of `out`
// reuses the memory of the entry k it held before (its name, indices and
// values keep their capacity and only grow), so repeated calls whose
// changes are about as many as the last touch no fresh pages: ~10 bytes per
// change (a 64-bit index and a bf16 value), ~200 MB for 3.4% of a 0.6B
// model, which the call above maps, faults, zero-fills and unmaps every
// time. The memory held is the caller's: what `out` holds, as large as the
// largest result entry k has had; clear or destroy `out` to free it.
Status DetectChanges(const WeightState& published, std::span<const TensorView> current, const DetectOptions& options,
                     std::vector<TensorChanges>& out);

// How the tensor names of `current` differ from those of `base`, in one
// wording for publish, diff and the Python package; empty when the sets are
// equal. "all 3 tensors missing, 3 new; they differ by the prefix 'module.'"
// when one name prefix (DDP/FSDP's 'module.', torch.compile's '_orig_mod.')
// explains the difference, else "2 tensors missing (first: 'a'), 1 new
// (first: 'b')" (names sorted).
std::string DescribeTensorSetDiff(std::span<const std::string> base, std::span<const std::string> current);

// Converts trainer tensors to the published form: bf16 stays, f32 is rounded
// to bf16 (unless options.keep_fp32 says otherwise), other dtypes are copied. Checks NaN/Inf as DetectChanges does.
// Used for the first version, when there is nothing to compare against.
Result<WeightState> ToPublishedState(std::span<const TensorView> current,
                                     const DetectOptions& options = {});

// A published base read in place: what ToPublishedState would return, as
// views of the caller's bytes wherever they are already in published form
// (bf16, other dtypes, f32 kept by options.keep_fp32), and owned copies only
// of the f32 tensors that round to bf16. The same checks (sizes, duplicate
// names, NaN/Inf unless options.allow_nonfinite) and errors as
// ToPublishedState. `tensors` are sorted by name, like a WeightState's, and
// point into `current`'s bytes (which must outlive them) or `rounded`.
struct PublishedViews {
  std::vector<TensorView> tensors;
  WeightState rounded;  // owns the rounded f32 tensors

  uint64_t total_elements() const;
};
Result<PublishedViews> ViewAsPublished(std::span<const TensorView> current, const DetectOptions& options = {});

// DetectChanges against a base given as views (in its order, e.g. a
// PublishedViews' tensors): the same checks, errors and result as against a
// WeightState holding those tensors, without copying the base.
Result<std::vector<TensorChanges>> DetectChanges(std::span<const TensorView> published,
                                                 std::span<const TensorView> current,
                                                 const DetectOptions& options = {});

}  // namespace deltasync
