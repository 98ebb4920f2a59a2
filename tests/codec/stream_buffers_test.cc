#include "codec/stream_buffers.h"

#include <gtest/gtest.h>

namespace deltasync::compact {
namespace {

std::vector<uint8_t> Filled(size_t n) { return std::vector<uint8_t>(n, 7); }

TEST(StreamBuffers, TakesLargestFirstClearedWithCapacityKept) {
  StreamBuffers b;
  EXPECT_TRUE(b.Take().empty());
  std::vector<std::vector<uint8_t>> given;
  given.push_back(Filled(100));
  given.push_back(Filled(5000));
  given.push_back(Filled(10));
  b.Give(std::move(given), 5110);
  EXPECT_EQ(b.count(), 3u);
  std::vector<uint8_t> first = b.Take();
  EXPECT_TRUE(first.empty());
  EXPECT_GE(first.capacity(), 5000u);
  EXPECT_GE(b.Take().capacity(), 100u);
  EXPECT_GE(b.Take().capacity(), 10u);
  EXPECT_EQ(b.count(), 0u);
  EXPECT_EQ(b.Take().capacity(), 0u);
}

TEST(StreamBuffers, KeepsAtMostTheBuffersOfTheLastPatchAndBoundsTheirSize) {
  StreamBuffers b;
  // Leftovers not taken count toward the bound: never more buffers than
  // the last patch gave.
  std::vector<std::vector<uint8_t>> many;
  for (int i = 0; i < 8; ++i) many.push_back(Filled(1000 + i));
  b.Give(std::move(many), 8000);
  std::vector<std::vector<uint8_t>> two;
  two.push_back(Filled(50));
  two.push_back(Filled(60));
  b.Give(std::move(two), 110);
  EXPECT_EQ(b.count(), 2u);
  // A patch much smaller than what is kept: the largest buffers go.
  const size_t big = StreamBuffers::kFloor * 2;
  std::vector<std::vector<uint8_t>> large;
  large.push_back(Filled(big));
  large.push_back(Filled(big / 2));
  b.Give(std::move(large), big + big / 2);
  EXPECT_EQ(b.count(), 2u);
  EXPECT_GE(b.capacity_bytes(), big + big / 2);
  std::vector<std::vector<uint8_t>> tiny;
  tiny.push_back(Filled(16));
  b.Give(std::move(tiny), 16);
  EXPECT_LE(b.capacity_bytes(), StreamBuffers::kSlack * 16 + StreamBuffers::kFloor);
  EXPECT_EQ(b.count(), 1u);
  b.Release();
  EXPECT_EQ(b.count(), 0u);
  EXPECT_EQ(b.capacity_bytes(), 0u);
}

}  // namespace
}  // namespace deltasync::compact
