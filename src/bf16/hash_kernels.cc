// SIMD kernels of the state hash: sums of ElementTerm (hash_term.h) over
// spans of elements, in 64-bit lanes.
//
// The term needs 64x64 -> 64-bit multiplies. AVX-512 has one (vpmullq);
// SSE/AVX2 only multiply 32x32 -> 64 (MulEven), so there a product is built
// from three of those: x*k = lo(x)lo(k) + ((hi(x)lo(k) + lo(x)hi(k)) << 32)
// mod 2^64. Element bits of at most 4 bytes have hi(x) = 0 and need two.
// The flat index enters as a Weyl sequence seed + index*G, which a vector
// advances with one add per step instead of a multiply.

#include <cstring>

#include "bf16/hash_term.h"
#include "bf16/round.h"
#include "bf16/simd_kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bf16/hash_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace deltasync::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
namespace sh = deltasync::state_hash;

using D64 = hn::ScalableTag<uint64_t>;
using V64 = hn::Vec<D64>;

// x * k mod 2^64. kSmall: the caller promises x < 2^32 (one product less).
// HWY_SCALAR (the portable fallback: one lane, plain C++) multiplies natively.
template <bool kSmall = false>
HWY_INLINE V64 MulConst(V64 x, uint64_t k) {
  const D64 d;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL || HWY_TARGET == HWY_SCALAR
  return hn::Mul(x, hn::Set(d, k));
#else
  const hn::Repartition<uint32_t, D64> d32;
  const auto k_lo = hn::BitCast(d32, hn::Set(d, k & 0xFFFFFFFFu));
  const auto k_hi = hn::BitCast(d32, hn::Set(d, k >> 32));
  const auto x32 = hn::BitCast(d32, x);
  auto cross = hn::MulEven(x32, k_hi);
  if constexpr (!kSmall) {
    cross = hn::Add(cross, hn::MulEven(hn::BitCast(d32, hn::ShiftRight<32>(x)), k_lo));
  }
  return hn::Add(hn::MulEven(x32, k_lo), hn::ShiftLeft<32>(cross));
#endif
}

HWY_INLINE V64 Mix13(V64 z) {
  z = MulConst(hn::Xor(z, hn::ShiftRight<30>(z)), sh::kMix1);
  z = MulConst(hn::Xor(z, hn::ShiftRight<27>(z)), sh::kMix2);
  return hn::Xor(z, hn::ShiftRight<31>(z));
}

// Zero-extends Lanes(D64) elements of type T into u64 lanes.
template <typename T>
HWY_INLINE V64 LoadBits(const T* HWY_RESTRICT p) {
  const D64 d;
  if constexpr (sizeof(T) == 8) {
    return hn::LoadU(d, p);
  } else if constexpr (sizeof(T) == 4) {
    return hn::PromoteTo(d, hn::LoadU(hn::Rebind<T, D64>(), p));
  } else {
    const hn::Rebind<uint32_t, D64> d32;
    return hn::PromoteTo(d, hn::PromoteTo(d32, hn::LoadU(hn::Rebind<T, D64>(), p)));
  }
}

template <typename T>
HWY_INLINE void HashElementsT(const T* HWY_RESTRICT data, size_t n, uint64_t base,
                              const uint64_t seed[2], uint64_t sums[2]) {
  const D64 d;
  const size_t N = hn::Lanes(d);
  constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(uint64_t);
  // Lane j of w holds seed + (base + i + j) * G for the current i.
  HWY_ALIGN uint64_t w_init[2][kMaxLanes];
  for (size_t j = 0; j < N; ++j) {
    for (int lane = 0; lane < 2; ++lane) {
      w_init[lane][j] = seed[lane] + (base + j) * sh::kIndexStep[lane];
    }
  }
  V64 w0 = hn::Load(d, w_init[0]), w1 = hn::Load(d, w_init[1]);
  const V64 step0 = hn::Set(d, N * sh::kIndexStep[0]);
  const V64 step1 = hn::Set(d, N * sh::kIndexStep[1]);
  V64 sum0 = hn::Zero(d), sum1 = hn::Zero(d);
  constexpr bool kSmall = sizeof(T) <= 4;
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const V64 bits = LoadBits(data + i);
    sum0 = hn::Add(sum0, Mix13(hn::Xor(w0, MulConst<kSmall>(bits, sh::kBitsMul[0]))));
    sum1 = hn::Add(sum1, Mix13(hn::Xor(w1, MulConst<kSmall>(bits, sh::kBitsMul[1]))));
    w0 = hn::Add(w0, step0);
    w1 = hn::Add(w1, step1);
  }
  HWY_ALIGN uint64_t lanes[2][kMaxLanes];
  hn::Store(sum0, d, lanes[0]);
  hn::Store(sum1, d, lanes[1]);
  for (int lane = 0; lane < 2; ++lane) {
    uint64_t s = 0;
    for (size_t j = 0; j < N; ++j) s += lanes[lane][j];
    for (size_t k = i; k < n; ++k) {
      s += sh::ElementTerm(lane, seed[lane], base + k, bf16::LoadElement(data, k));
    }
    sums[lane] += s;
  }
}

