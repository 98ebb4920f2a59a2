// SIMD kernel of the gap_delta detect (CompareF32ToBf16Gaps, simd_kernels.h)
// where the AVX-512 kernel (detect_gaps_avx512.cc) does not run: fp32
// rounded to bf16, compared with the published bf16, and each change's gap
// from the one before and its new value written, in two passes per block
// with no branch on the data. On AVX2 and 128-bit x86 (and NEON) the lanes
// are packed by this file's own compress tables (CompressStoreWhole).
//
// Highway compiles this file once per target (foreach_target.h re-includes
// it); HWY_EXPORT/HWY_DYNAMIC_DISPATCH at the bottom pick one at run time.

#include <algorithm>
#include <array>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bf16/detect_gaps_avx512.h"
#include "bf16/round.h"
#include "bf16/simd_kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bf16/detect_gaps_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "bf16/kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace deltasync::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The changes are packed per block of this many elements (on the stack, L1).
constexpr size_t kBlock = 1024;

// Stores the lanes of v under m packed in lane order at out, then the rest
// of a whole vector (unspecified lanes); returns how many m holds.
// Highway 1.0's Compress on AVX2 and on 128-bit targets looks its lane
// indices up in a table that is a local array, which GCC copies onto the
// stack at every call (1 KiB by `rep movsq` on AVX2: CompareGapsLoop ran
// seven times slower, three times on SSE4). Those targets (NEON too, whose
// Highway code has the same pattern) use the same tables here, built once.
// AVX-512, SVE and RVV compress natively.
template <class D>
HWY_INLINE size_t CompressStoreWhole(D d, hn::Vec<D> v, hn::Mask<D> m, hn::TFromD<D>* HWY_RESTRICT out) {
  hn::StoreU(hn::Compress(v, m), d, out);
  return hn::CountTrue(d, m);
}

#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128 && HWY_HAVE_SCALABLE == 0
// 4 u32 lanes: per mask, the byte indices of its lanes, then the others.
constexpr std::array<uint8_t, 16 * 16> MakeCompressBytes4() {
  std::array<uint8_t, 16 * 16> table{};
  for (uint32_t mask = 0; mask < 16; ++mask) {
    uint32_t slot = 0;
    for (uint32_t pass = 0; pass < 2; ++pass) {
      for (uint32_t lane = 0; lane < 4; ++lane) {
        if (((mask >> lane) & 1) == pass) continue;  // pass 0: its lanes; 1: the others
        for (uint32_t byte = 0; byte < 4; ++byte) table[16 * mask + 4 * slot + byte] = static_cast<uint8_t>(4 * lane + byte);
        ++slot;
      }
    }
  }
  return table;
}
inline constexpr std::array<uint8_t, 16 * 16> kCompressBytes4 = MakeCompressBytes4();

HWY_INLINE size_t CompressStoreWhole(hn::Full128<uint32_t> d, hn::Vec128<uint32_t> v, hn::Mask128<uint32_t> m,
                                     uint32_t* HWY_RESTRICT out) {
  const hn::Repartition<uint8_t, decltype(d)> d8;
  uint8_t bits = 0;
  hn::StoreMaskBits(d, m, &bits);
  const auto idx = hn::LoadU(d8, kCompressBytes4.data() + 16 * bits);
  hn::StoreU(hn::TableLookupBytes(v, hn::BitCast(d, idx)), d, out);
  // The count of 4 bits without POPCNT (not in SSSE3 and older).
  return static_cast<size_t>((uint64_t{0x4332322132212110} >> (4 * bits)) & 0xF);
}
#endif

#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86_64
// 8 u32 lanes: per mask, eight 4-bit lane indices in one u32.
constexpr std::array<uint32_t, 256> MakeCompressNibbles() {
  std::array<uint32_t, 256> table{};
  for (uint32_t mask = 0; mask < 256; ++mask) {
    uint32_t packed = 0, slot = 0;
    for (uint32_t lane = 0; lane < 8; ++lane) {
      if ((mask >> lane) & 1) packed |= lane << (4 * slot++);
    }
    table[mask] = packed;
  }
  return table;
}
inline constexpr std::array<uint32_t, 256> kCompressNibbles = MakeCompressNibbles();

