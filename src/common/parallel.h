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
// throw. When the system refuses to start a thread, the tasks run on the
// threads that did start (common/thread_start.h).
void ParallelFor(size_t n, int threads, const std::function<void(size_t)>& fn);

// ParallelFor with each thread's next task known while it runs one: calls
// fn(task, next) for every task in [0, n), spread over up to `threads`
// threads (the caller's thread is one of them). Tasks are handed out in
// ascending order from a shared counter, one ahead: a thread claims its next
// task before it runs the current one, and `next` is that claimed task (n
// when none was left), so that fn can prepare it, e.g. prefetch its data
// into this core's caches (with plain ParallelFor, task + threads is only
// likely to be the thread's next one). Each thread's tasks ascend, and the
// least unfinished task is always one a thread is running, so fn(task, ...)
// may wait for work that fn of a lower task does before any wait of its
// own (the compact walk's look-back) without deadlock. fn must not throw.
void ParallelForAhead(size_t n, int threads, const std::function<void(size_t, size_t)>& fn);

}  // namespace deltasync
