// Kernels written with raw x86 intrinsics beside Highway's dispatch
// (internal to src/bf16): code for CPU extensions that Debian's Highway 1.0
// has no target for (class_counts_avx512.h, compact_scan_avx512.h). Each runs
// inside a Highway target at or above AVX3, only where the CPU has its
// extensions and the tests have not turned raw kernels off; otherwise that
// target runs its Highway code, with the same results.
//
// So that both routes are tested on the same CPU, SupportedTargetNames()
// lists, after each target that would run a raw kernel here, the same
// target with them off ("AVX3-no-raw"), which UseOnlyTarget() selects
// (simd_kernels.h).
#pragma once

#include <cstdint>
#include <string>

namespace deltasync::kernels {

// The suffix of a target name whose raw kernels are off.
inline constexpr const char* kNoRawSuffix = "-no-raw";

// Whether raw kernels may run (true unless turned off for a test or
// benchmark through UseOnlyTarget). Cheap: one relaxed atomic load.
bool RawKernelsAllowed();
void AllowRawKernels(bool allowed);

// Whether the Highway target `target` (an HWY_* value) on this CPU would
// run at least one raw kernel, were they allowed.
bool TargetRunsRawKernels(int64_t target);

}  // namespace deltasync::kernels
