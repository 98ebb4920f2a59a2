// The state hash's per-element term, in plain C++ (internal).
//
// This is the definition that docs/format.md, "State hash" specifies; the SIMD
// kernels in hash_kernels.cc compute exactly the same values, faster. Any
// change here changes the wire format (tests/bf16/state_hash_test.cc pins a
// known answer).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "deltasync/tensor.h"

namespace deltasync::state_hash {

// Lane 0 is StateHash::lo, lane 1 is StateHash::hi. The lanes differ in every
// constant so that their sums fail independently.
inline constexpr int kLanes = 2;

// XXH3-64 seeds of a tensor's descriptor term and of its element seed
// (hex digits of pi: constants with no structure to exploit).
inline constexpr uint64_t kDescriptorSeed[kLanes] = {0x243F6A8885A308D3ull, 0x13198A2E03707344ull};
inline constexpr uint64_t kElementSeed[kLanes] = {0xA4093822299F31D0ull, 0x082EFA98EC4E6C89ull};
// Weyl increments per flat index and multipliers of the element bits. Odd,
// so index -> index*G and bits -> bits*M are bijections mod 2^64.
inline constexpr uint64_t kIndexStep[kLanes] = {0x9E3779B97F4A7C15ull, 0xD1B54A32D192ED03ull};
inline constexpr uint64_t kBitsMul[kLanes] = {0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull};
// Stafford's "Mix13" finalizer (the one splitmix64 uses): a bijection of
// 64-bit words with full avalanche.
inline constexpr uint64_t kMix1 = 0xBF58476D1CE4E5B9ull;
inline constexpr uint64_t kMix2 = 0x94D049BB133111EBull;

inline uint64_t Mix13(uint64_t z) {
  z = (z ^ (z >> 30)) * kMix1;
  z = (z ^ (z >> 27)) * kMix2;
  return z ^ (z >> 31);
}

// The term of one element in one lane. `seed` is the tensor's element seed
// for that lane, `bits` the element's little-endian bytes as an integer.
// For a fixed (seed, index) the map bits -> term is a bijection, so changing
// any single element always changes both lanes of the hash.
inline uint64_t ElementTerm(int lane, uint64_t seed, uint64_t index, uint64_t bits) {
  return Mix13((seed + index * kIndexStep[lane]) ^ (bits * kBitsMul[lane]));
}

// The per-tensor inputs of the hash, derived from its descriptor
// (name, dtype name, shape).
struct TensorSeeds {
  uint64_t descriptor_term[kLanes];
  uint64_t element_seed[kLanes];
};

// The descriptor bytes: u64le(len(name)) name u64le(len(dtype)) dtype
// u64le(rank) u64le(dim)...; length prefixes keep it unambiguous.
std::string DescriptorBytes(std::string_view name, DType dtype, std::span<const uint64_t> shape);
TensorSeeds SeedsFor(std::string_view name, DType dtype, std::span<const uint64_t> shape);

}  // namespace deltasync::state_hash
