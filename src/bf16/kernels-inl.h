// Vector helpers shared by the SIMD kernel files (internal). Highway's
// "-inl.h" convention: included once per target from inside each kernel
// file's foreach_target pass, so the guard toggles with HWY_TARGET_TOGGLE.
#if defined(DELTASYNC_BF16_KERNELS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DELTASYNC_BF16_KERNELS_INL_H_
#undef DELTASYNC_BF16_KERNELS_INL_H_
#else
#define DELTASYNC_BF16_KERNELS_INL_H_
#endif

#include <cstddef>
#include <cstdint>

#include <hwy/highway.h>

#include "bf16/round.h"

HWY_BEFORE_NAMESPACE();
namespace deltasync::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// RoundFp32ToBf16 on u32 lanes; the bf16 lands in the low 16 bits.
template <class D32>
HWY_INLINE hn::Vec<D32> RoundToBf16(D32 d32, hn::Vec<D32> u) {
  const hn::RebindToSigned<D32> di32;
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(d32, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(hn::Add(u, hn::Set(d32, 0x7FFFu)), lsb));
  // |u| > Inf as signed compare: both sides are below 2^31.
  const auto magnitude = hn::BitCast(di32, hn::And(u, hn::Set(d32, 0x7FFFFFFFu)));
  const auto is_nan = hn::Gt(magnitude, hn::Set(di32, 0x7F800000));
  const auto quiet_nan =
      hn::Or(hn::And(hn::ShiftRight<16>(u), hn::Set(d32, 0x8000u)), hn::Set(d32, 0x7FC0u));
  return hn::IfThenElse(hn::RebindMask(d32, is_nan), quiet_nan, rounded);
}

#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86_64
// AVX2 helpers for the 32-elements-a-step loops (detect's fp32 compare,
// the fused compact scan). Raw intrinsics: Highway's u16<->u32 demotions
// and 8-lane mask stores cost a shuffle or a store per 8 elements here.

// RoundFp32ToBf16 of the 16 fp32 at cur, as 16 u16 lanes in element order.
// On u16 lanes, 16 at a time: the high halves (hi) and low halves (lo) of
// the fp32 bits are packed apart (both < 2^16, so the saturating packs keep
// them), and (bits + 0x7FFF + (hi & 1)) >> 16 is hi + 1 exactly where
// lo + (hi & 1) > 0x8000, i.e. where lo - 0x8000 > -(hi & 1) as signed
// 16-bit numbers. NaN needs its own result: when any of the 16 has an
// all-ones exponent (NaN or Inf, rare), they go the u32 way instead. The
// packs work per 128-bit half, hence the permute.
HWY_INLINE __m256i RoundToBf16x16(const uint32_t* HWY_RESTRICT cur) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cur));
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cur + 8));
  const __m256i hi = _mm256_packus_epi32(_mm256_srli_epi32(a, 16), _mm256_srli_epi32(b, 16));
  const __m256i exp = _mm256_set1_epi16(static_cast<short>(0x7F80));
  const __m256i special = _mm256_cmpeq_epi16(_mm256_and_si256(hi, exp), exp);
  if (HWY_UNLIKELY(!_mm256_testz_si256(special, special))) {
    const hn::Full256<uint32_t> d32;
    const __m256i ra = RoundToBf16(d32, hn::Vec256<uint32_t>{a}).raw;
    const __m256i rb = RoundToBf16(d32, hn::Vec256<uint32_t>{b}).raw;
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(ra, rb), 0xD8);
  }
  const __m256i low16 = _mm256_set1_epi32(0xFFFF);
  const __m256i lo = _mm256_packus_epi32(_mm256_and_si256(a, low16), _mm256_and_si256(b, low16));
  const __m256i minus_odd = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_and_si256(hi, _mm256_set1_epi16(1)));
  const __m256i up = _mm256_cmpgt_epi16(_mm256_xor_si256(lo, _mm256_set1_epi16(static_cast<short>(0x8000))), minus_odd);
  return _mm256_permute4x64_epi64(_mm256_sub_epi16(hi, up), 0xD8);
}

// Bit k set where lane k of (a1:a0) differs from lane k of (b1:b0): the
// u16 compares packed to bytes (per 128-bit half, permuted back) and one
// movemask.
HWY_INLINE uint32_t DiffBits32(__m256i a0, __m256i a1, __m256i b0, __m256i b1) {
  const __m256i eq =
      _mm256_permute4x64_epi64(_mm256_packs_epi16(_mm256_cmpeq_epi16(a0, b0), _mm256_cmpeq_epi16(a1, b1)), 0xD8);
  return ~static_cast<uint32_t>(_mm256_movemask_epi8(eq));
}

// Lanes of v0 or v1 whose exponent bits (exp in every u16 lane) are all
// set, or-ed into acc: Inf/NaN.
HWY_INLINE __m256i OrNonFinite16(__m256i acc, __m256i v0, __m256i v1, __m256i exp) {
  acc = _mm256_or_si256(acc, _mm256_cmpeq_epi16(_mm256_and_si256(v0, exp), exp));
  return _mm256_or_si256(acc, _mm256_cmpeq_epi16(_mm256_and_si256(v1, exp), exp));
}
#endif

// Puts the bits of an N-lane mask (N a power of two) into the bitmap at
// element `pos` (a multiple of N).
template <class D>
HWY_INLINE void SetMaskBits(D d, hn::Mask<D> m, size_t pos, uint8_t* HWY_RESTRICT bitmap) {
  if (hn::Lanes(d) >= 8) {
    // Whole bytes: store them in place (no read-modify-write).
    hn::StoreMaskBits(d, m, bitmap + pos / 8);
  } else {
    uint8_t bits = 0;
    hn::StoreMaskBits(d, m, &bits);
    bitmap[pos / 8] |= static_cast<uint8_t>(bits << (pos % 8));
  }
}

// The class bytes' vectors (the fused compact scan, class_count_kernels.cc):
// at most 64 lanes, one 64-byte word of class bytes. Wider SVE vectors (1024 and 2048 bits) would read past a word, and
// past a block's padded bytes into the next block's, whose bytes of class c
// ClassCountsBytes16 then counted as well (found under qemu at 2048 bits:
// docs/arm64.md). The same type as ScalableTag wherever vectors are at most
// 512 bits, i.e. on every x86 target.
using ClassByteTag = hn::CappedTag<uint8_t, 64>;

// The first of cur[0..n) that rounds to Inf or NaN (n if none): the rare
// failing call's second look.
HWY_INLINE size_t FirstNonFiniteRounded(const uint32_t* HWY_RESTRICT cur, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    if (bf16::IsNonFinite(bf16::RoundFp32ToBf16(bf16::LoadElement(cur, k)), bf16::kBf16ExpMask)) return k;
  }
  return n;
}

}  // namespace deltasync::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // DELTASYNC_BF16_KERNELS_INL_H_
