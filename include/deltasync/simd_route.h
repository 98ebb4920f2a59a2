// Which SIMD route this process's bf16 kernels take. A speed figure means
// little without it: the same build runs raw AVX-512 kernels on one x86 CPU
// and AVX2 on another (docs/benchmarks.md compares hosts by it).
#pragma once

#include <string>

namespace deltasync {

// The target the kernels dispatch to now: Highway's name for it ("AVX3",
// "AVX2", "SSE4", "NEON", "SVE2", ...), with "-no-raw" where AVX3 would run
// its raw AVX-512 kernels on this CPU but they are turned off (tests and
// benchmarks that compare routes).
std::string SimdRouteName();

}  // namespace deltasync
