// The compact decoder's walk kernels (kernels::ClassCountsBytes16,
// ClassMasksOfBytes16)
// against a one-element-at-a-time reference (compact::ClassOf), on every
// SIMD target: tails shorter than a vector (1..31 elements past the last
// 32), partial last blocks, unaligned data, classes asked for but absent,
// classes present but not asked for, and base values at every class edge
// (exponents 0 (zeros, subnormals), 112, 113, 126, 127, 255 (Inf, NaN)),
// both signs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "bf16/bf16_test_util.h"
#include "bf16/class_counts_avx512.h"
#include "bf16/raw_kernels.h"
#include "bf16/simd_kernels.h"
#include "codec/compact_bf16.h"

namespace deltasync {
namespace {

constexpr size_t kBlock = 1024, kWords = 16;

// Values at and around every class edge, with random mantissas and signs,
// and one in eight anywhere.
std::vector<uint16_t> EdgeValues(std::mt19937_64& rng, size_t n) {
  static constexpr uint16_t kExps[] = {0, 1, 111, 112, 113, 114, 120, 125, 126, 127, 128, 200, 254, 255};
  std::uniform_int_distribution<size_t> pick(0, std::size(kExps) - 1);
  std::uniform_int_distribution<uint32_t> any(0, 0xFFFF), mant(0, 0x7F), kind(0, 7);
  std::vector<uint16_t> v(n + 1);  // + 1: the unaligned view
  for (uint16_t& x : v) {
    x = kind(rng) == 0 ? static_cast<uint16_t>(any(rng))
                       : static_cast<uint16_t>((any(rng) & 0x8000) | kExps[pick(rng)] << 7 | mant(rng));
  }
  return v;
}

// All of one class but a few of another, so that some blocks hold no
// element of a class asked for.
std::vector<uint16_t> OneClassValues(size_t n) {
  std::vector<uint16_t> v(n + 1, static_cast<uint16_t>(120 << 7 | 5));  // class 8
  for (size_t i = 0; i < v.size(); i += 2000) v[i] = static_cast<uint16_t>(0x8000 | 127 << 7);  // class 15
  return v;
}

void ExpectCounts(const uint16_t* data, size_t n, uint32_t classes) {
  const size_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<uint16_t> want(blocks * 16, 0), got(blocks * 16 + 16, 0xBEEF);
  for (size_t i = 0; i < n; ++i) {
    const int c = compact::ClassOf(data[i]);
    if (classes >> c & 1) ++want[i / kBlock * 16 + c];
  }
  // The counts, and the class bytes: one per element, then 0xFF up to a
  // whole word, nothing after.
  const size_t padded = (n + 63) / 64 * 64;
  alignas(64) static uint8_t bytes[65536 + 256];
  ASSERT_LE(padded + 64, sizeof(bytes));
  std::memset(bytes, 0xAB, padded + 64);
  kernels::ClassCountsBytes16(data, n, classes, got.data(), bytes);
  for (size_t k = 0; k < want.size(); ++k) {
    ASSERT_EQ(got[k], want[k]) << "n " << n << ", classes " << classes << ", block " << k / 16 << ", class " << k % 16;
  }
  ASSERT_EQ(got[want.size()], 0xBEEF) << "written past the last block";
  for (size_t i = 0; i < padded + 64; ++i) {
    const int want_byte = i < n ? compact::ClassOf(data[i]) : i < padded ? 0xFF : 0xAB;
    ASSERT_EQ(bytes[i], want_byte) << "n " << n << ", byte " << i;
  }
}

// ClassMasksOfBytes16 of the block's class bytes from ClassCountsBytes16
// (counting the classes asked for, or (count_none) none).
void ExpectMasks(const uint16_t* data, size_t n, uint32_t classes, bool count_none = false) {
  uint64_t masks[16 * kWords];
  uint32_t before[16 * (kWords + 1)];
  alignas(64) uint8_t bytes[kBlock];
  uint16_t counts[16];
  kernels::ClassCountsBytes16(data, n, count_none ? 0 : classes, counts, bytes);
  kernels::ClassMasksOfBytes16(bytes, n, classes, masks, before);
  int slot = 0;
  for (int c = 0; c < 16; ++c) {
    if (!(classes >> c & 1)) continue;
    uint32_t total = 0;
    for (size_t w = 0; w < kWords; ++w) {
      uint64_t m = 0;
      for (size_t k = 0; k < 64 && 64 * w + k < n; ++k) m |= uint64_t{compact::ClassOf(data[64 * w + k]) == c} << k;
      // Words past the last element are never read (their count is 0).
      if (64 * w < n) ASSERT_EQ(masks[slot * kWords + w], m) << "n " << n << ", class " << c << ", word " << w;
      ASSERT_EQ(before[slot * (kWords + 1) + w], total) << "n " << n << ", class " << c << ", word " << w;
      total += static_cast<uint32_t>(__builtin_popcountll(m));
    }
    ASSERT_EQ(before[slot * (kWords + 1) + kWords], total) << "n " << n << ", class " << c;
    ++slot;
  }
}

const std::vector<size_t>& Sizes() {
  static const std::vector<size_t> sizes = {0,    1,    2,    15,   16,   17,   31,   32,   33,   63,   64,
                                            65,   95,   96,   97,   500,  1000, 1023, 1024, 1025, 1055, 1056,
                                            2047, 2048, 2049, 3000, 4113, 65536 + 37};
  return sizes;
}

std::vector<uint32_t> ClassSets(std::mt19937_64& rng) {
  std::vector<uint32_t> sets = {0, 0xFFFF, 1, 1u << 15, 1u << 8, (1u << 1) | (1u << 14), 0x7FFE, 0x8001};
  std::uniform_int_distribution<uint32_t> any(0, 0xFFFF);
  for (int k = 0; k < 4; ++k) sets.push_back(any(rng));
  return sets;
}

// ForEachTarget covers both routes of a target that runs raw kernels on
// this CPU: the target itself (the raw counting pass) and "<target>-no-raw"
// (its Highway code), which must really turn the raw kernel off.
TEST(ClassKernels, EveryTargetWithRawKernelsIsAlsoListedWithoutThem) {
  const std::vector<std::string> names = kernels::SupportedTargetNames();
  const bool avx3 = std::find(names.begin(), names.end(), "AVX3") != names.end();
  const bool no_raw = std::find(names.begin(), names.end(), std::string("AVX3") + kernels::kNoRawSuffix) != names.end();
  EXPECT_EQ(no_raw, avx3 && kernels::CpuHasClassCountsAvx512());
  for (const std::string& name : names) {
    ASSERT_TRUE(kernels::UseOnlyTarget(name));
    const bool off = std::string_view(name).ends_with(kernels::kNoRawSuffix);
    EXPECT_EQ(kernels::HasClassCountsAvx512(), kernels::CpuHasClassCountsAvx512() && !off) << name;
    EXPECT_EQ(kernels::ActiveTargetName(), name);
  }
  ASSERT_TRUE(kernels::UseOnlyTarget(""));
  EXPECT_EQ(kernels::HasClassCountsAvx512(), kernels::CpuHasClassCountsAvx512());
  EXPECT_FALSE(kernels::UseOnlyTarget("AVX3-no-such"));
}

TEST(ClassKernels, CountsEqualTheReferenceOnEveryTargetSizeAndClassSet) {
  std::mt19937_64 rng(15);
  const std::vector<uint16_t> edges = EdgeValues(rng, 65536 + 64);
  const std::vector<uint16_t> one = OneClassValues(65536 + 64);
  const std::vector<uint32_t> sets = ClassSets(rng);
  testing_bf16::ForEachTarget([&] {
    for (const std::vector<uint16_t>* v : {&edges, &one}) {
      for (size_t offset : {size_t{0}, size_t{1}}) {  // 1: data not even 4-byte aligned
        for (size_t n : Sizes()) {
          for (uint32_t classes : sets) ASSERT_NO_FATAL_FAILURE(ExpectCounts(v->data() + offset, n, classes));
        }
      }
    }
  });
}

TEST(ClassKernels, MasksEqualTheReferenceOnEveryTargetSizeAndClassSet) {
  std::mt19937_64 rng(16);
  const std::vector<uint16_t> edges = EdgeValues(rng, kBlock);
  const std::vector<uint16_t> one = OneClassValues(kBlock);
  const std::vector<uint32_t> sets = ClassSets(rng);
  testing_bf16::ForEachTarget([&] {
    for (const std::vector<uint16_t>* v : {&edges, &one}) {
      for (size_t offset : {size_t{0}, size_t{1}}) {
        for (size_t n : Sizes()) {
          if (n > kBlock) continue;
          for (uint32_t classes : sets) {
            ASSERT_NO_FATAL_FAILURE(ExpectMasks(v->data() + offset, n, classes));
            ASSERT_NO_FATAL_FAILURE(ExpectMasks(v->data() + offset, n, classes, /*count_none=*/true));
          }
        }
      }
    }
  });
}

// Every bf16 bit pattern once (64 blocks), all classes asked for: each
// pattern's class is counted where ClassOf puts it.
TEST(ClassKernels, EveryBitPatternIsCountedInItsClass) {
  std::vector<uint16_t> all(65536);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  testing_bf16::ForEachTarget([&] {
    ASSERT_NO_FATAL_FAILURE(ExpectCounts(all.data(), all.size(), 0xFFFF));
    for (size_t at = 0; at < all.size(); at += kBlock) {
      ASSERT_NO_FATAL_FAILURE(ExpectMasks(all.data() + at, kBlock, 0xFFFF));
      ASSERT_NO_FATAL_FAILURE(ExpectMasks(all.data() + at, kBlock, 0xFFFF, /*count_none=*/true));
    }
  });
}

}  // namespace
}  // namespace deltasync
