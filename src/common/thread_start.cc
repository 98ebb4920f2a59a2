#include "common/thread_start.h"

#include <atomic>

namespace deltasync {
namespace {
std::atomic<int> g_fail_after{-1};
}  // namespace

void FailThreadStartsAfterForTesting(int after) { g_fail_after.store(after); }

bool ThreadStartRefusedForTesting() {
  int left = g_fail_after.load(std::memory_order_relaxed);
  while (left > 0) {
    if (g_fail_after.compare_exchange_weak(left, left - 1)) return false;
  }
  return left == 0;
}

}  // namespace deltasync
