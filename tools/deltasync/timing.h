// Wall-clock timing for the benchmark commands: best of several runs, the
// least disturbed one on a shared, noisy machine.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

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

// The median of v (the mean of the middle two for an even count; 0 when
// empty): a figure of repeated runs less moved by one disturbed run than
// the mean.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
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

// This process's CPU seconds (all its threads, live and joined): a stage
// timed by it leaves out the time slices its threads lost to other work on
// a shared machine, which wall time counts.
inline double ProcessCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// A stage timed in turns with a reference (memcpy of the model): the ratio
// of the reference's time to the stage's, from rounds in which both ran
// back to back and so saw the same state of a host whose speed drifts over
// minutes.
struct PairedTimes {
  double ref_best = 0;      // the best of the reference's rounds (s)
  double fn_best = 0;       // the best of the stage's rounds (s)
  double ratio_median = 0;  // the median over rounds of ref / fn
  double ratio_best = 0;    // ref_best / fn_best
  // The median over rounds of ref / fn in process CPU seconds
  // (PairedSeconds only): on a loaded host, where the threads of both wait
  // for a core, the steadier ratio. Where the stage leaves a thread idle
  // (a serial part) and the host is quiet, it is above the wall ratio.
  double cpu_ratio_median = 0;
};

// PairedTimes from the rounds' times: ref_s[r] and fn_s[r] ran in round r.
// Both non-empty, of the same size; the median of an even count is the
// mean of the middle two.
inline PairedTimes PairRatios(const std::vector<double>& ref_s, const std::vector<double>& fn_s) {
  std::vector<double> ratios;
  for (size_t r = 0; r < ref_s.size() && r < fn_s.size(); ++r) ratios.push_back(ref_s[r] / fn_s[r]);
  std::sort(ratios.begin(), ratios.end());
  const size_t n = ratios.size();
  PairedTimes p;
  p.ref_best = *std::min_element(ref_s.begin(), ref_s.end());
  p.fn_best = *std::min_element(fn_s.begin(), fn_s.end());
  p.ratio_median = n % 2 ? ratios[n / 2] : 0.5 * (ratios[n / 2 - 1] + ratios[n / 2]);
  p.ratio_best = p.ref_best / p.fn_best;
  return p;
}

// Times `ref` then `fn` in each of `rounds` (>= 1) rounds, in wall and in
// process CPU seconds.
inline PairedTimes PairedSeconds(int rounds, const std::function<void()>& ref, const std::function<void()>& fn) {
  std::vector<double> ref_s, fn_s, ref_cpu, fn_cpu;
  for (int r = 0; r < std::max(1, rounds); ++r) {
    const double c0 = ProcessCpuSeconds();
    ref_s.push_back(Seconds(ref));
    const double c1 = ProcessCpuSeconds();
    fn_s.push_back(Seconds(fn));
    const double c2 = ProcessCpuSeconds();
    ref_cpu.push_back(std::max(c1 - c0, 1e-9));
    fn_cpu.push_back(std::max(c2 - c1, 1e-9));
  }
  PairedTimes p = PairRatios(ref_s, fn_s);
  p.cpu_ratio_median = PairRatios(ref_cpu, fn_cpu).ratio_median;
  return p;
}

}  // namespace deltasync::cli
