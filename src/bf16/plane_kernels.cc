// SplitBf16Planes and JoinBf16Planes (simd_kernels.h): bf16 elements split
// into a compressed anchor's two byte planes (codec/compact_anchor.cc) and
// joined back, per vector: an element's low byte is mantissa | the
// exponent's low bit << 7, its high byte sign | the exponent's upper 7
// bits, deinterleaved on load / interleaved on store. A replica's anchor
// load spent about a quarter of its CPU in the scalar loop the join
// replaces (docs/benchmarks.md, session 42).
//
// Compiled per target like the other kernels (foreach_target.h); the tail
// and the portable fallback use the scalar definition below.

#include "bf16/simd_kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bf16/plane_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#ifndef DELTASYNC_PLANE_KERNELS_SCALAR
#define DELTASYNC_PLANE_KERNELS_SCALAR
namespace deltasync::kernels {
namespace {
// Element k from its exponent byte e and its sign+mantissa byte sm (sign in
// bit 7), as little-endian bytes: the anchor's format (docs/format.md).
inline void JoinOne(uint8_t e, uint8_t sm, uint8_t* out) {
  out[0] = static_cast<uint8_t>((sm & 0x7F) | (e << 7));
  out[1] = static_cast<uint8_t>((sm & 0x80) | (e >> 1));
}
// The planes' bytes of the element whose little-endian bytes are lo, hi.
inline void SplitOne(uint8_t lo, uint8_t hi, uint8_t* e, uint8_t* sm) {
  *e = static_cast<uint8_t>((hi << 1) | (lo >> 7));
  *sm = static_cast<uint8_t>((hi & 0x80) | (lo & 0x7F));
}
}  // namespace
}  // namespace deltasync::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace deltasync::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// No HWY_RESTRICT: exps may lie in dst's upper half (the contract in
// simd_kernels.h). Each step loads its inputs before it stores, and its
// stores end at or before the next step's inputs.
void JoinBf16PlanesImpl(const uint8_t* exps, const uint8_t* sign_mantissa, uint8_t* dst, size_t n) {
  const hn::ScalableTag<uint8_t> d;
  const size_t N = hn::Lanes(d);
  const auto low7 = hn::Set(d, 0x7F);
  const auto top = hn::Set(d, 0x80);
  size_t k = 0;
  for (; k + N <= n; k += N) {
    const auto e = hn::LoadU(d, exps + k);
    const auto sm = hn::LoadU(d, sign_mantissa + k);
    const auto lo = hn::Or(hn::And(sm, low7), hn::ShiftLeft<7>(e));
    const auto hi = hn::Or(hn::And(sm, top), hn::ShiftRight<1>(e));
    hn::StoreInterleaved2(lo, hi, d, dst + 2 * k);
  }
  for (; k < n; ++k) JoinOne(exps[k], sign_mantissa[k], dst + 2 * k);
}

void SplitBf16PlanesImpl(const uint8_t* HWY_RESTRICT src, uint8_t* HWY_RESTRICT exps,
                         uint8_t* HWY_RESTRICT sign_mantissa, size_t n) {
  const hn::ScalableTag<uint8_t> d;
  const size_t N = hn::Lanes(d);
  const auto low7 = hn::Set(d, 0x7F);
  const auto top = hn::Set(d, 0x80);
  size_t k = 0;
  for (; k + N <= n; k += N) {
    hn::Vec<decltype(d)> lo, hi;
    hn::LoadInterleaved2(d, src + 2 * k, lo, hi);
    hn::StoreU(hn::Or(hn::ShiftLeft<1>(hi), hn::ShiftRight<7>(lo)), d, exps + k);
    hn::StoreU(hn::Or(hn::And(hi, top), hn::And(lo, low7)), d, sign_mantissa + k);
  }
  for (; k < n; ++k) SplitOne(src[2 * k], src[2 * k + 1], exps + k, sign_mantissa + k);
}

}  // namespace deltasync::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deltasync::kernels {

HWY_EXPORT(JoinBf16PlanesImpl);
HWY_EXPORT(SplitBf16PlanesImpl);

void JoinBf16Planes(const uint8_t* exps, const uint8_t* sign_mantissa, uint8_t* dst, size_t n) {
  HWY_DYNAMIC_DISPATCH(JoinBf16PlanesImpl)(exps, sign_mantissa, dst, n);
}

void SplitBf16Planes(const uint8_t* src, uint8_t* exps, uint8_t* sign_mantissa, size_t n) {
  HWY_DYNAMIC_DISPATCH(SplitBf16PlanesImpl)(src, exps, sign_mantissa, n);
}

}  // namespace deltasync::kernels
#endif  // HWY_ONCE
