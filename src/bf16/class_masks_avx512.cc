// ClassMasksAll16Avx512 (class_masks_avx512.h). Per block of 1024 base
// elements, 16 words of 64:
//  1. per word, its 64 class bytes, each 8 in reverse order
//     (ClassBytesReversed64; a partial last word by ClassBytes64, 0xFF past
//     n, then reversed), and their 16 class masks (ClassMasksOfReversed64:
//     lane j of `low` = class j's mask, of `high` class j + 8's);
//  2. per half block (8 words), the 8 `low` vectors and the 8 `high` ones
//     transposed as 8 x 8 u64 matrices (unpack, then two rounds of 128-bit
//     lane shuffles), so that each vector holds one class's 8 words: stored
//     at masks[16 c + 8 h];
//  3. per class, its 16 words' popcounts (VPOPCNTQ) as 16 u32 lanes, summed into running counts in
//     four shift-and-add steps, stored at before[17 c + 1..16] with
//     before[17 c] = 0.
// About 35 instructions a word for all 16 classes, where the byte masks
// took about 6 per word and class for each class with a change in the
// block (10-12 of them at a few percent changed).
#include "bf16/class_masks_avx512.h"

#include "bf16/class_bytes_avx512.h"
#include "bf16/class_counts_avx512.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace deltasync::kernels {

#if defined(__x86_64__)

bool CpuHasClassMasksAvx512() {
  static const bool has = CpuHasClassCountsAvx512() && __builtin_cpu_supports("avx512vpopcntdq");
  return has;
}

// DS_AVX512_CLASSES and VPOPCNTDQ.
#define DS_AVX512_MASKS \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi,gfni,avx512bitalg,bmi2,avx512vpopcntdq")))

DS_AVX512_WARNINGS_PUSH

namespace {

constexpr size_t kWords = 16;

// The 8 x 8 transpose of the u64 lanes of r[0..7]: lane j of r[w] goes to
// lane w of r[j].
DS_AVX512_MASKS inline void Transpose8x8(__m512i r[8]) {
  __m512i a[8];
  for (int k = 0; k < 4; ++k) {
    a[2 * k] = _mm512_unpacklo_epi64(r[2 * k], r[2 * k + 1]);      // lanes 0, 2, 4, 6 of r[2k], r[2k+1]
    a[2 * k + 1] = _mm512_unpackhi_epi64(r[2 * k], r[2 * k + 1]);  // lanes 1, 3, 5, 7
  }
  // b[p]: for rows 0-3 (p < 4) or 4-7, the lane pairs (j, j + 4) of
  // j = 0, 1, 2, 3 by p % 4 = 0, 1, 2, 3 (lanes 0/4 from unpacklo's
  // 128-bit lanes 0 and 2, 2/6 from its 1 and 3; 1/5, 3/7 from unpackhi).
  __m512i b[8];
  for (int g = 0; g < 2; ++g) {
    const __m512i* x = a + 4 * g;
    b[4 * g + 0] = _mm512_shuffle_i64x2(x[0], x[2], 0x88);  // lanes 0 and 4
    b[4 * g + 2] = _mm512_shuffle_i64x2(x[0], x[2], 0xDD);  // lanes 2 and 6
    b[4 * g + 1] = _mm512_shuffle_i64x2(x[1], x[3], 0x88);  // lanes 1 and 5
    b[4 * g + 3] = _mm512_shuffle_i64x2(x[1], x[3], 0xDD);  // lanes 3 and 7
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm512_shuffle_i64x2(b[j], b[4 + j], 0x88);
    r[j + 4] = _mm512_shuffle_i64x2(b[j], b[4 + j], 0xDD);
  }
}


}  // namespace

DS_AVX512_MASKS void ClassMasksAll16Avx512(const uint16_t* data, size_t n, uint64_t* masks, uint32_t* before) {
  __m512i counts[2][16];  // [half][class]: u64 lanes, the words' popcounts
  for (size_t h = 0; h < 2; ++h) {
    __m512i low[8], high[8];
    for (size_t k = 0; k < 8; ++k) {
      const size_t at = 64 * (8 * h + k);
      if (at >= n) {
        low[k] = high[k] = _mm512_setzero_si512();
        continue;
      }
      if (n - at >= 64) {
        avx512::ClassMasksOfReversed64(avx512::ClassBytesReversed64(data + at), &low[k], &high[k]);
      } else {
        // The block's last, partial word: masked loads, 0xFF past n.
        const __mmask64 valid = _bzhi_u64(~uint64_t{0}, static_cast<unsigned>(n - at));
        avx512::ClassMasks64(avx512::ClassBytes64(data + at, valid), &low[k], &high[k]);
      }
    }
    Transpose8x8(low);
    Transpose8x8(high);
    for (size_t c = 0; c < 8; ++c) {
      _mm512_store_si512(masks + kWords * c + 8 * h, low[c]);
      _mm512_store_si512(masks + kWords * (c + 8) + 8 * h, high[c]);
      counts[h][c] = _mm512_popcnt_epi64(low[c]);
      counts[h][c + 8] = _mm512_popcnt_epi64(high[c]);
    }
  }
  // The even u32 halves of two vectors of u64 counts (each <= 64).
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i zero = _mm512_setzero_si512();
  for (size_t c = 0; c < 16; ++c) {
    __m512i s = _mm512_permutex2var_epi32(counts[0][c], even, counts[1][c]);  // word w's count in lane w
    // Inclusive running sums: lane w += lane w - k for k = 1, 2, 4, 8.
    s = _mm512_add_epi32(s, _mm512_alignr_epi32(s, zero, 15));
    s = _mm512_add_epi32(s, _mm512_alignr_epi32(s, zero, 14));
    s = _mm512_add_epi32(s, _mm512_alignr_epi32(s, zero, 12));
    s = _mm512_add_epi32(s, _mm512_alignr_epi32(s, zero, 8));
    before[17 * c] = 0;
    _mm512_storeu_si512(before + 17 * c + 1, s);
  }
}

DS_AVX512_WARNINGS_POP

#else  // !__x86_64__

bool CpuHasClassMasksAvx512() { return false; }

void ClassMasksAll16Avx512(const uint16_t*, size_t, uint64_t*, uint32_t*) {}

#endif

}  // namespace deltasync::kernels
