// CopyToUncached (common/stream_copy.h): byte-exact for every alignment of
// source and destination and every length around the 64-byte lines its
// non-temporal stores write, and it writes nothing outside [dst, dst + n).
#include "common/stream_copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace deltasync {
namespace {

TEST(StreamCopyTest, ExactForEveryAlignmentAndLength) {
  constexpr size_t kGuard = 128;
  std::vector<uint8_t> src(4096 + 256);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  const std::vector<size_t> lengths = {0, 1, 15, 16, 63, 64, 65, 127, 128, 129, 191, 255, 256, 1000, 4096};
  for (size_t dst_off = 0; dst_off < 64; dst_off += 7) {
    for (size_t src_off : {size_t{0}, size_t{1}, size_t{17}, size_t{64}}) {
      for (size_t n : lengths) {
        std::vector<uint8_t> dst(n + 64 + 2 * kGuard, 0xA5);
        // dst_off from a 64-byte boundary inside the buffer.
        uint8_t* base = dst.data() + kGuard;
        base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
        uint8_t* to = base + dst_off;
        CopyToUncached(to, src.data() + src_off, n);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(to[i], src[src_off + i]) << "byte " << i << " of " << n << ", dst +" << dst_off << ", src +"
                                             << src_off;
        }
        for (uint8_t* p = dst.data(); p < to; ++p) ASSERT_EQ(*p, 0xA5) << "written before dst (n " << n << ")";
        for (uint8_t* p = to + n; p < dst.data() + dst.size(); ++p) {
          ASSERT_EQ(*p, 0xA5) << "written past dst + " << n << " (dst +" << dst_off << ")";
        }
      }
    }
  }
}

TEST(StreamCopyTest, ExactOverManyLines) {
  std::vector<uint8_t> src((1u << 20) + 37), dst(src.size() + 64, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>((i >> 8) ^ i);
  CopyToUncached(dst.data() + 3, src.data(), src.size());
  EXPECT_TRUE(std::equal(src.begin(), src.end(), dst.begin() + 3));
  EXPECT_EQ(dst[2], 0);
  EXPECT_EQ(dst[3 + src.size()], 0);
}

}  // namespace
}  // namespace deltasync
