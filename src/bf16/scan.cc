#include "bf16/scan.h"

#include <cstdio>
#include <cstring>

#include "bf16/round.h"

namespace deltasync::bf16 {
namespace {

// Names the bad value in a refusal: NaN, +Inf, -Inf, or a finite fp32 that
// overflows bf16 (it rounds to Inf).
std::string DescribeNonFinite(const ScanJob& job, uint64_t index) {
  const size_t size = DTypeSize(job.current_dtype);
  uint64_t bits = 0;
  std::memcpy(&bits, job.current + index * size, size);
  const uint64_t sign = uint64_t{1} << (8 * size - 1);
  const char* sign_char = (bits & sign) ? "-" : "+";
  const uint64_t mask = job.f32_to_bf16() ? kF32ExpMask : job.exp_mask;
  const uint64_t magnitude = bits & ~sign;
  if (magnitude > mask) return "NaN";
  if (magnitude == mask) return std::string(sign_char) + "Inf";
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  char buf[96];
  std::snprintf(buf, sizeof(buf), "fp32 %.9g, which rounds to bf16 %sInf", value, sign_char);
  return buf;
}

}  // namespace

// The exponent field of the float dtypes whose Inf/NaN we refuse. The fp8
// types are not checked: E4M3 has no Inf and their NaN encodings differ from
// the IEEE pattern; integers can never be non-finite.
uint64_t NonFiniteMask(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return kBf16ExpMask;
    case DType::kF16: return kF16ExpMask;
    case DType::kF32: return kF32ExpMask;
    case DType::kF64: return kF64ExpMask;
    default: return 0;
  }
}

std::string Quoted(std::string_view name) { return "tensor '" + std::string(name) + "'"; }

Status CheckView(const TensorView& v) {
  const size_t size = DTypeSize(v.dtype);
  auto count = CheckedElementCount(v.shape);
  if (!count || *count > UINT64_MAX / size || *count * size != v.data.size()) {
    return Status::InvalidArgument(Quoted(v.name) + ": " + std::to_string(v.data.size()) +
                                   " bytes do not match shape " + ShapeToString(v.shape) + " x " +
                                   std::string(DTypeName(v.dtype)));
  }
  return Status::OK();
}

Status NonFiniteError(const ScanJob& job, uint64_t index) {
  return Status::InvalidArgument(Quoted(job.name) + ": element " + std::to_string(index) + " is " +
                                 DescribeNonFinite(job, index) +
                                 "; non-finite weights are refused (--allow-nonfinite, or allow_nonfinite=True in "
                                 "Python, passes them through)");
}

std::vector<uint64_t> ElementCounts(const std::vector<ScanJob>& jobs) {
  std::vector<uint64_t> counts;
  counts.reserve(jobs.size());
  for (const ScanJob& job : jobs) counts.push_back(job.elements);
  return counts;
}

}  // namespace deltasync::bf16
