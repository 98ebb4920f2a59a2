// The bench's paired timing (tools/deltasync/timing.h): a stage and its
// memcpy reference timed in turns, and the ratios taken from those rounds.
#include "timing.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

namespace deltasync::cli {
namespace {

TEST(PairedSeconds, RunsTheReferenceThenTheStageInEveryRound) {
  std::string order;
  const PairedTimes p = PairedSeconds(3, [&] { order += 'r'; }, [&] { order += 'f'; });
  EXPECT_EQ(order, "rfrfrf");
  EXPECT_GT(p.ref_best, 0);
  EXPECT_GT(p.fn_best, 0);
}

TEST(PairedSeconds, RunsOneRoundAtLeast) {
  std::string order;
  PairedSeconds(0, [&] { order += 'r'; }, [&] { order += 'f'; });
  EXPECT_EQ(order, "rf");
}

// Spins until this thread has used `s` more CPU seconds.
void Burn(double s) {
  const double end = ThreadCpuSeconds() + s;
  while (ThreadCpuSeconds() < end) {
  }
}

TEST(PairedSeconds, TheCpuRatioLeavesOutTimeOffTheCpu) {
  // The reference uses 4 ms of CPU; the stage 2 ms, then sleeps 10 ms (as a
  // thread that waits for a core would): CPU ratio ~2, wall ratio ~1/3.
  const PairedTimes p = PairedSeconds(
      3, [] { Burn(0.004); },
      [] {
        Burn(0.002);
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      });
  EXPECT_GT(p.cpu_ratio_median, 1.5);
  EXPECT_LT(p.cpu_ratio_median, 2.6);
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
