// ClassCountsBytes16Avx512 (class_counts_avx512.h). Per 64 elements, 512-bit
// vectors (steps 1-3 are class_bytes_avx512.h's ClassBytes64 and
// ClassLaneBits, which the fused compact scan shares):
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

#include "bf16/class_bytes_avx512.h"
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

DS_AVX512_WARNINGS_PUSH

namespace {

constexpr size_t kBlock = 1024;

// The 8 classes' counts of `acc` (byte j of each 64-bit lane: that lane's
// elements of the j-th class) as u16 lanes.
DS_AVX512_CLASSES inline __m128i SumLanes(__m512i acc) {
  const __m512i by_class = _mm512_permutexvar_epi8(_mm512_load_si512(avx512::kTransposeBytes), acc);
  return _mm512_cvtepi64_epi16(_mm512_sad_epu8(by_class, _mm512_setzero_si512()));
}

}  // namespace

DS_AVX512_CLASSES void ClassCountsBytes16Avx512(const uint16_t* data, size_t n, uint32_t classes, uint16_t* counts,
                                               uint8_t* bytes) {
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
      const __m512i c = avx512::ClassBytes64(data + at + g, valid);
      _mm512_store_si512(bytes + at + g, c);
      __m512i t_low, t_high;
      avx512::ClassLaneBits(c, &t_low, &t_high);
      acc_low = _mm512_add_epi8(acc_low, _mm512_popcnt_epi8(t_low));
      acc_high = _mm512_add_epi8(acc_high, _mm512_popcnt_epi8(t_high));
    }
    const __m256i all = _mm256_inserti128_si256(_mm256_castsi128_si256(SumLanes(acc_low)), SumLanes(acc_high), 1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(counts), _mm256_maskz_mov_epi16(static_cast<__mmask16>(classes), all));
  }
}

DS_AVX512_WARNINGS_POP

#else  // !__x86_64__

bool CpuHasClassCountsAvx512() { return false; }

void ClassCountsBytes16Avx512(const uint16_t*, size_t, uint32_t, uint16_t*, uint8_t*) {}

#endif

}  // namespace deltasync::kernels
