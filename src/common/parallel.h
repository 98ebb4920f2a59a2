// ParallelFor: run a function over [0, n) on a few threads (internal).
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <thread>
#include <vector>

namespace deltasync {

// 0 or less means std::thread::hardware_concurrency() (at least 1).
inline int ResolveThreads(int threads) {
  if (threads > 0) return threads;
  unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

// Calls fn(task) for every task in [0, n), spread over up to `threads`
// threads (the caller's thread is one of them). Tasks are handed out in
// ascending order from a shared counter, so uneven tasks balance. fn must not
// throw.
void ParallelFor(size_t n, int threads, const std::function<void(size_t)>& fn);

}  // namespace deltasync
