// fp32 -> bf16 rounding and the IEEE non-finite test, scalar (internal).
// Shared by the public Fp32ToBf16 and by the SIMD kernels' scalar tails, so
// that every path rounds identically.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace deltasync::bf16 {

inline constexpr uint16_t kBf16ExpMask = 0x7F80;
inline constexpr uint16_t kF16ExpMask = 0x7C00;
inline constexpr uint32_t kF32ExpMask = 0x7F800000u;
inline constexpr uint64_t kF64ExpMask = 0x7FF0000000000000ull;

// Round to nearest, ties to even, on the bit pattern: adding 0x7FFF plus the
// lowest kept bit carries into the kept half exactly when the dropped half is
// above one half, or exactly one half with an odd kept half. Overflow past the
// largest finite value lands on infinity, as IEEE rounding does; subnormals
// round like any other value (no flush to zero).
//
// NaN: quiet NaN 0x7FC0 with the input's sign kept (0xFFC0 for negative).
// Rounding could otherwise carry a NaN's payload into the exponent, or drop
// every payload bit and turn it into Inf. PyTorch is not consistent here:
// c10::BFloat16's scalar cast returns 0x7FC0 for every NaN (sign dropped), its
// AVX2 vectorised cast returns 0xFFFF, and AVX512-BF16 hardware keeps sign
// and payload. We keep the sign, as include/deltasync/changes.h promises; NaN
// weights are refused by default anyway.
inline uint16_t RoundFp32ToBf16(uint32_t bits) {
  if ((bits & 0x7FFFFFFFu) > kF32ExpMask) {
    return static_cast<uint16_t>(((bits >> 16) & 0x8000u) | 0x7FC0u);
  }
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// True when every exponent bit is set: Inf or NaN.
template <typename T>
inline bool IsNonFinite(T bits, T exp_mask) {
  return (bits & exp_mask) == exp_mask;
}

// Element k of a tensor's data. Tensor bytes may sit at any alignment (an
// mmap'd safetensors file places tensors at arbitrary offsets), so scalar
// reads go through memcpy, which compiles to a plain unaligned load.
template <typename T>
inline T LoadElement(const T* data, size_t k) {
  T v;
  std::memcpy(&v, reinterpret_cast<const unsigned char*>(data) + k * sizeof(T), sizeof(T));
  return v;
}

}  // namespace deltasync::bf16
