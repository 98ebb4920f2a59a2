// The compact decoder's class kernels (simd_kernels.h): ClassCountsBytes16
// (per block of 1024 elements, each element's exponent class as a byte and
// the counts of the classes asked for) and ClassMasksOfBytes16 (per class,
// its mask in each 64-element word of a block and their running counts).
// Compiled per target like the other kernels (foreach_target.h). On CPUs
// with AVX-512 VBMI, GFNI and BITALG the counts are one raw-intrinsics pass
// instead (class_counts_avx512.h).

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bf16/class_counts_avx512.h"
#include "bf16/round.h"
#include "bf16/simd_kernels.h"
#include "codec/compact_bf16.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bf16/class_count_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "bf16/kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace deltasync::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The kernels' block (simd_kernels.h), its 64-element words, the classes
// and the byte past a block's elements up to a whole word.
constexpr size_t kClassBlock = 1024;
constexpr size_t kClassWords = kClassBlock / 64;
constexpr int kCountClasses = compact::kClasses;
constexpr uint8_t kNoClass = 0xFF;

#if HWY_TARGET <= HWY_AVX2 && HWY_ARCH_X86_64
// The class bytes (compact::ClassOf) of the 32 elements at p, all in one
// register: the exponent byte is the high byte of bits << 1 (the sign
// shifted out), packed 32 to a vector, then min(exponent -sat 112, 15) on
// bytes, byte k element k's (the pack's order, elements 0-7, 16-23, 8-15,
// 24-31, put back by one permute). The AVX-512 targets run the same 256-bit
// code.
HWY_INLINE __m256i ClassBytes32(const uint16_t* HWY_RESTRICT p) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
  const __m256i e = _mm256_permute4x64_epi64(_mm256_packus_epi16(_mm256_srli_epi16(_mm256_slli_epi16(a, 1), 8),
                                                                  _mm256_srli_epi16(_mm256_slli_epi16(b, 1), 8)),
                                             0xD8);
  return _mm256_min_epu8(_mm256_subs_epu8(e, _mm256_set1_epi8(112)), _mm256_set1_epi8(15));
}
#endif

// The class byte (compact::ClassOf) of each of n <= kClassBlock elements,
// kNoClass after them up to a whole word. u16 lanes: class = min(exponent
// -sat 112, 15), demoted to bytes.
HWY_INLINE void ClassBytes16(const uint16_t* HWY_RESTRICT data, size_t n, uint8_t* HWY_RESTRICT cls) {
#if HWY_TARGET <= HWY_AVX2 && HWY_ARCH_X86_64
  size_t j = 0;
  for (; j + 32 <= n; j += 32) _mm256_store_si256(reinterpret_cast<__m256i*>(cls + j), ClassBytes32(data + j));
  for (; j < n; ++j) cls[j] = static_cast<uint8_t>(compact::ClassOf(bf16::LoadElement(data, j)));
  std::memset(cls + n, kNoClass, (n + 63) / 64 * 64 - n);
#else
  const hn::ScalableTag<uint16_t> d16;
  const hn::RebindToSigned<decltype(d16)> di16;
  const hn::Rebind<uint8_t, decltype(d16)> d8;
  const size_t N = hn::Lanes(d16);
  const auto c112 = hn::Set(d16, 112), c15 = hn::Set(d16, 15), ff = hn::Set(d16, 0xFF);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto c = hn::Min(hn::SaturatedSub(hn::And(hn::ShiftRight<7>(hn::LoadU(d16, data + i)), ff), c112), c15);
    hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di16, c)), d8, cls + i);
  }
  for (; i < n; ++i) cls[i] = static_cast<uint8_t>(compact::ClassOf(bf16::LoadElement(data, i)));
  std::memset(cls + n, kNoClass, (n + 63) / 64 * 64 - n);
#endif
}

// The mask of the class-c bytes among the 64 at `cls`: one compare and
// movemask per vector straight into the word (a mask stored in parts and
// read back whole would stall on store forwarding).
HWY_INLINE uint64_t ClassWord(const uint8_t* HWY_RESTRICT cls, uint8_t c) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
  return static_cast<uint64_t>(_mm512_cmpeq_epi8_mask(_mm512_load_si512(cls), _mm512_set1_epi8(static_cast<char>(c))));
#elif HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86_64
  const __m256i want = _mm256_set1_epi8(static_cast<char>(c));
  const uint32_t lo = static_cast<uint32_t>(
      _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(cls)), want)));
  const uint32_t hi = static_cast<uint32_t>(
      _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(cls + 32)), want)));
  return uint64_t{lo} | uint64_t{hi} << 32;
