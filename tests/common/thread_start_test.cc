// ParallelFor / ParallelForAhead when the system refuses to start a thread
// part way (std::thread throwing std::system_error, EAGAIN): the already
// started threads used to be destroyed joinable (std::terminate); now the
// tasks run on the threads that did start, each exactly once. The refusal is
// the test hook of common/thread_start.h (RLIMIT_NPROC does not bind root).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "common/parallel.h"
#include "common/thread_start.h"

namespace deltasync {
namespace {

struct RefuseThreadStarts {
  explicit RefuseThreadStarts(int after) { FailThreadStartsAfterForTesting(after); }
  ~RefuseThreadStarts() { FailThreadStartsAfterForTesting(-1); }
};

TEST(ThreadStart, ParallelForRunsEveryTaskOnceWhenAThreadCannotStart) {
  for (int after : {0, 1, 2}) {
    constexpr size_t kTasks = 1000;
    std::vector<std::atomic<int>> runs(kTasks);
    std::vector<std::thread::id> by(kTasks);
    {
      RefuseThreadStarts refuse(after);
      ParallelFor(kTasks, 4, [&](size_t i) {
        runs[i].fetch_add(1);
        by[i] = std::this_thread::get_id();
      });
    }
    for (size_t i = 0; i < kTasks; ++i) ASSERT_EQ(runs[i].load(), 1) << "task " << i << ", after " << after;
    std::vector<std::thread::id> threads(by.begin(), by.end());
    std::sort(threads.begin(), threads.end());
    threads.erase(std::unique(threads.begin(), threads.end()), threads.end());
    EXPECT_LE(threads.size(), static_cast<size_t>(after) + 1) << "threads past the refused start ran";
  }
}

TEST(ThreadStart, ParallelForAheadRunsEveryTaskOnceWhenAThreadCannotStart) {
  constexpr size_t kTasks = 500;
  std::vector<std::atomic<int>> runs(kTasks);
  {
    RefuseThreadStarts refuse(1);
    ParallelForAhead(kTasks, 4, [&](size_t i, size_t next) {
      EXPECT_GT(next, i);
      runs[i].fetch_add(1);
    });
  }
  for (size_t i = 0; i < kTasks; ++i) ASSERT_EQ(runs[i].load(), 1) << "task " << i;
}

TEST(ThreadStart, TheHookCountsStartsAndStops) {
  std::vector<std::thread> pool;
  pool.reserve(3);
  {
    RefuseThreadStarts refuse(1);
    EXPECT_TRUE(TryStartThread(pool, [] {}));
    EXPECT_FALSE(TryStartThread(pool, [] {}));
    EXPECT_FALSE(TryStartThread(pool, [] {}));
  }
  EXPECT_TRUE(TryStartThread(pool, [] {}));
  EXPECT_EQ(pool.size(), 2u);
  for (std::thread& t : pool) t.join();
}

}  // namespace
}  // namespace deltasync
