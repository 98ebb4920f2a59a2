// ScanBlockAvx512 (compact_scan_avx512.h). Per 64-element word, 512-bit
// vectors:
//  1. the new values: fp32 rounded 32 at a time by VCVTNE2PS2BF16, which
//     rounds to nearest even exactly as bf16::RoundFp32ToBf16 does, except
//     for NaN (it keeps the payload) and denormals (it flushes them to
//     zero): a word holding either (VFPCLASSPS, rare) is rounded element by
//     element instead;
//  2. the changed bits (u16 compares) and the Inf/NaN check;
//  3. the class bytes (class_bytes_avx512.h: one VPERMT2B of the exponent
//     bytes, then min(e -sat 112, 15));
//  4. every class's mask at once (one-hot bytes, GF2P8AFFINEQB transposes,
//     an 8 x 8 byte transpose: ClassMasks64), stored for the per-change
//     loop, and the running counts as two vectors of u64 (VPOPCNTQ of the
//     masks), stored before each word;
//  5. the offsets of the changed elements (VPCOMPRESSW of the offsets by the
//     changed bits).
// The scan's per-change loop then runs over the block's changes in one
// flat loop (one mispredicted exit per block, not per word), reading a
// change's class mask and count from these stores: no compare, popcount
// or add per class per word.
#include "bf16/compact_scan_avx512.h"

#include "bf16/class_counts_avx512.h"
#include "bf16/raw_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "bf16/class_bytes_avx512.h"
#include "bf16/prefetch.h"
#include "bf16/round.h"
#endif

namespace deltasync::kernels {

bool HasCompactScanAvx512() { return CpuHasCompactScanAvx512() && RawKernelsAllowed(); }

#if defined(__x86_64__)

bool CpuHasCompactScanAvx512() {
  static const bool has = CpuHasClassCountsAvx512() && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("avx512vpopcntdq") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
}

DS_AVX512_WARNINGS_PUSH

#define DS_AVX512_SCAN                                                                                         \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512vbmi2,gfni,avx512bitalg," \
                        "avx512vpopcntdq,avx512bf16,bmi2,popcnt")))

namespace {

// The 32 new values (u16 lanes) of the fp32 at cur, elements where `valid`
// (0 elsewhere): two VCVTNE2PS2BF16, unless one of them is NaN or a
// denormal (*special then set and the result unused).
DS_AVX512_SCAN inline __m512i RoundWord32(const uint32_t* cur, __mmask32 valid, __mmask16* special) {
  constexpr int kNanOrDenormal = 0x01 | 0x80 | 0x20;  // QNaN, SNaN, denormal
  const __m512 a = _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(static_cast<__mmask16>(valid), cur));
  const __m512 b = _mm512_castsi512_ps(_mm512_maskz_loadu_epi32(static_cast<__mmask16>(valid >> 16), cur + 16));
  *special |= _mm512_fpclass_ps_mask(a, kNanOrDenormal) | _mm512_fpclass_ps_mask(b, kNanOrDenormal);
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
}

}  // namespace