#else
  const ClassByteTag d8;
  const size_t N8 = hn::Lanes(d8);
  constexpr size_t kMax = HWY_MAX_BYTES;
  uint64_t m = 0;
  if (N8 >= 8) {
    HWY_ALIGN uint8_t bits[8 + kMax / 8] = {};
    const auto want = hn::Set(d8, c);
    for (size_t i = 0; i < 64; i += N8) hn::StoreMaskBits(d8, hn::Eq(hn::Load(d8, cls + i), want), bits + i / 8);
    std::memcpy(&m, bits, 8);
  } else {
    for (size_t k = 0; k < 64; ++k) m |= static_cast<uint64_t>(cls[k] == c) << k;
  }
  return m;
#endif
}

// Per class in `classes`: its elements' mask in each of the `words` <=
// kClassWords words of class bytes at cls (64-byte aligned, kNoClass up to a
// whole word) and their running counts. kWords != 0: words == kWords, known
// when compiled (a full block's loop is unrolled without a bound check per
// word).
template <size_t kWords>
HWY_INLINE void MasksOfWords(const uint8_t* HWY_RESTRICT cls, size_t words, uint32_t classes,
                             uint64_t* HWY_RESTRICT masks, uint32_t* HWY_RESTRICT before) {
  if constexpr (kWords != 0) words = kWords;
  for (uint32_t left = classes; left != 0; left &= left - 1) {
    const uint8_t c = static_cast<uint8_t>(__builtin_ctz(left));
    uint32_t total = 0;
    for (size_t w = 0; w < words; ++w) {
      const uint64_t m = ClassWord(cls + 64 * w, c);
      masks[w] = m;
      before[w] = total;
      total += static_cast<uint32_t>(__builtin_popcountll(m));
    }
    for (size_t w = words; w <= kClassWords; ++w) before[w] = total;
    masks += kClassWords;
    before += kClassWords + 1;
  }
}

// MasksOfWords over the n <= kClassBlock class bytes at cls.
HWY_INLINE void MasksOfBytes(const uint8_t* HWY_RESTRICT cls, size_t n, uint32_t classes, uint64_t* HWY_RESTRICT masks,
                             uint32_t* HWY_RESTRICT before) {
  if (n == kClassBlock) return MasksOfWords<kClassWords>(cls, kClassWords, classes, masks, before);
  MasksOfWords<0>(cls, (n + 63) / 64, classes, masks, before);
}

void ClassMasksOfBytes16Impl(const uint8_t* HWY_RESTRICT bytes, size_t n, uint32_t classes,
                             uint64_t* HWY_RESTRICT masks, uint32_t* HWY_RESTRICT before) {
  MasksOfBytes(bytes, std::min(n, kClassBlock), classes, masks, before);
}

// Per block of kClassBlock elements, per class in `classes`: its elements
// (others' counts 0). Per class a vector compare and subtract into byte
// lanes (at most kClassBlock / lanes each, below 256 from 8 lanes up), summed
// once per block. Also keeps every element's class byte, in element
// order, in `out` (ClassCountsBytes16).
HWY_INLINE void ClassCounts(const uint16_t* HWY_RESTRICT data, size_t n, uint32_t classes, uint16_t* HWY_RESTRICT counts,
                            uint8_t* HWY_RESTRICT out) {
#if HWY_TARGET <= HWY_AVX2 && HWY_ARCH_X86_64
  // AVX2: the block's class bytes (ClassBytes32), 32 a store; per class a
  // compare and subtract per 32 into byte lanes (at most kClassBlock / 32 =
  // 32 each), summed by one SAD per block.
  const __m256i zero = _mm256_setzero_si256();
  for (size_t at = 0; at < n; at += kClassBlock, counts += kCountClasses) {
    const size_t len = std::min(kClassBlock, n - at);
    const size_t groups = len / 32;
    uint8_t* HWY_RESTRICT bytes = out + at;
    // Two blocks ahead: the stream from memory is what bounds this loop.
    if (at + 3 * kClassBlock <= n) {
      const auto* ahead = reinterpret_cast<const uint8_t*>(data + at + 2 * kClassBlock);
      for (size_t b = 0; b < kClassBlock * 2; b += 64) __builtin_prefetch(ahead + b);
    }
    for (size_t g = 0; g < groups; ++g) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(bytes + 32 * g), ClassBytes32(data + at + 32 * g));
    }
    for (int c = 0; c < kCountClasses; ++c) counts[c] = 0;
    for (uint32_t left = classes; left != 0; left &= left - 1) {
      const int c = __builtin_ctz(left);
      const __m256i want = _mm256_set1_epi8(static_cast<char>(c));
      __m256i acc0 = zero, acc1 = zero;  // two: one would chain every subtract
      size_t g = 0;
      for (; g + 2 <= groups; g += 2) {
        const auto* v = reinterpret_cast<const __m256i*>(bytes + 32 * g);
        acc0 = _mm256_sub_epi8(acc0, _mm256_cmpeq_epi8(_mm256_load_si256(v), want));
        acc1 = _mm256_sub_epi8(acc1, _mm256_cmpeq_epi8(_mm256_load_si256(v + 1), want));
      }
      if (g < groups) {
        acc0 = _mm256_sub_epi8(acc0, _mm256_cmpeq_epi8(_mm256_load_si256(reinterpret_cast<const __m256i*>(bytes + 32 * g)), want));
      }
      const __m256i sad = _mm256_sad_epu8(_mm256_add_epi8(acc0, acc1), zero);  // 4 x u64
      __m128i sum = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
      sum = _mm_add_epi64(sum, _mm_unpackhi_epi64(sum, sum));
      counts[c] = static_cast<uint16_t>(_mm_cvtsi128_si32(sum));
    }
    // The block's last len % 32 elements one by one.
    for (size_t i = groups * 32; i < len; ++i) {
      const int c = compact::ClassOf(bf16::LoadElement(data + at, i));
      counts[c] = static_cast<uint16_t>(counts[c] + (classes >> c & 1));
      bytes[i] = static_cast<uint8_t>(c);
    }
    std::memset(bytes + len, kNoClass, (len + 63) / 64 * 64 - len);
  }
