// Starting worker threads without std::terminate when the system refuses one.
//
// std::thread's constructor throws std::system_error (EAGAIN: the process's
// thread or memory limit) and a pool that lets it escape destroys its
// already started, joinable threads, which calls std::terminate. Pools that
// share their work through a counter or split it into ranges can instead go
// on with the threads that did start (the caller's thread is always one):
// the same result, slower.
#pragma once

#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace deltasync {

// Test hook: makes thread starts fail as if the system refused them, from the
// `after`-th next start (0: the next one) on; -1 (the default) stops it. Only
// TryStartThread asks it. Not for production use.
void FailThreadStartsAfterForTesting(int after);
// Whether this start is to fail (FailThreadStartsAfterForTesting).
bool ThreadStartRefusedForTesting();

// Starts a thread running f() and appends it to `pool`; false, `pool`
// unchanged, when the system refuses to start one. REQUIRES:
// pool.capacity() > pool.size() (reserve first: no reallocation may throw).
template <typename F>
bool TryStartThread(std::vector<std::thread>& pool, F&& f) {
  if (ThreadStartRefusedForTesting()) return false;
  try {
    pool.emplace_back(std::forward<F>(f));
    return true;
  } catch (const std::system_error&) {
    return false;
  }
}

}  // namespace deltasync
