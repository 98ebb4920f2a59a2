// Helpers shared by the bf16 tests: random tensors, straightforward
// reference implementations, and a loop over every SIMD target.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bf16/simd_kernels.h"
#include "deltasync/changes.h"
#include "deltasync/tensor.h"
#include "deltasync/weight_state.h"

namespace deltasync::testing_bf16 {

// Runs body() once per SIMD target this CPU supports (and the portable
// fallback), then restores normal dispatch.
inline void ForEachTarget(const std::function<void()>& body) {
  const std::vector<std::string> targets = kernels::SupportedTargetNames();
  ASSERT_FALSE(targets.empty());
  for (const std::string& target : targets) {
    SCOPED_TRACE("target " + target);
    ASSERT_TRUE(kernels::UseOnlyTarget(target));
    ASSERT_EQ(kernels::ActiveTargetName(), target);
    body();
  }
  kernels::UseOnlyTarget("");
}

// fp32 -> bf16 by a different route than the library's bit trick: pick the
// nearer of the two bf16 neighbours by exact (double) distance, ties to the
// even mantissa; values at or beyond max + half an ulp become Inf (the
// neighbour above the largest finite bf16 counts as 2^128, as in IEEE
// rounding).
inline double Bf16MagnitudeValue(uint32_t magnitude_bits) {  // bits without sign
  const uint32_t exp = magnitude_bits >> 7, mant = magnitude_bits & 0x7F;
  if (exp == 0xFF) return std::ldexp(1.0, 128);  // Inf as the next step up
  if (exp == 0) return std::ldexp(static_cast<double>(mant), -133);
  return std::ldexp(static_cast<double>(0x80 | mant), static_cast<int>(exp) - 134);
}

inline uint16_t ReferenceFp32ToBf16(uint32_t bits) {
  const uint32_t sign = (bits >> 16) & 0x8000;
  const uint32_t mag = bits & 0x7FFFFFFF;
  if (mag > 0x7F800000) return static_cast<uint16_t>(sign | 0x7FC0);
  if (mag == 0x7F800000) return static_cast<uint16_t>(sign | 0x7F80);
  float f;
  std::memcpy(&f, &mag, 4);
  const double x = f;
  const uint32_t below = mag >> 16;  // truncation: the neighbour towards zero
  const double lo = Bf16MagnitudeValue(below), hi = Bf16MagnitudeValue(below + 1);
  uint32_t pick;
  if (x - lo < hi - x) {
    pick = below;
  } else if (x - lo > hi - x) {
    pick = below + 1;
  } else {
    pick = (below & 1) ? below + 1 : below;
  }
  return static_cast<uint16_t>(sign | pick);
}

// A random finite bf16 weight-like pattern (any sign, exponent not all ones).
inline uint16_t RandomFiniteBf16(std::mt19937_64& rng) {
  for (;;) {
    const uint16_t v = static_cast<uint16_t>(rng());
    if ((v & 0x7F80) != 0x7F80) return v;
  }
}

// Owns tensor bytes and hands out views.
struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> data;

  TensorView view() const { return {name, dtype, shape, data}; }
  uint64_t elements() const { return data.size() / DTypeSize(dtype); }
};

inline std::vector<TensorView> Views(const std::vector<OwnedTensor>& tensors) {
  std::vector<TensorView> views;
  for (const OwnedTensor& t : tensors) views.push_back(t.view());
  return views;
}

inline uint64_t ElementBits(const uint8_t* data, size_t size, uint64_t index) {
  uint64_t bits = 0;
  std::memcpy(&bits, data + index * size, size);
  return bits;
}

inline void SetElementBits(uint8_t* data, size_t size, uint64_t index, uint64_t bits) {
  std::memcpy(data + index * size, &bits, size);
}

// Random bytes with float dtypes kept finite (exponent field never all ones).
inline OwnedTensor RandomTensor(std::mt19937_64& rng, std::string name, DType dtype,
                                std::vector<uint64_t> shape) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  OwnedTensor t{std::move(name), dtype, std::move(shape), {}};
  const size_t size = DTypeSize(dtype);
  t.data.resize(n * size);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t bits = rng();
    switch (dtype) {
      case DType::kBF16: bits = RandomFiniteBf16(rng); break;
      case DType::kF16: bits &= ~uint64_t{0x4000}; break;  // exponent < all ones
      case DType::kF32: bits &= ~uint64_t{0x40000000}; break;
      case DType::kF64: bits &= ~uint64_t{0x4000000000000000}; break;
      default: break;
    }
    SetElementBits(t.data.data(), size, i, bits);
  }
  return t;
}

// Changes each element with probability `rate` to another finite value of
// the same dtype.
inline void Mutate(std::mt19937_64& rng, OwnedTensor& t, double rate) {
  std::bernoulli_distribution pick(rate);
  const size_t size = DTypeSize(t.dtype);
  const uint64_t width_mask = size == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * size)) - 1;
  for (uint64_t i = 0; i < t.elements(); ++i) {
    if (!pick(rng)) continue;
    const uint64_t old = ElementBits(t.data.data(), size, i);
    // Flip a random non-empty set of mantissa/low bits: the value changes and
    // the exponent field stays as it was, so floats stay finite.
    uint64_t flip = (rng() | 1) & (size == 1 ? 0x7 : 0x3F) & width_mask;
    SetElementBits(t.data.data(), size, i, old ^ flip);
  }
}

// The straightforward DetectChanges: element by element, published order.
inline std::vector<TensorChanges> ReferenceDetect(const WeightState& published,
                                                  const std::vector<OwnedTensor>& current) {
  std::vector<TensorChanges> out;
  for (const WeightState::Tensor& p : published.tensors()) {
    const OwnedTensor* cur = nullptr;
    for (const OwnedTensor& c : current) {
      if (c.name == p.name) cur = &c;
    }
    const size_t size = DTypeSize(p.dtype);
    TensorChanges tc{p.name, p.dtype, {}, {}};
    for (uint64_t i = 0; i < p.num_elements(); ++i) {
      uint64_t now;
      if (p.dtype == DType::kBF16 && cur->dtype == DType::kF32) {
        now = ReferenceFp32ToBf16(static_cast<uint32_t>(ElementBits(cur->data.data(), 4, i)));
      } else {
        now = ElementBits(cur->data.data(), size, i);
      }
      if (now != ElementBits(p.data.data(), size, i)) {
        tc.indices.push_back(i);
        const size_t at = tc.values.size();
        tc.values.resize(at + size);
        std::memcpy(tc.values.data() + at, &now, size);
      }
    }
    if (!tc.indices.empty()) out.push_back(std::move(tc));
  }
  return out;
}

inline void ExpectSameChanges(const std::vector<TensorChanges>& got,
                              const std::vector<TensorChanges>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    SCOPED_TRACE("tensor " + want[k].name);
    EXPECT_EQ(got[k].name, want[k].name);
    EXPECT_EQ(got[k].dtype, want[k].dtype);
    EXPECT_EQ(got[k].indices, want[k].indices);
    EXPECT_EQ(got[k].values, want[k].values);
  }
}

}  // namespace deltasync::testing_bf16
