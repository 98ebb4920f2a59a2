// UninitVector (a std::vector whose growth does not zero-fill: the compact
// apply's undo log) and ReserveForReuse's growth rule on it.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>

#include "common/pages.h"
#include "deltasync/uninit_vector.h"

namespace deltasync {
namespace {

TEST(UninitVectorTest, ResizeKeepsTheContentsBelowTheOldSizeAcrossGrowth) {
  UninitVector<uint32_t> v(1000);
  std::iota(v.begin(), v.end(), 7u);
  // Past the capacity: moved to fresh memory, the contents copied.
  v.resize(5000);
  ASSERT_EQ(v.size(), 5000u);
  for (uint32_t i = 0; i < 1000; ++i) ASSERT_EQ(v[i], 7 + i) << i;
  // Shrunk and grown within the capacity: the same memory, the kept
  // elements unchanged.
  const uint32_t* const at = v.data();
  v.resize(10);
  v.resize(3000);
  EXPECT_EQ(v.data(), at);
  for (uint32_t i = 0; i < 10; ++i) ASSERT_EQ(v[i], 7 + i) << i;
}

TEST(UninitVectorTest, GrowthWithinTheCapacityWritesNothing) {
  // A std::vector would zero the elements past its size; this one leaves
  // what the memory held (read back here only to see that nothing wrote it;
  // the log's users read only what they wrote).
  UninitVector<uint8_t> v(4096);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(0xA5 ^ i);
  v.resize(1);
  v.resize(4096);
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], static_cast<uint8_t>(0xA5 ^ i)) << i;
  // Other constructions still initialise.
  v.assign(16, 3);
  for (uint8_t x : v) EXPECT_EQ(x, 3);
  v.push_back(9);
  EXPECT_EQ(v.back(), 9);
}

TEST(UninitVectorTest, ReserveForReuseKeepsMemoryThatFitsAndGrowsByAnEighth) {
  UninitVector<uint16_t> v;
  // Empty: exactly n, reported as fresh.
  EXPECT_TRUE(ReserveForReuse(v, 800, /*huge=*/true));
  EXPECT_EQ(v.capacity(), 800u);
  v.resize(800);
  v[0] = 41;
  v[799] = 42;
  // Within the capacity: memory, size and contents kept, nothing fresh.
  const uint16_t* const at = v.data();
  EXPECT_FALSE(ReserveForReuse(v, 800, /*huge=*/true));
  EXPECT_FALSE(ReserveForReuse(v, 10, /*huge=*/true));
  EXPECT_EQ(v.data(), at);
  EXPECT_EQ(v.size(), 800u);
  EXPECT_EQ(v[0], 41);
  EXPECT_EQ(v[799], 42);
  // Past it: fresh memory with room for n + n/8, the contents dropped.
  EXPECT_TRUE(ReserveForReuse(v, 1600, /*huge=*/false));
  EXPECT_EQ(v.capacity(), 1800u);
  EXPECT_TRUE(v.empty());
  v.resize(1700);
  EXPECT_FALSE(ReserveForReuse(v, 1800, /*huge=*/false));
  EXPECT_EQ(v.capacity(), 1800u);
  EXPECT_TRUE(ReserveForReuse(v, 1801, /*huge=*/false));
  EXPECT_EQ(v.capacity(), 1801u + 1801u / 8);
}

// SizeUninit (the undo log's and the parse buffers' sizing): grown as
// ReserveForReuse grows it, nothing written, and only a fresh allocation's
// n elements reported (to be faulted in ahead).
TEST(UninitVectorTest, SizeUninitReportsOnlyFreshMemoryAndWritesNothing) {
  UninitVector<uint32_t> v;
  std::vector<MutableByteSpan> fresh;
  SizeUninit(v, 1000, &fresh);
  ASSERT_EQ(v.size(), 1000u);
  EXPECT_EQ(v.capacity(), 1000u);
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0].data(), reinterpret_cast<uint8_t*>(v.data()));
  EXPECT_EQ(fresh[0].size(), 4000u);
  for (uint32_t i = 0; i < 1000; ++i) v[i] = 0xC0DE0000u ^ i;
  // Shrunk and grown within the capacity: the same memory, nothing fresh,
  // nothing written.
  const uint32_t* const at = v.data();
  SizeUninit(v, 10, &fresh);
  SizeUninit(v, 1000, &fresh);
  EXPECT_EQ(v.data(), at);
  EXPECT_EQ(fresh.size(), 1u);
  for (uint32_t i = 0; i < 1000; ++i) ASSERT_EQ(v[i], 0xC0DE0000u ^ i) << i;
  // Past it: n + n/8 allocated, the n elements reported.
  SizeUninit(v, 2000, &fresh);
  EXPECT_EQ(v.size(), 2000u);
  EXPECT_EQ(v.capacity(), 2250u);
  ASSERT_EQ(fresh.size(), 2u);
  EXPECT_EQ(fresh[1].data(), reinterpret_cast<uint8_t*>(v.data()));
  EXPECT_EQ(fresh[1].size(), 8000u);
  // Without a list: sized the same, nothing reported anywhere.
  SizeUninit(v, 3000, nullptr);
  EXPECT_EQ(v.size(), 3000u);
  EXPECT_EQ(v.capacity(), 3375u);
}

}  // namespace
}  // namespace deltasync