#else
  const ClassByteTag d8;
  const hn::Repartition<uint64_t, decltype(d8)> d64;
  const size_t N8 = hn::Lanes(d8);
  for (size_t at = 0; at < n; at += kClassBlock, counts += kCountClasses) {
    const size_t len = std::min(kClassBlock, n - at);
    uint8_t* HWY_RESTRICT cls = out + at;
    ClassBytes16(data + at, len, cls);  // kNoClass up to a whole word
    const size_t padded = (len + 63) / 64 * 64;
    for (int c = 0; c < kCountClasses; ++c) counts[c] = 0;
    for (uint32_t left = classes; left != 0; left &= left - 1) {
      const int c = __builtin_ctz(left);
      if (N8 < 8) {
        uint32_t k = 0;
        for (size_t i = 0; i < padded; ++i) k += cls[i] == c;
        counts[c] = static_cast<uint16_t>(k);
        continue;
      }
      const auto want = hn::Set(d8, static_cast<uint8_t>(c));
      // Two accumulators: one would chain every subtract on the last.
      auto acc0 = hn::Zero(d8), acc1 = hn::Zero(d8);
      size_t i = 0;
      for (; i + 2 * N8 <= padded; i += 2 * N8) {
        acc0 = hn::Sub(acc0, hn::VecFromMask(d8, hn::Eq(hn::Load(d8, cls + i), want)));
        acc1 = hn::Sub(acc1, hn::VecFromMask(d8, hn::Eq(hn::Load(d8, cls + i + N8), want)));
      }
      if (i < padded) acc0 = hn::Sub(acc0, hn::VecFromMask(d8, hn::Eq(hn::Load(d8, cls + i), want)));
      const auto sums = hn::Add(hn::SumsOf8(acc0), hn::SumsOf8(acc1));
      counts[c] = static_cast<uint16_t>(hn::GetLane(hn::SumOfLanes(d64, sums)));
    }
  }
#endif
}

void ClassCountsBytes16Impl(const uint16_t* HWY_RESTRICT data, size_t n, uint32_t classes,
                            uint16_t* HWY_RESTRICT counts, uint8_t* HWY_RESTRICT bytes) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
  // Where the CPU has VBMI, GFNI and BITALG: a pass whose cost does not
  // grow with the classes counted (same results).
  if (HasClassCountsAvx512()) return ClassCountsBytes16Avx512(data, n, classes, counts, bytes);
#endif
  ClassCounts(data, n, classes, counts, bytes);
}

}  // namespace deltasync::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deltasync::kernels {

HWY_EXPORT(ClassCountsBytes16Impl);
HWY_EXPORT(ClassMasksOfBytes16Impl);

void ClassCountsBytes16(const uint16_t* data, size_t n, uint32_t classes, uint16_t* counts, uint8_t* bytes) {
  HWY_DYNAMIC_DISPATCH(ClassCountsBytes16Impl)(data, n, classes, counts, bytes);
}

void ClassMasksOfBytes16(const uint8_t* bytes, size_t n, uint32_t classes, uint64_t* masks, uint32_t* before) {
  HWY_DYNAMIC_DISPATCH(ClassMasksOfBytes16Impl)(bytes, n, classes, masks, before);
}

}  // namespace deltasync::kernels
#endif  // HWY_ONCE
