// Exponent-class bytes and their per-class bits on CPUs with AVX-512 VBMI,
// GFNI and BITALG (internal to src/bf16; raw intrinsics beside Highway's
// dispatch, raw_kernels.h). Shared by the decoder's counting pass
// (class_counts_avx512.cc) and the fused compact scan's block pass
// (compact_scan_avx512.cc). Only for callers compiled with at least these
// features (DS_AVX512_CLASSES or a superset).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstdint>

#define DS_AVX512_CLASSES __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,gfni,avx512bitalg,bmi2")))

// Around the raw kernels' definitions: GCC 12's AVX-512 headers start some
// results from _mm512_undefined_*(), which its own -Wuninitialized then
// flags where they are inlined (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)
#define DS_AVX512_WARNINGS_PUSH                                  \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define DS_AVX512_WARNINGS_POP _Pragma("GCC diagnostic pop")
#else
#define DS_AVX512_WARNINGS_PUSH
#define DS_AVX512_WARNINGS_POP
#endif

namespace deltasync::kernels::avx512 {

// Byte 8 j + k = byte 8 k + j: the 8 x 8 transpose of a vector's bytes
// (byte j of each 64-bit lane gathered into lane j).
alignas(64) inline constexpr uint8_t kTransposeBytes[64] = {
    0, 8,  16, 24, 32, 40, 48, 56, 1, 9,  17, 25, 33, 41, 49, 57, 2, 10, 18, 26, 34, 42,
    50, 58, 3, 11, 19, 27, 35, 43, 51, 59, 4, 12, 20, 28, 36, 44, 52, 60, 5, 13, 21, 29,
    37, 45, 53, 61, 6, 14, 22, 30, 38, 46, 54, 62, 7, 15, 23, 31, 39, 47, 55, 63};

// The class bytes (compact::ClassOf) of 64 elements, 0-31 in a and 32-63 in
// b, where `valid` (the others 0xFF): the exponent is the odd byte of
// bits + bits (the sign shifted out), 64 of them gathered from two vectors
// by one VPERMT2B, then min(e -sat 112, 15).
DS_AVX512_CLASSES inline __m512i ClassBytesOf(__m512i a, __m512i b, __mmask64 valid) {
  alignas(64) static constexpr uint8_t kOddBytes[64] = {
      1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
      45, 47, 49, 51, 53, 55, 57, 59, 61, 63, 65, 67, 69, 71, 73, 75, 77, 79, 81, 83, 85, 87,
      89, 91, 93, 95, 97, 99, 101, 103, 105, 107, 109, 111, 113, 115, 117, 119, 121, 123, 125, 127};
  const __m512i e = _mm512_permutex2var_epi8(_mm512_add_epi16(a, a), _mm512_load_si512(kOddBytes), _mm512_add_epi16(b, b));
  const __m512i c = _mm512_min_epu8(_mm512_subs_epu8(e, _mm512_set1_epi8(112)), _mm512_set1_epi8(15));
  return _mm512_mask_mov_epi8(_mm512_set1_epi8(static_cast<char>(0xFF)), valid, c);
}

// The same for the 64 elements at p (masked loads: nothing past `valid` is
// read).
DS_AVX512_CLASSES inline __m512i ClassBytes64(const uint16_t* p, __mmask64 valid) {
  return ClassBytesOf(_mm512_maskz_loadu_epi16(static_cast<__mmask32>(valid), p),
                      _mm512_maskz_loadu_epi16(static_cast<__mmask32>(valid >> 32), p + 32), valid);
}

// Per 64-bit lane of the class bytes c, its 8 bytes' classes as bits:
// byte j of lane L of *low holds, for each byte k of that lane, bit 7 - k
// set where byte k is of class j (j < 8); *high the same for class j + 8. A
// byte of 0xFF (or any value above 15) is of no class. Each class byte as a
// one-hot byte (VPSHUFB of a 16-entry table), then the lane's 8 one-hot
// bytes transposed as a bit matrix (GF2P8AFFINEQB with them as the matrix).
DS_AVX512_CLASSES inline void ClassLaneBits(__m512i c, __m512i* low, __m512i* high) {
  const __m512i low_table = _mm512_broadcast_i32x4(_mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 0, 0, 0, 0, 0, 0, 0, 0));
  const __m512i high_table = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 64, -128));
  // Byte j = 1 << j: GF2P8AFFINEQB(unit, m) puts bit j of each of m's 8
  // bytes into byte j (byte k's bit at bit 7 - k).
  const __m512i unit = _mm512_set1_epi64(static_cast<long long>(0x8040201008040201ull));
  *low = _mm512_gf2p8affine_epi64_epi8(unit, _mm512_shuffle_epi8(low_table, c), 0);
  *high = _mm512_gf2p8affine_epi64_epi8(unit, _mm512_shuffle_epi8(high_table, c), 0);
}

// The masks of the 64 class bytes c by class: lane j of *low = the mask of
// class j (bit k: byte k is of class j), lane j of *high that of class j + 8.
DS_AVX512_CLASSES inline void ClassMasks64(__m512i c, __m512i* low, __m512i* high) {
  // Each lane's bytes reversed first, so that ClassLaneBits puts byte k's
  // bit at bit k; then the 8 x 8 byte transpose gathers each class's bytes.
  const __m512i reverse = _mm512_set_epi64(0x08090A0B0C0D0E0Fll, 0x0001020304050607ll, 0x08090A0B0C0D0E0Fll,
                                           0x0001020304050607ll, 0x08090A0B0C0D0E0Fll, 0x0001020304050607ll,
                                           0x08090A0B0C0D0E0Fll, 0x0001020304050607ll);
  __m512i lane_low, lane_high;
  ClassLaneBits(_mm512_shuffle_epi8(c, reverse), &lane_low, &lane_high);
  const __m512i transpose = _mm512_load_si512(kTransposeBytes);
  *low = _mm512_permutexvar_epi8(transpose, lane_low);
  *high = _mm512_permutexvar_epi8(transpose, lane_high);
}

}  // namespace deltasync::kernels::avx512

#endif  // __x86_64__
