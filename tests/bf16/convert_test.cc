// fp32 -> bf16 rounding: the scalar function against an independent
// reference, and the vectorised conversion against the scalar one.

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "bf16/bf16_test_util.h"
#include "deltasync/changes.h"

namespace deltasync {
namespace {

using testing_bf16::ForEachTarget;
using testing_bf16::ReferenceFp32ToBf16;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(Fp32ToBf16Test, KnownValues) {
  EXPECT_EQ(Fp32ToBf16(Bits(1.0f)), 0x3F80);
  EXPECT_EQ(Fp32ToBf16(Bits(-2.0f)), 0xC000);
  EXPECT_EQ(Fp32ToBf16(0x00000000), 0x0000);
  EXPECT_EQ(Fp32ToBf16(0x80000000), 0x8000);  // -0 keeps its sign
  EXPECT_EQ(Fp32ToBf16(0x7F800000), 0x7F80);  // +Inf
  EXPECT_EQ(Fp32ToBf16(0xFF800000), 0xFF80);  // -Inf
  // Ties to even: kept mantissa even stays, odd rounds up.
  EXPECT_EQ(Fp32ToBf16(0x3F808000), 0x3F80);
  EXPECT_EQ(Fp32ToBf16(0x3F818000), 0x3F82);
  EXPECT_EQ(Fp32ToBf16(0x3F808001), 0x3F81);  // just above half
  EXPECT_EQ(Fp32ToBf16(0x3F807FFF), 0x3F80);  // just below half
  // Mantissa carry into the exponent.
  EXPECT_EQ(Fp32ToBf16(0x3FFFFFFF), 0x4000);
  // The largest finite fp32 is above bf16 max + half an ulp: rounds to Inf.
  EXPECT_EQ(Fp32ToBf16(0x7F7FFFFF), 0x7F80);
  EXPECT_EQ(Fp32ToBf16(0x7F7F7FFF), 0x7F7F);  // below the tie: bf16 max
  EXPECT_EQ(Fp32ToBf16(0x7F7F8000), 0x7F80);  // tie with odd max: up to Inf
  EXPECT_EQ(Fp32ToBf16(0xFF7FFFFF), 0xFF80);
  // Subnormals round like normals (no flush to zero).
  EXPECT_EQ(Fp32ToBf16(0x00000001), 0x0000);
  EXPECT_EQ(Fp32ToBf16(0x00008000), 0x0000);  // tie, even
  EXPECT_EQ(Fp32ToBf16(0x00018000), 0x0002);  // tie, odd -> up
  EXPECT_EQ(Fp32ToBf16(0x00008001), 0x0001);
  EXPECT_EQ(Fp32ToBf16(0x007FFFFF), 0x0080);  // largest subnormal -> min normal
  EXPECT_EQ(Fp32ToBf16(0x80008001), 0x8001);
}

TEST(Fp32ToBf16Test, NaNIsQuietAndKeepsSign) {
  // Payloads that rounding would carry into the exponent, or drop entirely.
  for (uint32_t nan : {0x7F800001u, 0x7F808000u, 0x7FC00000u, 0x7FFFFFFFu, 0x7FBFFFFFu}) {
    EXPECT_EQ(Fp32ToBf16(nan), 0x7FC0) << std::hex << nan;
    EXPECT_EQ(Fp32ToBf16(nan | 0x80000000u), 0xFFC0) << std::hex << nan;
  }
}

// Every sign and exponent, with the mantissa patterns where rounding
// decides: dropped half 0, 1, just below/at/above one half, all ones; kept
// mantissa even, odd, and all ones (carry into the exponent).
TEST(Fp32ToBf16Test, MatchesReferenceOnEveryExponentEdge) {
  const uint32_t kept[] = {0x00, 0x01, 0x02, 0x3F, 0x40, 0x7E, 0x7F};
  const uint32_t dropped[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF};
  int checked = 0;
  for (uint32_t sign : {0u, 1u}) {
    for (uint32_t exp = 0; exp < 256; ++exp) {
      for (uint32_t k : kept) {
        for (uint32_t d : dropped) {
          const uint32_t bits = (sign << 31) | (exp << 23) | (k << 16) | d;
          ASSERT_EQ(Fp32ToBf16(bits), ReferenceFp32ToBf16(bits)) << std::hex << bits;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 256 * 7 * 7);
}

TEST(Fp32ToBf16Test, MatchesReferenceAcrossTheRange) {
  // A stride through all 2^32 patterns (prime step: every residue pattern
  // of the low bits shows up) plus random ones.
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 4099) {
    ASSERT_EQ(Fp32ToBf16(static_cast<uint32_t>(bits)),
              ReferenceFp32ToBf16(static_cast<uint32_t>(bits)))
        << std::hex << bits;
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    ASSERT_EQ(Fp32ToBf16(bits), ReferenceFp32ToBf16(bits)) << std::hex << bits;
  }
}

std::vector<float> EdgeAndRandomFloats(size_t n, uint64_t seed) {
  const uint32_t edges[] = {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                            0xFFC00001, 0x7F800001, 0x7F7FFFFF, 0x3F808000, 0x3F818000,
                            0x00008000, 0x00018000, 0x007FFFFF, 0x3FFFFFFF};
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits =
        (rng() % 4 == 0) ? edges[rng() % std::size(edges)] : static_cast<uint32_t>(rng());
    std::memcpy(&v[i], &bits, 4);
  }
  return v;
}

// Sizes 0..100 cover every remainder of every vector width (up to 16 fp32
// lanes on AVX-512), so the scalar tails are exercised at each offset.
TEST(ConvertFp32ToBf16Test, MatchesScalarForAllSmallSizesOnEveryTarget) {
  ForEachTarget([] {
    for (size_t n = 0; n <= 100; ++n) {
      const std::vector<float> src = EdgeAndRandomFloats(n, n);
      std::vector<uint16_t> dst(n + 1, 0xABCD);
      ConvertFp32ToBf16(src.data(), dst.data(), n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(dst[i], Fp32ToBf16(Bits(src[i]))) << "n=" << n << " i=" << i;
      }
      EXPECT_EQ(dst[n], 0xABCD) << "wrote past the end, n=" << n;
    }
  });
}

TEST(ConvertFp32ToBf16Test, MatchesScalarOnALargeUnalignedArray) {
  // Start one float into the buffer so no load is vector-aligned.
  const std::vector<float> buffer = EdgeAndRandomFloats((1 << 20) + 38, 99);
  const float* src = buffer.data() + 1;
  const size_t n = buffer.size() - 1;
  ForEachTarget([&] {
    std::vector<uint16_t> dst(n + 1);
    ConvertFp32ToBf16(src, dst.data() + 1, n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(dst[i + 1], Fp32ToBf16(Bits(src[i]))) << i;
  });
}

TEST(ConvertFp32ToBf16Test, CheckedConversionFindsFirstNonFinite) {
  ForEachTarget([] {
    for (size_t n : {1u, 15u, 16u, 17u, 100u, 1000u}) {
      std::vector<uint32_t> src(n, Bits(1.5f));
      std::vector<uint16_t> dst(n);
      EXPECT_EQ(kernels::ConvertF32ToBf16Checked(src.data(), dst.data(), n), n);
      // A finite fp32 that rounds to Inf counts as non-finite.
      src[n - 1] = 0x7F7FFFFF;
      if (n > 3) src[n / 2] = 0xFFC00000;  // NaN earlier
      const size_t want = n > 3 ? n / 2 : n - 1;
      EXPECT_EQ(kernels::ConvertF32ToBf16Checked(src.data(), dst.data(), n), want) << n;
      EXPECT_EQ(dst[n - 1], 0x7F80);  // still converted
    }
  });
}

}  // namespace
}  // namespace deltasync
