// Raw-kernel switches (raw_kernels.h).
#include "bf16/raw_kernels.h"

#include <hwy/targets.h>

#include <atomic>

#include "bf16/class_counts_avx512.h"
#include "bf16/detect_gaps_avx512.h"

namespace deltasync::kernels {
namespace {
std::atomic<bool> g_allowed{true};
}  // namespace

bool RawKernelsAllowed() { return g_allowed.load(std::memory_order_relaxed); }

void AllowRawKernels(bool allowed) { g_allowed.store(allowed, std::memory_order_relaxed); }

bool TargetRunsRawKernels(int64_t target) {
#if HWY_ARCH_X86_64
  // Highway's x86 targets: a smaller value is a better target; every one at
  // or above AVX3 calls the raw kernels (compact_scan_kernels.cc,
  // class_count_kernels.cc, detect_gaps_kernels.cc).
  // (CpuHasCompactScanAvx512() needs a superset of CpuHasClassCountsAvx512().)
  return target <= HWY_AVX3 && (CpuHasClassCountsAvx512() || CpuHasDetectGapsAvx512());
#else
  (void)target;
  return false;
#endif
}

}  // namespace deltasync::kernels
