// The codec's hot writers compiled twice (internal to src/codec): once for
// baseline x86-64 and once more with AVX2, BMI1/2 and FMA (x86-64-v3 less
// LZCNT and MOVBE, which not every compiler's __builtin_cpu_supports names):
// shifts by a register without a move to cl (shlx/shrx), bzhi, andn. The
// second runs where the CPU has them. Both copies are the same source (an
// inline body that two wrappers compile under different targets), so they
// write the same bytes; tests run both on one CPU through AllowCodecBmi2.
#pragma once

// The extensions of the second copy, as a function attribute. Feature names,
// not "arch=": GCC inlines a plain function into one with more features but
// not into one of another arch, and the bodies inline their helpers.
#if defined(__x86_64__) && defined(__GNUC__)
#define DS_CODEC_BMI2_TARGET __attribute__((target("avx2,bmi,bmi2,popcnt,fma")))
#define DS_CODEC_HAS_BMI2 1
#else
#define DS_CODEC_BMI2_TARGET
#define DS_CODEC_HAS_BMI2 0
#endif

// A body or helper that must be inlined into each wrapper (so that the
// second wrapper compiles it with its extensions).
#define DS_CODEC_INLINE inline __attribute__((always_inline))

namespace deltasync::compact {

// Whether the CPU has the second copy's extensions.
bool CpuHasCodecBmi2();
// Whether the writers run their second copies: the CPU has the extensions
// and they are allowed (by default; a test may turn them off). One relaxed
// load.
bool UseCodecBmi2();
// Tests: false runs the baseline copies everywhere (same bytes either way).
void AllowCodecBmi2(bool allowed);

// Tests: calls f("baseline") with the baseline copies selected, then
// f("bmi2") with the second ones where the CPU has them; leaves them allowed.
template <class F>
void ForEachCodecCopy(F&& f) {
  AllowCodecBmi2(false);
  f("baseline");
  AllowCodecBmi2(true);
  if (CpuHasCodecBmi2()) f("bmi2");
}

}  // namespace deltasync::compact