DS_AVX512_SCAN bool ScanBlockAvx512(const uint16_t* pub, const void* cur, bool f32, size_t len, const uint64_t* seen_in,
                                    const ScanBlockAhead& ahead, uint16_t* fresh, uint64_t* words, uint8_t* cls,
                                    uint64_t* masks, uint64_t* seen, uint16_t* offsets, size_t* changed) {
  const __m512i exp = _mm512_set1_epi16(static_cast<short>(bf16::kBf16ExpMask));
  const __m512i iota = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12,
                                        11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  size_t n_changed = 0;
  __m512i seen_low = _mm512_loadu_si512(seen_in), seen_high = _mm512_loadu_si512(seen_in + 8);
  __mmask32 bad = 0;
  const size_t n_words = (len + 63) / 64;
  for (size_t w = 0; w < n_words; ++w) {
    const size_t at = 64 * w;
    if (ahead.cur != nullptr) PrefetchWordShare(ahead.cur, ahead.elem_size, ahead.pub, w);
    const __mmask64 valid = len - at >= 64 ? ~__mmask64{0} : _bzhi_u64(~uint64_t{0}, static_cast<unsigned>(len - at));
    const auto valid_low = static_cast<__mmask32>(valid), valid_high = static_cast<__mmask32>(valid >> 32);
    __m512i r0, r1;
    if (f32) {
      const auto* c = static_cast<const uint32_t*>(cur) + at;
      __mmask16 special = 0;
      r0 = RoundWord32(c, valid_low, &special);
      r1 = RoundWord32(c + 32, valid_high, &special);
      if (special != 0) [[unlikely]] {
        for (size_t k = 0; k < 64; ++k) {
          fresh[at + k] = at + k < len ? bf16::RoundFp32ToBf16(bf16::LoadElement(c, k)) : 0;
        }
        r0 = _mm512_load_si512(fresh + at);
        r1 = _mm512_load_si512(fresh + at + 32);
      }
    } else {
      const auto* c = static_cast<const uint16_t*>(cur) + at;
      r0 = _mm512_maskz_loadu_epi16(valid_low, c);
      r1 = _mm512_maskz_loadu_epi16(valid_high, c + 32);
    }
    const __m512i p0 = _mm512_maskz_loadu_epi16(valid_low, pub + at);
    const __m512i p1 = _mm512_maskz_loadu_epi16(valid_high, pub + at + 32);
    const __mmask32 changed0 = _mm512_cmpneq_epu16_mask(r0, p0), changed1 = _mm512_cmpneq_epu16_mask(r1, p1);
    words[w] = uint64_t{changed0} | uint64_t{changed1} << 32;
    const __m512i offset0 = _mm512_add_epi16(iota, _mm512_set1_epi16(static_cast<short>(at)));
    _mm512_storeu_si512(offsets + n_changed, _mm512_maskz_compress_epi16(changed0, offset0));
    n_changed += static_cast<size_t>(__builtin_popcount(changed0));
    const __m512i offset1 = _mm512_add_epi16(offset0, _mm512_set1_epi16(32));
    _mm512_storeu_si512(offsets + n_changed, _mm512_maskz_compress_epi16(changed1, offset1));
    n_changed += static_cast<size_t>(__builtin_popcount(changed1));
    bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(r0, exp), exp) | _mm512_cmpeq_epi16_mask(_mm512_and_si512(r1, exp), exp);
    _mm512_store_si512(fresh + at, r0);
    _mm512_store_si512(fresh + at + 32, r1);
    const __m512i c = avx512::ClassBytesOf(p0, p1, valid);
    _mm512_store_si512(cls + at, c);
    __m512i mask_low, mask_high;
    avx512::ClassMasks64(c, &mask_low, &mask_high);
    uint64_t* const m = masks + kScanWordClasses * w;
    _mm512_store_si512(m, mask_low);
    _mm512_store_si512(m + 8, mask_high);
    uint64_t* const s = seen + kScanWordClasses * w;
    _mm512_store_si512(s, seen_low);
    _mm512_store_si512(s + 8, seen_high);
    seen_low = _mm512_add_epi64(seen_low, _mm512_popcnt_epi64(mask_low));
    seen_high = _mm512_add_epi64(seen_high, _mm512_popcnt_epi64(mask_high));
  }
  _mm512_store_si512(seen + kScanWordClasses * n_words, seen_low);
  _mm512_store_si512(seen + kScanWordClasses * n_words + 8, seen_high);
  *changed = n_changed;
  return bad != 0;
}

#undef DS_AVX512_SCAN
DS_AVX512_WARNINGS_POP

#else  // !__x86_64__

bool CpuHasCompactScanAvx512() { return false; }

bool ScanBlockAvx512(const uint16_t*, const void*, bool, size_t, const uint64_t*, const ScanBlockAhead&, uint16_t*,
                     uint64_t*, uint8_t*, uint64_t*, uint64_t*, uint16_t*, size_t* changed) {
  *changed = 0;
  return false;
}

#endif

}  // namespace deltasync::kernels
