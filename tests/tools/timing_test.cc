// The bench's paired timing (tools/deltasync/timing.h): a stage and its
// memcpy reference timed in turns, and the ratios taken from those rounds.
#include "timing.h"

#include <gtest/gtest.h>

#include <string>

namespace deltasync::cli {
namespace {

TEST(PairedSeconds, RunsTheReferenceThenTheStageInEveryRound) {
  std::string order;
  const PairedTimes p = PairedSeconds(
      3, [&] { order += 'r'; }, [&] { order += 'f'; }, [&] { order += 'b'; });
  EXPECT_EQ(order, "rfbrfbrfb");
  EXPECT_GT(p.ref_best, 0);
  EXPECT_GT(p.fn_best, 0);
}

TEST(PairedSeconds, RunsOneRoundAtLeast) {
  std::string order;
  PairedSeconds(0, [&] { order += 'r'; }, [&] { order += 'f'; });
  EXPECT_EQ(order, "rf");
}

TEST(PairRatios, MedianOfTheRoundsRatiosAndBestAgainstBest) {
  // Ratios 0.5, 1, 2 (out of order).
  const PairedTimes p = PairRatios({4, 1, 2}, {2, 2, 2});
  EXPECT_DOUBLE_EQ(p.ratio_median, 1.0);
  EXPECT_DOUBLE_EQ(p.ref_best, 1.0);
  EXPECT_DOUBLE_EQ(p.fn_best, 2.0);
  EXPECT_DOUBLE_EQ(p.ratio_best, 0.5);
}

TEST(PairRatios, AnEvenCountTakesTheMeanOfTheMiddleTwo) {
  const PairedTimes p = PairRatios({1, 3, 5, 8}, {1, 1, 1, 1});
  EXPECT_DOUBLE_EQ(p.ratio_median, 4.0);
}

TEST(PairRatios, OneRoundOnAQuietHostMovesTheBestNotTheMedian) {
  // Two rounds agree on 0.5; in the third the stage alone ran 4x faster.
  const PairedTimes p = PairRatios({1, 1, 1}, {2, 2, 0.5});
  EXPECT_DOUBLE_EQ(p.ratio_median, 0.5);
  EXPECT_DOUBLE_EQ(p.ratio_best, 2.0);
}

}  // namespace
}  // namespace deltasync::cli