void HashElements8Impl(const uint8_t* data, size_t n, uint64_t base, const uint64_t seed[2],
                       uint64_t sums[2]) {
  HashElementsT(data, n, base, seed, sums);
}
void HashElements16Impl(const uint16_t* data, size_t n, uint64_t base, const uint64_t seed[2],
                        uint64_t sums[2]) {
  HashElementsT(data, n, base, seed, sums);
}
void HashElements32Impl(const uint32_t* data, size_t n, uint64_t base, const uint64_t seed[2],
                        uint64_t sums[2]) {
  HashElementsT(data, n, base, seed, sums);
}
void HashElements64Impl(const uint64_t* data, size_t n, uint64_t base, const uint64_t seed[2],
                        uint64_t sums[2]) {
  HashElementsT(data, n, base, seed, sums);
}

void HashTermDiffsImpl(const uint64_t* HWY_RESTRICT index, const uint64_t* HWY_RESTRICT new_bits,
                       const uint64_t* HWY_RESTRICT old_bits, size_t n, const uint64_t seed[2],
                       uint64_t sums[2]) {
  const D64 d;
  const size_t N = hn::Lanes(d);
  // Two named sums, not an array: SVE vectors are sizeless types, which
  // cannot be array elements.
  V64 sum0 = hn::Zero(d), sum1 = hn::Zero(d);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const V64 idx = hn::LoadU(d, index + i);
    const V64 nb = hn::LoadU(d, new_bits + i);
    const V64 ob = hn::LoadU(d, old_bits + i);
    const auto term_diff = [&](int lane) {
      const V64 w = hn::Add(hn::Set(d, seed[lane]), MulConst(idx, sh::kIndexStep[lane]));
      const V64 t_new = Mix13(hn::Xor(w, MulConst(nb, sh::kBitsMul[lane])));
      const V64 t_old = Mix13(hn::Xor(w, MulConst(ob, sh::kBitsMul[lane])));
      return hn::Sub(t_new, t_old);
    };
    sum0 = hn::Add(sum0, term_diff(0));
    sum1 = hn::Add(sum1, term_diff(1));
  }
  constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(uint64_t);
  HWY_ALIGN uint64_t lanes[2][kMaxLanes];
  hn::Store(sum0, d, lanes[0]);
  hn::Store(sum1, d, lanes[1]);
  for (int lane = 0; lane < 2; ++lane) {
    uint64_t s = 0;
    for (size_t j = 0; j < N; ++j) s += lanes[lane][j];
    for (size_t k = i; k < n; ++k) {
      s += sh::ElementTerm(lane, seed[lane], index[k], new_bits[k]) -
           sh::ElementTerm(lane, seed[lane], index[k], old_bits[k]);
    }
    sums[lane] += s;
  }
}

// HashTermDiffsImpl over 16-bit elements: they are below 2^32, so their
// products take one multiply less (MulConst<true>). Element k's index is
// index[k] (u64), or base + index[k] (u32 offsets: HashTermDiffs16At).
template <typename Index>
HWY_INLINE void HashTermDiffs16Of(uint64_t base, const Index* HWY_RESTRICT index,
                                  const uint8_t* HWY_RESTRICT new_bytes, const uint8_t* HWY_RESTRICT old_bytes,
                                  size_t n, const uint64_t seed[2], uint64_t sums[2]) {
  const D64 d;
  const size_t N = hn::Lanes(d);
  const hn::Rebind<uint16_t, D64> d16;
  const hn::Rebind<uint32_t, D64> d32;
  V64 sum0 = hn::Zero(d), sum1 = hn::Zero(d);  // not an array: see HashTermDiffsImpl
  const V64 seed0 = hn::Set(d, seed[0]), seed1 = hn::Set(d, seed[1]);
  const V64 vbase = hn::Set(d, base);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    V64 idx;
    if constexpr (sizeof(Index) == 8) {
      idx = hn::LoadU(d, index + i);
    } else {
      idx = hn::Add(vbase, hn::PromoteTo(d, hn::LoadU(d32, index + i)));
    }
    // LoadU reads unaligned bytes (the pointer cast only names the lane type).
    const V64 nb = hn::PromoteTo(d, hn::PromoteTo(d32, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(new_bytes) + i)));
    const V64 ob = hn::PromoteTo(d, hn::PromoteTo(d32, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(old_bytes) + i)));
    const V64 w0 = hn::Add(seed0, MulConst(idx, sh::kIndexStep[0]));
    const V64 w1 = hn::Add(seed1, MulConst(idx, sh::kIndexStep[1]));
    sum0 = hn::Add(sum0, hn::Sub(Mix13(hn::Xor(w0, MulConst<true>(nb, sh::kBitsMul[0]))),
                                 Mix13(hn::Xor(w0, MulConst<true>(ob, sh::kBitsMul[0])))));
    sum1 = hn::Add(sum1, hn::Sub(Mix13(hn::Xor(w1, MulConst<true>(nb, sh::kBitsMul[1]))),
                                 Mix13(hn::Xor(w1, MulConst<true>(ob, sh::kBitsMul[1])))));
  }
  constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(uint64_t);
  HWY_ALIGN uint64_t lanes[2][kMaxLanes];
  hn::Store(sum0, d, lanes[0]);
  hn::Store(sum1, d, lanes[1]);
  for (int lane = 0; lane < 2; ++lane) {
    uint64_t s = 0;
    for (size_t j = 0; j < N; ++j) s += lanes[lane][j];
    for (size_t k = i; k < n; ++k) {
      const uint64_t nb = new_bytes[2 * k] | uint64_t{new_bytes[2 * k + 1]} << 8;
      const uint64_t ob = old_bytes[2 * k] | uint64_t{old_bytes[2 * k + 1]} << 8;
      const uint64_t at = sizeof(Index) == 8 ? uint64_t{index[k]} : base + index[k];
      s += sh::ElementTerm(lane, seed[lane], at, nb) - sh::ElementTerm(lane, seed[lane], at, ob);
    }
    sums[lane] += s;
  }
}

