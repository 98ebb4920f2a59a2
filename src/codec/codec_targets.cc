// The writers' copy selection (codec_targets.h).
#include "codec/codec_targets.h"

#include <atomic>

namespace deltasync::compact {
namespace {

std::atomic<bool> g_allowed{true};
std::atomic<bool> g_avx512_allowed{true};

}  // namespace

bool CpuHasCodecBmi2() {
#if DS_CODEC_HAS_BMI2
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") &&
                          __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("popcnt") &&
                          __builtin_cpu_supports("fma");
  return has;
#else
  return false;
#endif
}

bool UseCodecBmi2() { return g_allowed.load(std::memory_order_relaxed) && CpuHasCodecBmi2(); }

void AllowCodecBmi2(bool allowed) { g_allowed.store(allowed, std::memory_order_relaxed); }

#if DS_CODEC_HAS_AVX512
bool CpuHasCodecAvx512() {
  // The third copy's extensions are the second's and AVX-512 F, BW, DQ, VL.
  static const bool has = CpuHasCodecBmi2() && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
}
#else
bool CpuHasCodecAvx512() { return false; }
#endif

bool UseCodecAvx512() {
  return g_allowed.load(std::memory_order_relaxed) && g_avx512_allowed.load(std::memory_order_relaxed) &&
         CpuHasCodecAvx512();
}

void AllowCodecAvx512(bool allowed) { g_avx512_allowed.store(allowed, std::memory_order_relaxed); }

}  // namespace deltasync::compact
