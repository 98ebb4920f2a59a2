// SplitBf16Planes and JoinBf16Planes: bf16 elements split into a compressed
// anchor's exponent and sign+mantissa planes and joined back, on every SIMD
// target (the join also in place: the exponent plane in the output's upper
// half, as the anchor decoder lays it out), against the bit definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "bf16/bf16_test_util.h"
#include "bf16/simd_kernels.h"

namespace deltasync {
namespace {

using testing_bf16::ForEachTarget;

// The element the planes code: sign from bit 7 of sm, the 8 exponent bits,
// the 7 mantissa bits of sm (docs/format.md, "Compressed anchors").
uint16_t Element(uint8_t e, uint8_t sm) {
  const uint16_t sign = sm >> 7, mantissa = sm & 0x7F;
  return static_cast<uint16_t>(sign << 15 | uint16_t{e} << 7 | mantissa);
}

// Every length up to a few vectors of the widest target plus odd large
// ones, so that every target's tail runs after 0, 1 and several vectors.
std::vector<size_t> Lengths() {
  std::vector<size_t> n;
  for (size_t k = 0; k <= 300; ++k) n.push_back(k);
  for (size_t k : {1023u, 1024u, 1025u, 4099u, 65536u + 37u}) n.push_back(k);
  return n;
}

TEST(JoinBf16PlanesTest, SeparateAndInPlaceGiveTheDefinedElements) {
  std::mt19937 rng(42);
  ForEachTarget([&] {
    for (size_t n : Lengths()) {
      SCOPED_TRACE("n " + std::to_string(n));
      std::vector<uint8_t> exps(n), sm(n);
      for (size_t k = 0; k < n; ++k) {
        exps[k] = static_cast<uint8_t>(rng());
        sm[k] = static_cast<uint8_t>(rng());
      }
      std::vector<uint8_t> want(2 * n);
      for (size_t k = 0; k < n; ++k) {
        const uint16_t b = Element(exps[k], sm[k]);
        want[2 * k] = static_cast<uint8_t>(b);
        want[2 * k + 1] = static_cast<uint8_t>(b >> 8);
      }
      // Separate buffers (with a guard byte past the end).
      std::vector<uint8_t> out(2 * n + 1, 0xA5);
      kernels::JoinBf16Planes(exps.data(), sm.data(), out.data(), n);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), out.begin()));
      ASSERT_EQ(out[2 * n], 0xA5);
      // In place: the exponent plane in the upper half of the output.
      std::vector<uint8_t> place(2 * n + 1, 0x5A);
      std::copy(exps.begin(), exps.end(), place.begin() + static_cast<std::ptrdiff_t>(n));
      kernels::JoinBf16Planes(place.data() + n, sm.data(), place.data(), n);
      ASSERT_TRUE(std::equal(want.begin(), want.end(), place.begin()));
      ASSERT_EQ(place[2 * n], 0x5A);
    }
  });
}

TEST(SplitBf16PlanesTest, GivesTheDefinedPlanesAndJoinsBack) {
  std::mt19937 rng(7);
  ForEachTarget([&] {
    for (size_t n : Lengths()) {
      SCOPED_TRACE("n " + std::to_string(n));
      std::vector<uint8_t> src(2 * n);
      for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
      std::vector<uint8_t> exps(n + 1, 0xA5), sm(n + 1, 0x5A);
      kernels::SplitBf16Planes(src.data(), exps.data(), sm.data(), n);
      for (size_t k = 0; k < n; ++k) {
        const uint16_t b = static_cast<uint16_t>(src[2 * k] | src[2 * k + 1] << 8);
        ASSERT_EQ(exps[k], static_cast<uint8_t>(b >> 7)) << k;
        ASSERT_EQ(sm[k], static_cast<uint8_t>(((b >> 8) & 0x80) | (b & 0x7F))) << k;
      }
      ASSERT_EQ(exps[n], 0xA5);
      ASSERT_EQ(sm[n], 0x5A);
      std::vector<uint8_t> back(2 * n);
      kernels::JoinBf16Planes(exps.data(), sm.data(), back.data(), n);
      ASSERT_EQ(back, src);
    }
  });
}

TEST(JoinBf16PlanesTest, EveryByteOfBothPlanes) {
  // Each of the 65,536 (exponent, sign+mantissa) pairs, in place.
  ForEachTarget([&] {
    const size_t n = 65536;
    std::vector<uint8_t> sm(n), buf(2 * n);
    for (size_t k = 0; k < n; ++k) {
      buf[n + k] = static_cast<uint8_t>(k >> 8);
      sm[k] = static_cast<uint8_t>(k);
    }
    kernels::JoinBf16Planes(buf.data() + n, sm.data(), buf.data(), n);
    for (size_t k = 0; k < n; ++k) {
      const uint16_t got = static_cast<uint16_t>(buf[2 * k] | buf[2 * k + 1] << 8);
      ASSERT_EQ(got, Element(static_cast<uint8_t>(k >> 8), static_cast<uint8_t>(k))) << k;
    }
  });
}

}  // namespace
}  // namespace deltasync