void HashTermDiffs16Impl(const uint64_t* HWY_RESTRICT index, const uint8_t* HWY_RESTRICT new_bytes,
                         const uint8_t* HWY_RESTRICT old_bytes, size_t n, const uint64_t seed[2],
                         uint64_t sums[2]) {
  HashTermDiffs16Of(0, index, new_bytes, old_bytes, n, seed, sums);
}

void HashTermDiffs16AtImpl(uint64_t base, const uint32_t* HWY_RESTRICT offset, const uint8_t* HWY_RESTRICT new_bytes,
                           const uint8_t* HWY_RESTRICT old_bytes, size_t n, const uint64_t seed[2],
                           uint64_t sums[2]) {
  HashTermDiffs16Of(base, offset, new_bytes, old_bytes, n, seed, sums);
}

}  // namespace deltasync::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deltasync::kernels {

HWY_EXPORT(HashElements8Impl);
HWY_EXPORT(HashElements16Impl);
HWY_EXPORT(HashElements32Impl);
HWY_EXPORT(HashElements64Impl);
HWY_EXPORT(HashTermDiffsImpl);
HWY_EXPORT(HashTermDiffs16Impl);
HWY_EXPORT(HashTermDiffs16AtImpl);

void HashElements8(const uint8_t* data, size_t n, uint64_t base, const uint64_t seed[2],
                   uint64_t sums[2]) {
  HWY_DYNAMIC_DISPATCH(HashElements8Impl)(data, n, base, seed, sums);
}
void HashElements16(const uint16_t* data, size_t n, uint64_t base, const uint64_t seed[2],
                    uint64_t sums[2]) {
  HWY_DYNAMIC_DISPATCH(HashElements16Impl)(data, n, base, seed, sums);
}
void HashElements32(const uint32_t* data, size_t n, uint64_t base, const uint64_t seed[2],
                    uint64_t sums[2]) {
  HWY_DYNAMIC_DISPATCH(HashElements32Impl)(data, n, base, seed, sums);
}
void HashElements64(const uint64_t* data, size_t n, uint64_t base, const uint64_t seed[2],
                    uint64_t sums[2]) {
  HWY_DYNAMIC_DISPATCH(HashElements64Impl)(data, n, base, seed, sums);
}
void HashTermDiffs(const uint64_t* index, const uint64_t* new_bits, const uint64_t* old_bits,
                   size_t n, const uint64_t seed[2], uint64_t sums[2]) {
  HWY_DYNAMIC_DISPATCH(HashTermDiffsImpl)(index, new_bits, old_bits, n, seed, sums);
}
void HashTermDiffs16(const uint64_t* index, const uint8_t* new_bits, const uint8_t* old_bits, size_t n,
                     const uint64_t seed[2], uint64_t sums[2]) {
  HWY_DYNAMIC_DISPATCH(HashTermDiffs16Impl)(index, new_bits, old_bits, n, seed, sums);
}
void HashTermDiffs16At(uint64_t base, const uint32_t* offset, const uint8_t* new_bits, const uint8_t* old_bits,
                       size_t n, const uint64_t seed[2], uint64_t sums[2]) {
  HWY_DYNAMIC_DISPATCH(HashTermDiffs16AtImpl)(base, offset, new_bits, old_bits, n, seed, sums);
}

}  // namespace deltasync::kernels
#endif  // HWY_ONCE
