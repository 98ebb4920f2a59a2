// InOrder (bf16/in_order.h): chunks finished in any order, on any thread,
// reach the step in chunk order, each once, one step at a time.

#include "bf16/in_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

namespace deltasync {
namespace {

// Four threads finish the chunks in a shuffled order; every chunk reaches
// the step after its own Finish and every chunk before it, never two steps
// at once. A chunk never finished (a failed one) holds back all after it.
TEST(InOrderTest, StepsInChunkOrderWhateverFinishesFirst) {
  constexpr size_t kChunks = 400;
  constexpr size_t kThreads = 4;
  for (int round = 0; round < 24; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::mt19937_64 rng(round);
    std::vector<size_t> order(kChunks);
    std::iota(order.begin(), order.end(), size_t{0});
    std::shuffle(order.begin(), order.end(), rng);
    // Odd rounds: one chunk is never finished.
    const size_t held = round % 2 == 1 ? rng() % kChunks : kChunks;
    bf16::InOrder in_order(kChunks);
    std::vector<std::atomic<bool>> finished(kChunks);
    std::vector<size_t> seen;  // only the step touches it
    std::atomic<int> inside{0};
    std::atomic<bool> overlap{false}, early{false};
    const auto step = [&](size_t first, size_t end) {
      if (inside.fetch_add(1) != 0) overlap = true;
      for (size_t u = first; u < end; ++u) {
        if (!finished[u].load()) early = true;
        seen.push_back(u);
      }
      std::this_thread::yield();  // let others finish chunks meanwhile
      inside.fetch_sub(1);
    };
    std::vector<std::thread> threads;
    for (size_t t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (size_t i = t; i < kChunks; i += kThreads) {
          const size_t c = order[i];
          if (c == held) continue;
          finished[c] = true;
          in_order.Finish(c, step);
        }
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_FALSE(overlap);
    EXPECT_FALSE(early);
    std::vector<size_t> want(held);
    std::iota(want.begin(), want.end(), size_t{0});
    EXPECT_EQ(seen, want);
    EXPECT_EQ(in_order.stepped(), held);
  }
}

TEST(InOrderTest, OneThreadStepsEachChunkAtOnceInOrder) {
  bf16::InOrder in_order(3);
  std::vector<std::pair<size_t, size_t>> steps;
  const auto step = [&](size_t first, size_t end) { steps.emplace_back(first, end); };
  in_order.Finish(1, step);  // waits for 0
  EXPECT_TRUE(steps.empty());
  in_order.Finish(0, step);  // 0 and 1 in one run
  in_order.Finish(2, step);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0], std::make_pair(size_t{0}, size_t{2}));
  EXPECT_EQ(steps[1], std::make_pair(size_t{2}, size_t{3}));
  EXPECT_EQ(in_order.stepped(), 3u);
}

}  // namespace
}  // namespace deltasync
