// fp32 -> bf16 rounding 32 elements at a time on CPUs with AVX-512 BF16
// (internal to src/bf16; raw intrinsics beside Highway's dispatch,
// raw_kernels.h). Shared by the fused compact scan's block pass
// (compact_scan_avx512.cc) and the gap_delta detect's compare
// (detect_gaps_avx512.cc). Only for callers compiled with at least these
// features (DS_AVX512_ROUND or a superset).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#define DS_AVX512_ROUND __attribute__((target("avx512f,avx512bw,avx512dq,avx512bf16")))

namespace deltasync::kernels::avx512 {

// The 32 new values (u16 lanes) of the fp32 at cur, elements where `valid`
// (0 elsewhere): two VCVTNE2PS2BF16, which round to nearest even exactly as
// bf16::RoundFp32ToBf16 does except for NaN (it keeps the payload) and
// denormals (it flushes them to zero). Where one of the 32 is either,
// *special gets bits set and the result must not be used (the caller
// rounds those 32 element by element instead).
DS_AVX512_ROUND inline __m512i RoundWord32(const uint32_t* cur, __mmask32 valid, __mmask16* special) {
  constexpr int kNanOrDenormal = 0x01 | 0x80 | 0x20;  // QNaN, SNaN, denormal
  const __m512 a = _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(static_cast<__mmask16>(valid), cur));
  const __m512 b = _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(static_cast<__mmask16>(valid >> 16), cur + 16));
  *special |= _mm512_fpclass_ps_mask(a, kNanOrDenormal) | _mm512_fpclass_ps_mask(b, kNanOrDenormal);
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
}

}  // namespace deltasync::kernels::avx512

#endif  // __x86_64__