// CompressStoreWhole of the 8 lanes of v under the mask `bits`.
HWY_INLINE size_t CompressStore8(__m256i v, unsigned bits, uint32_t* HWY_RESTRICT out) {
  const __m256i idx = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(kCompressNibbles[bits])),
                                        _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_permutevar8x32_epi32(v, idx));
  return static_cast<size_t>(__builtin_popcount(bits));
}

HWY_INLINE size_t CompressStoreWhole(hn::Full256<uint32_t>, hn::Vec256<uint32_t> v, hn::Mask256<uint32_t> m,
                                     uint32_t* HWY_RESTRICT out) {
  return CompressStore8(v.raw, static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(m.raw))), out);
}
#endif

// CompareF32ToBf16Gaps where the AVX-512 kernel does not run. Per block of
// kBlock elements, two passes:
//  1. per vector: the rounding, the compare, and the changed lanes'
//     (offset << 16 | value) packed in element order by Compress into
//     `packed` (on the stack, in L1), stored whole whatever the count;
//  2. per vector of packed entries: each one's gap, its offset minus the
//     offset of the entry before minus 1 (packed[0] holds the last change
//     of the blocks before), and its value.
// No bitmap, no branch on the data: with the bitmap emit it replaces, AVX2
// ran 22-27% over the read floor, this route 11-13%; AVX3-no-raw went from
// 43-48% to 0-15% (medians, docs/benchmarks.md, session 43, helper H5).
template <bool kCheck>
HWY_INLINE size_t CompareGapsLoop(const uint16_t* HWY_RESTRICT pub, const uint32_t* HWY_RESTRICT cur, size_t n,
                                  uint16_t* HWY_RESTRICT gaps, uint16_t* HWY_RESTRICT val_out,
                                  size_t* HWY_RESTRICT last, size_t* HWY_RESTRICT first_bad) {
  // At most 16 lanes: a vector of gaps or values past the count stays in
  // the caller's slack.
  const hn::CappedTag<uint32_t, 16> d32;
  const hn::RebindToSigned<decltype(d32)> di32;
  const hn::Rebind<uint16_t, decltype(d32)> d16;
  constexpr size_t kMaxLanes = 16;
  static_assert(kMaxLanes <= kCompareGapsSlack);
  const size_t N = hn::Lanes(d32);
  const auto exp = hn::Set(d32, uint32_t{bf16::kBf16ExpMask});
  const auto low16 = hn::Set(d32, 0xFFFFu);
  const auto one = hn::Set(d32, 1u);
  auto bad = hn::FirstN(d32, 0);
  bool any_bad = false;
#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86_64
  const __m256i exp16 = _mm256_set1_epi16(static_cast<short>(bf16::kBf16ExpMask));
  __m256i bad16 = _mm256_setzero_si256();
#endif
  // packed[0]: the last change so far; offset 0xFFFF (-1) before the first,
  // whose gap is then its offset.
  HWY_ALIGN uint32_t packed[1 + kBlock + kMaxLanes];
  packed[0] = 0xFFFFu << 16;
  size_t count = 0;
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t end = start + std::min(kBlock, n - start);
    size_t k = 0;  // the block's changes
    size_t i = start;
    auto offsets = hn::ShiftLeft<16>(hn::Iota(d32, static_cast<uint32_t>(start)));
    const auto step = hn::Set(d32, static_cast<uint32_t>(N) << 16);
#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86_64
    // 16 elements a step: rounded and compared on u16 lanes (as
    // CompareF32Loop's), then widened for two 8-lane compresses.
    __m256i offsets_lo = _mm256_slli_epi32(_mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(start)),
                                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)), 16);
    const __m256i offsets_step = _mm256_set1_epi32(16 << 16), eight = _mm256_set1_epi32(8 << 16);
    for (; i + 16 <= end; i += 16) {
      const __m256i r = RoundToBf16x16(cur + i);
      if (kCheck) bad16 = _mm256_or_si256(bad16, _mm256_cmpeq_epi16(_mm256_and_si256(r, exp16), exp16));
      const __m256i same = _mm256_cmpeq_epi16(r, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pub + i)));
      // Per 128-bit half: the 8 compares as bytes 0-7 (and again as 8-15).
      const unsigned changed = ~static_cast<unsigned>(_mm256_movemask_epi8(_mm256_packs_epi16(same, same)));
      const __m256i lo = _mm256_or_si256(offsets_lo, _mm256_cvtepu16_epi32(_mm256_castsi256_si128(r)));
      const __m256i hi = _mm256_or_si256(_mm256_add_epi32(offsets_lo, eight),
                                         _mm256_cvtepu16_epi32(_mm256_extracti128_si256(r, 1)));
      k += CompressStore8(lo, changed & 0xFF, packed + 1 + k);
      k += CompressStore8(hi, (changed >> 16) & 0xFF, packed + 1 + k);
      offsets_lo = _mm256_add_epi32(offsets_lo, offsets_step);
    }
    offsets = hn::Add(offsets, hn::Set(d32, static_cast<uint32_t>(i - start) << 16));
