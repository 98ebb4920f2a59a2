// CompareF32ToBf16GapsAvx512 (detect_gaps_avx512.h). Per 32 elements, one
// 512-bit vector of u16 lanes:
//  1. the new values: the fp32 rounded by VCVTNE2PS2BF16 (round_avx512.h);
//     32 holding a NaN or a denormal (rare) are rounded element by element;
//  2. the changed lanes (one u16 compare against the base) and the Inf/NaN
//     check;
//  3. the changed lanes' values and offsets packed in element order by two
//     VPCOMPRESSW (into registers, then stored whole: a compress straight to
//     memory is slow on Zen 4); each offset minus the one before it (the
//     packed offsets shifted up one lane by VPERMT2W, the last change of
//     the steps before in lane 0) minus 1 is the change's gap.
// So a step costs the same few vector instructions however many of its
// elements changed. (The route it replaced wrote a bitmap, spent eight
// unconditional slots on every 64-element word and each change's 64-bit
// index before its gap; the Highway route of the other targets,
// detect_gaps_kernels.cc, has since packed its entries the same way, in a
// stack buffer, per block of 1024.)
#include "bf16/detect_gaps_avx512.h"

#include "bf16/raw_kernels.h"
#include "bf16/simd_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "bf16/class_bytes_avx512.h"  // DS_AVX512_WARNINGS_PUSH / _POP
#include "bf16/round.h"
#include "bf16/round_avx512.h"
#endif

namespace deltasync::kernels {

bool HasDetectGapsAvx512() { return CpuHasDetectGapsAvx512() && RawKernelsAllowed(); }

#if defined(__x86_64__)

bool CpuHasDetectGapsAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vbmi2") &&
                          __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("bmi2");
  return has;
}

DS_AVX512_WARNINGS_PUSH

#define DS_AVX512_DETECT __attribute__((target("avx512f,avx512bw,avx512dq,avx512vbmi2,avx512bf16,bmi2,popcnt")))

DS_AVX512_DETECT size_t CompareF32ToBf16GapsAvx512(const uint16_t* pub, const uint32_t* cur, size_t n,
                                                   bool check_finite, uint16_t* gaps, uint16_t* val_out,
                                                   size_t* last, size_t* first_bad) {
  static_assert(kCompareGapsSlack >= 32, "a step stores 32 gaps and values whatever its count");
  const __m512i exp = _mm512_set1_epi16(static_cast<short>(bf16::kBf16ExpMask));
  const __m512i iota = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                                        12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  // Lane 0 from the second operand (the last change before), lane i from
  // lane i - 1 of the first (the packed offsets).
  const __m512i shift_up = _mm512_set_epi16(30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                                            12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 32);
  const __m512i one = _mm512_set1_epi16(1);
  // The offset of the last change so far, as u16: 0xFFFF (-1) before the
  // first, whose gap is then its offset.
  uint32_t last_offset = 0xFFFF;
  size_t count = 0;
  *first_bad = n;
  for (size_t at = 0; at < n; at += 32) {
    const __mmask32 valid = n - at >= 32 ? ~__mmask32{0} : _bzhi_u32(~0u, static_cast<unsigned>(n - at));
    const uint32_t* const c = cur + at;
    __mmask16 special = 0;
    __m512i r = avx512::RoundWord32(c, valid, &special);
    if (special != 0) [[unlikely]] {
      alignas(64) uint16_t rounded[32];
      for (size_t k = 0; k < 32; ++k) rounded[k] = at + k < n ? bf16::RoundFp32ToBf16(bf16::LoadElement(c, k)) : 0;
      r = _mm512_load_si512(rounded);
    }
    const __m512i p = _mm512_maskz_loadu_epi16(valid, pub + at);
    if (check_finite) {
      const __mmask32 bad = _mm512_mask_cmpeq_epi16_mask(valid, _mm512_and_si512(r, exp), exp);
      if (bad != 0) [[unlikely]] {
        *first_bad = at + static_cast<size_t>(__builtin_ctz(bad));
        return count;
      }
    }
    const __mmask32 changed = _mm512_mask_cmpneq_epu16_mask(valid, r, p);
    const __m512i offsets =
        _mm512_maskz_compress_epi16(changed, _mm512_add_epi16(iota, _mm512_set1_epi16(static_cast<short>(at))));
    const __m512i before = _mm512_permutex2var_epi16(offsets, shift_up, _mm512_set1_epi16(static_cast<short>(last_offset)));
    _mm512_storeu_si512(gaps + count, _mm512_sub_epi16(_mm512_sub_epi16(offsets, before), one));
    _mm512_storeu_si512(val_out + count, _mm512_maskz_compress_epi16(changed, r));
    // Without a branch: with about one change in 32 elements, a third of
    // the steps have none, and a mispredicted branch here cost as much as
    // the rest of the step's work together (docs/benchmarks.md, session 43).
    const uint32_t top = static_cast<uint32_t>(at) + 31 - static_cast<uint32_t>(__builtin_clz(changed | 1u));
    const uint32_t any = 0u - static_cast<uint32_t>(changed != 0);
    last_offset = (top & any) | (last_offset & ~any);
    count += static_cast<size_t>(__builtin_popcount(changed));
  }
  *last = last_offset;
  return count;
}

#undef DS_AVX512_DETECT
DS_AVX512_WARNINGS_POP

#else  // !__x86_64__

bool CpuHasDetectGapsAvx512() { return false; }

size_t CompareF32ToBf16GapsAvx512(const uint16_t*, const uint32_t*, size_t n, bool, uint16_t*, uint16_t*, size_t*,
                                  size_t* first_bad) {
  *first_bad = n;
  return 0;
}

#endif  // __x86_64__

}  // namespace deltasync::kernels
