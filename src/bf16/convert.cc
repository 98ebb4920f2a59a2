// fp32 -> bf16 rounding (the public entry points; the arithmetic is in
// round.h and detect_kernels.cc).

#include <cstring>

#include "bf16/round.h"
#include "bf16/simd_kernels.h"
#include "deltasync/changes.h"

namespace deltasync {

uint16_t Fp32ToBf16(uint32_t fp32_bits) { return bf16::RoundFp32ToBf16(fp32_bits); }

void ConvertFp32ToBf16(const float* src, uint16_t* dst, size_t n) {
  static_assert(sizeof(float) == sizeof(uint32_t));
  // The kernels take bit patterns; reading a float's bytes through
  // uint32_t* is what every SIMD load does anyway, and keeps one signature.
  kernels::ConvertF32ToBf16(reinterpret_cast<const uint32_t*>(src), dst, n);
}

}  // namespace deltasync
