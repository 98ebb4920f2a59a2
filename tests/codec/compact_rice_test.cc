// Rice gaps read straight into ranks (compact_rice.h, GapRanks): the same
// ranks as the gaps summed afterwards, run on across calls (a class's parts
// in version 3's pieces), and `past` set exactly when a rank reaches the
// elements, huge gaps (which would wrap a sum) included.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "codec/compact_rice.h"

namespace deltasync::compact {
namespace {

std::vector<uint8_t> Coded(const std::vector<uint64_t>& gaps) {
  BitWriter w;
  VectorGaps source(gaps);
  PutRiceGaps(w, gaps.size(), source);
  return w.Finish();
}

TEST(CompactRice, RanksInOnePassEqualTheSummedGapsAcrossCalls) {
  std::mt19937_64 rng(7);
  std::vector<uint64_t> gaps(5000);
  for (uint64_t& g : gaps) g = rng() % 8 == 0 ? rng() % 100000 : rng() % 20;  // escapes and short codes
  std::vector<uint64_t> want(gaps.size());
  for (size_t i = 0; i < gaps.size(); ++i) want[i] = (i == 0 ? 0 : want[i - 1] + 1) + gaps[i];
  // Two calls (two parts of one class), each coded as its own run.
  const size_t cut = 2100;
  const std::vector<uint8_t> a = Coded({gaps.begin(), gaps.begin() + cut});
  const std::vector<uint8_t> b = Coded({gaps.begin() + cut, gaps.end()});
  for (uint64_t elements : {want.back() + 1, want.back()}) {
    GapRanks ranks;
    ranks.elements = elements;
    std::vector<uint64_t> got(gaps.size());
    BitReader ra(a), rb(b);
    ASSERT_FALSE(GetRiceGaps(ra, cut, got.data(), &ranks));
    ASSERT_FALSE(GetRiceGaps(rb, gaps.size() - cut, got.data() + cut, &ranks));
    EXPECT_EQ(got, want);
    EXPECT_EQ(ranks.past, elements == want.back()) << elements;
  }
}

TEST(CompactRice, AGapThatWouldWrapTheRankIsPast) {
  const std::vector<uint8_t> coded = Coded({5, ~uint64_t{0} - 3, 0});
  GapRanks ranks;
  ranks.elements = 100;
  std::vector<uint64_t> got(3);
  BitReader r(coded);
  ASSERT_FALSE(GetRiceGaps(r, 3, got.data(), &ranks));
  EXPECT_TRUE(ranks.past);
}

}  // namespace
}  // namespace deltasync::compact
