// GapWalk (bf16/gap_walk.h): the indices of a gap stream, with and without
// wide gaps (at the start, side by side, at the last change, at the borders
// of the pieces asked for), whatever pieces Next() is asked for.
#include "bf16/gap_walk.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace deltasync::bf16 {
namespace {

// A stream of `count` changes: 16-bit gaps, and the ones of `wide_at` past
// 16 bits; with the indices they stand for, walked one at a time.
struct Stream {
  std::vector<uint16_t> gaps;
  std::vector<std::pair<size_t, uint64_t>> wide;
  std::vector<uint64_t> want;
};

Stream MakeStream(std::mt19937_64& rng, uint64_t first, size_t count, const std::vector<size_t>& wide_at) {
  Stream s;
  s.gaps.resize(count);
  // Slot 0 is not read: anything there.
  s.gaps[0] = 0xBEEF;
  uint64_t at = first;
  for (size_t k = 0; k < count; ++k) {
    if (k > 0) {
      uint64_t gap = rng() & 0xFFFF;
      if (std::find(wide_at.begin(), wide_at.end(), k) != wide_at.end()) {
        gap = 0x10000 + (rng() & 0xFFFFFFFFF);
        s.wide.emplace_back(k, gap);
        s.gaps[k] = static_cast<uint16_t>(gap);  // what the stream holds there: the low bits, not read
      } else {
        s.gaps[k] = static_cast<uint16_t>(gap);
      }
      at += gap + 1;
    }
    s.want.push_back(at);
  }
  return s;
}

std::vector<uint64_t> Walk(const Stream& s, uint64_t first, const std::vector<size_t>& pieces) {
  GapWalk walk(first, s.gaps.data(), s.wide);
  std::vector<uint64_t> got(s.want.size() + 1, ~uint64_t{0});
  size_t done = 0;
  for (size_t i = 0; done < s.want.size(); ++i) {
    const size_t n = std::min(pieces[i % pieces.size()], s.want.size() - done);
    walk.Next(n, got.data() + done);
    done += n;
  }
  EXPECT_EQ(got.back(), ~uint64_t{0}) << "written past the end";
  got.pop_back();
  return got;
}

TEST(GapWalkTest, TheIndicesOfTheGapsInAnyPieces) {
  std::mt19937_64 rng(3);
  const std::vector<std::vector<size_t>> wides = {
      {}, {1}, {1, 2, 3}, {511, 512, 513}, {100, 1023}, {1, 700, 701, 999, 1023}};
  const std::vector<std::vector<size_t>> pieces = {{1024}, {512}, {1}, {0, 3}, {511, 1, 2}, {7, 0, 13}};
  for (uint64_t first : {uint64_t{0}, uint64_t{70000}, (uint64_t{1} << 40) + 5}) {
    for (const std::vector<size_t>& wide_at : wides) {
      const Stream s = MakeStream(rng, first, 1024, wide_at);
      for (const std::vector<size_t>& p : pieces) {
        SCOPED_TRACE("first " + std::to_string(first) + ", " + std::to_string(wide_at.size()) + " wide, pieces of " +
                     std::to_string(p[0]));
        EXPECT_EQ(Walk(s, first, p), s.want);
      }
    }
  }
}

TEST(GapWalkTest, OneChangeAndNone) {
  std::mt19937_64 rng(4);
  const Stream s = MakeStream(rng, 12345, 1, {});
  EXPECT_EQ(Walk(s, 12345, {1}), s.want);
  GapWalk walk(7, s.gaps.data());
  uint64_t untouched = 99;
  walk.Next(0, &untouched);  // nothing asked: nothing written
  EXPECT_EQ(untouched, 99u);
  walk.Next(1, &untouched);
  EXPECT_EQ(untouched, 7u);
}

}  // namespace
}  // namespace deltasync::bf16