#endif
    for (; i + N <= end; i += N) {
      const auto r = RoundToBf16(d32, hn::LoadU(d32, cur + i));
      if (kCheck) bad = hn::Or(bad, hn::Eq(hn::And(r, exp), exp));
      const auto changed = hn::Ne(r, hn::PromoteTo(d32, hn::LoadU(d16, pub + i)));
      k += CompressStoreWhole(d32, hn::Or(offsets, r), changed, packed + 1 + k);
      offsets = hn::Add(offsets, step);
    }
    for (; i < end; ++i) {
      const uint16_t r = bf16::RoundFp32ToBf16(bf16::LoadElement(cur, i));
      if (kCheck) any_bad |= bf16::IsNonFinite(r, bf16::kBf16ExpMask);
      packed[1 + k] = static_cast<uint32_t>(i) << 16 | r;
      k += r != bf16::LoadElement(pub, i);
    }
    for (size_t j = 0; j < k; j += N) {
      const auto entry = hn::LoadU(d32, packed + 1 + j);
      const auto gap = hn::Sub(hn::Sub(hn::ShiftRight<16>(entry), hn::ShiftRight<16>(hn::LoadU(d32, packed + j))), one);
      // Both < 2^16, so the saturating i32 -> u16 demotions are exact.
      hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di32, hn::And(gap, low16))), d16, gaps + count + j);
      hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di32, hn::And(entry, low16))), d16, val_out + count + j);
    }
    packed[0] = packed[k];
    count += k;
  }
  any_bad |= kCheck && !hn::AllFalse(d32, bad);
#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86_64
  any_bad |= kCheck && !_mm256_testz_si256(bad16, bad16);
#endif
  *first_bad = any_bad ? FirstNonFiniteRounded(cur, n) : n;
  *last = packed[0] >> 16;
  return count;
}

// ---- exported (one symbol per target) ----

size_t CompareF32ToBf16GapsImpl(const uint16_t* pub, const uint32_t* cur, size_t n, bool check_finite,
                                 uint16_t* gaps, uint16_t* val_out, size_t* last, size_t* first_bad) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
  if (HasDetectGapsAvx512()) return CompareF32ToBf16GapsAvx512(pub, cur, n, check_finite, gaps, val_out, last, first_bad);
#endif
  if (check_finite) return CompareGapsLoop<true>(pub, cur, n, gaps, val_out, last, first_bad);
  return CompareGapsLoop<false>(pub, cur, n, gaps, val_out, last, first_bad);
}

}  // namespace deltasync::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deltasync::kernels {

HWY_EXPORT(CompareF32ToBf16GapsImpl);

size_t CompareF32ToBf16Gaps(const uint16_t* pub, const uint32_t* cur, size_t n, bool check_finite, uint16_t* gaps,
                            uint16_t* val_out, size_t* last, size_t* first_bad) {
  return HWY_DYNAMIC_DISPATCH(CompareF32ToBf16GapsImpl)(pub, cur, n, check_finite, gaps, val_out, last, first_bad);
}

}  // namespace deltasync::kernels
#endif  // HWY_ONCE
