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

// BitWriter::Local (the state in locals, PutRiceGaps' writer) writes the
// same bits as Put: any widths 0..64, high bits of the values ignored, runs
// of local puts between plain ones, the writer growing in between.
TEST(CompactRice, LocalPutsWriteWhatPutWrites) {
  std::mt19937_64 rng(11);
  BitWriter plain, local;
  for (int run = 0; run < 300; ++run) {
    const int n = static_cast<int>(rng() % 200);
    std::vector<std::pair<uint64_t, int>> puts(n);
    uint64_t bits = 0;
    for (auto& [value, width] : puts) {
      value = rng();
      width = static_cast<int>(rng() % 8 == 0 ? rng() % 65 : rng() % 12);
      bits += static_cast<uint64_t>(width);
    }
    for (const auto& [value, width] : puts) plain.Put(value, width);
    if (run % 3 == 0) {  // plain puts on both between the runs
      for (const auto& [value, width] : puts) local.Put(value, width);
      continue;
    }
    BitWriter::Local l = local.Begin(bits);
    for (const auto& [value, width] : puts) l.Put(value, width);
    local.End(l);
  }
  EXPECT_EQ(local.Finish(), plain.Finish());
}

}  // namespace
}  // namespace deltasync::compact
