// ClassCountsBytes16Avx512 (class_counts_avx512.h). Per 64 elements, 512-bit
// vectors:
//  1. the class bytes: the exponent is the odd byte of bits + bits (the sign
//     shifted out), 64 of them gathered from two vectors by one VPERMT2B,
//     then min(e -sat 112, 15); past n, 0xFF (masked loads: nothing past
//     the data is read);
//  2. each class byte c as a one-hot byte, 1 << c for c < 8 in one vector,
//     1 << (c - 8) for c >= 8 in another (VPSHUFB of a 16-entry table;
//     0xFF gives 0);
//  3. per 64-bit lane, its 8 one-hot bytes transposed (GF2P8AFFINEQB with
//     the one-hot bytes as the matrix: byte j of the result holds bit j of
//     each of the 8 bytes), so VPOPCNTB gives in byte j the lane's elements
//     of class j (or j + 8), added into byte accumulators (at most 8 a
//     step, 16 steps a block: <= 128).
// Per block the accumulators' 8 lanes are summed per class (VPERMB
// transposes the 8 x 8 bytes, VPSADBW sums each class's 8) and the classes
// not asked for are zeroed. So a block costs the same whatever classes are
// counted: the per-class compare-and-subtract of the AVX2 code cost 2
// instructions per 32 elements per class.
#include "bf16/class_counts_avx512.h"

#include "bf16/raw_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace deltasync::kernels {

bool HasClassCountsAvx512() { return CpuHasClassCountsAvx512() && RawKernelsAllowed(); }

#if defined(__x86_64__)

bool CpuHasClassCountsAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
                          __builtin_cpu_supports("gfni") && __builtin_cpu_supports("avx512bitalg") &&
                          __builtin_cpu_supports("bmi2");
  return has;
}

// GCC 12's AVX-512 headers start some results from _mm512_undefined_*(),
// which its own -Wuninitialized then flags where they are inlined (a known
// false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define DS_AVX512_COUNTS __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,gfni,avx512bitalg,bmi2")))

namespace {

constexpr size_t kBlock = 1024;

// Step 1: the class bytes of the elements at p selected by `valid` (the
// others 0xFF).
DS_AVX512_COUNTS inline __m512i ClassBytes64(const uint16_t* p, __mmask64 valid) {
  alignas(64) static constexpr uint8_t kOddBytes[64] = {
      1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
      45, 47, 49, 51, 53, 55, 57, 59, 61, 63, 65, 67, 69, 71, 73, 75, 77, 79, 81, 83, 85, 87,
      89, 91, 93, 95, 97, 99, 101, 103, 105, 107, 109, 111, 113, 115, 117, 119, 121, 123, 125, 127};
  const __m512i a = _mm512_maskz_loadu_epi16(static_cast<__mmask32>(valid), p);
  const __m512i b = _mm512_maskz_loadu_epi16(static_cast<__mmask32>(valid >> 32), p + 32);
  const __m512i e = _mm512_permutex2var_epi8(_mm512_add_epi16(a, a), _mm512_load_si512(kOddBytes), _mm512_add_epi16(b, b));
  const __m512i c = _mm512_min_epu8(_mm512_subs_epu8(e, _mm512_set1_epi8(112)), _mm512_set1_epi8(15));
  return _mm512_mask_mov_epi8(_mm512_set1_epi8(static_cast<char>(0xFF)), valid, c);
}

// The 8 classes' counts of `acc` (byte j of each 64-bit lane: that lane's
// elements of the j-th class) as u16 lanes.
DS_AVX512_COUNTS inline __m128i SumLanes(__m512i acc) {
  alignas(64) static constexpr uint8_t kTranspose[64] = {
      0, 8,  16, 24, 32, 40, 48, 56, 1, 9,  17, 25, 33, 41, 49, 57, 2, 10, 18, 26, 34, 42,
      50, 58, 3, 11, 19, 27, 35, 43, 51, 59, 4, 12, 20, 28, 36, 44, 52, 60, 5, 13, 21, 29,
      37, 45, 53, 61, 6, 14, 22, 30, 38, 46, 54, 62, 7, 15, 23, 31, 39, 47, 55, 63};
  const __m512i by_class = _mm512_permutexvar_epi8(_mm512_load_si512(kTranspose), acc);
  return _mm512_cvtepi64_epi16(_mm512_sad_epu8(by_class, _mm512_setzero_si512()));
}

}  // namespace

DS_AVX512_COUNTS void ClassCountsBytes16Avx512(const uint16_t* data, size_t n, uint32_t classes, uint16_t* counts,
                                               uint8_t* bytes) {
  const __m512i low = _mm512_broadcast_i32x4(_mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 0, 0, 0, 0, 0, 0, 0, 0));
  const __m512i high = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 64, -128));
  // Byte j = 1 << j: GF2P8AFFINEQB(unit, m) puts bit j of each of m's 8
  // bytes into byte j (in reverse order, which a popcount ignores).
  const __m512i unit = _mm512_set1_epi64(static_cast<long long>(0x8040201008040201ull));
  for (size_t at = 0; at < n; at += kBlock, counts += 16) {
    const size_t len = n - at < kBlock ? n - at : kBlock;
    // Two blocks ahead: the stream from memory is what bounds this loop.
    if (at + 3 * kBlock <= n) {
      const auto* ahead = reinterpret_cast<const char*>(data + at + 2 * kBlock);
      for (size_t b = 0; b < 2 * kBlock; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
    }
    __m512i acc_low = _mm512_setzero_si512(), acc_high = acc_low;
    for (size_t g = 0; g < len; g += 64) {
      const __mmask64 valid = len - g >= 64 ? ~__mmask64{0} : _bzhi_u64(~uint64_t{0}, static_cast<unsigned>(len - g));
      const __m512i c = ClassBytes64(data + at + g, valid);
      _mm512_store_si512(bytes + at + g, c);
      const __m512i t_low = _mm512_gf2p8affine_epi64_epi8(unit, _mm512_shuffle_epi8(low, c), 0);
      const __m512i t_high = _mm512_gf2p8affine_epi64_epi8(unit, _mm512_shuffle_epi8(high, c), 0);
      acc_low = _mm512_add_epi8(acc_low, _mm512_popcnt_epi8(t_low));
      acc_high = _mm512_add_epi8(acc_high, _mm512_popcnt_epi8(t_high));
    }
    const __m256i all = _mm256_inserti128_si256(_mm256_castsi128_si256(SumLanes(acc_low)), SumLanes(acc_high), 1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(counts), _mm256_maskz_mov_epi16(static_cast<__mmask16>(classes), all));
  }
}

#undef DS_AVX512_COUNTS
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#else  // !__x86_64__

bool CpuHasClassCountsAvx512() { return false; }

void ClassCountsBytes16Avx512(const uint16_t*, size_t, uint32_t, uint16_t*, uint8_t*) {}

#endif

}  // namespace deltasync::kernels
