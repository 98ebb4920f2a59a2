#include "common/parallel.h"

#include <atomic>

#include "common/thread_start.h"

namespace deltasync {
namespace {

// `run` on `workers` threads at once, the caller's one of them; on fewer when
// the system refuses to start more (thread_start.h: every task still runs once).
void RunOnWorkers(size_t workers, const std::function<void()>& run) {
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (size_t w = 1; w < workers && TryStartThread(pool, run); ++w) {
  }
  run();
  for (std::thread& t : pool) t.join();
}

}  // namespace

void ParallelFor(size_t n, int threads, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  size_t workers = std::min<size_t>(static_cast<size_t>(ResolveThreads(threads)), n);
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  auto run = [&] {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  RunOnWorkers(workers, run);
}

void ParallelForAhead(size_t n, int threads, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  size_t workers = std::min<size_t>(static_cast<size_t>(ResolveThreads(threads)), n);
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i, i + 1);
    return;
  }
  std::atomic<size_t> next{0};
  auto run = [&] {
    size_t i = next.fetch_add(1);
    while (i < n) {
      const size_t after = std::min(next.fetch_add(1), n);
      fn(i, after);
      i = after;
    }
  };
  RunOnWorkers(workers, run);
}

}  // namespace deltasync
