// Wall-clock timing for the benchmark commands: best of several runs, the
// least disturbed one on a shared, noisy machine.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>

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

}  // namespace deltasync::cli
