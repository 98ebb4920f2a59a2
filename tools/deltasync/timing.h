// Wall-clock timing for the benchmark commands: best of several runs, the
// least disturbed one on a shared, noisy machine.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>

#include <time.h>

namespace deltasync::cli {

inline double Seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The best of `reps` timed calls of fn; `between` (untimed) runs after each.
inline double BestSeconds(int reps, const std::function<void()>& fn, const std::function<void()>& between = {}) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    best = std::min(best, Seconds(fn));
    if (between) between();
  }
  return best;
}

// This thread's CPU seconds: a one-thread stage timed by it leaves out the
// time slices the scheduler gave to other work on a shared machine.
inline double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The best of `reps` calls of fn (run on the calling thread) in this
// thread's CPU time.
inline double BestThreadSeconds(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = ThreadCpuSeconds();
    fn();
    best = std::min(best, ThreadCpuSeconds() - t0);
  }
  return best;
}

}  // namespace deltasync::cli
