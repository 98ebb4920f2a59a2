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

}  // namespace deltasync::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // DELTASYNC_BF16_KERNELS_INL_H_
