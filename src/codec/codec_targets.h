// The codec's hot writers compiled twice (internal to src/codec): once for
// baseline x86-64 and once more with AVX2, BMI1/2 and FMA (x86-64-v3 less
// LZCNT and MOVBE, which not every compiler's __builtin_cpu_supports names):
// shifts by a register without a move to cl (shlx/shrx), bzhi, andn. The
// second runs where the CPU has them. Both copies are the same source (an
// inline body that two wrappers compile under different targets), so they
// write the same bytes; tests run both on one CPU through AllowCodecBmi2.
// The Rice writer has a third copy with AVX-512 (its codes computed eight at
// a time); AllowCodecAvx512 and ForEachCodecCopy select it for tests.
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

// A third copy, only where a writer has a vector route (the Rice writer's
// codes, 8 at a time): the second copy's extensions and AVX-512 F, BW, DQ
// and VL.
#if DS_CODEC_HAS_BMI2
#define DS_CODEC_AVX512_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,bmi,bmi2,popcnt,fma")))
#define DS_CODEC_HAS_AVX512 1
#else
#define DS_CODEC_AVX512_TARGET
#define DS_CODEC_HAS_AVX512 0
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

// The same for the third copy: the CPU has its extensions (and the
// second's); it runs where that is so and both it and the second are
// allowed.
bool CpuHasCodecAvx512();
bool UseCodecAvx512();
void AllowCodecAvx512(bool allowed);

// Tests: calls f("baseline") with the baseline copies selected, then
// f("bmi2") with the second ones where the CPU has them, then f("avx512")
// with the third ones where it has those (writers without a third copy run
// their second again); leaves them all allowed.
template <class F>
void ForEachCodecCopy(F&& f) {
  AllowCodecBmi2(false);
  f("baseline");
  AllowCodecBmi2(true);
  AllowCodecAvx512(false);
  if (CpuHasCodecBmi2()) f("bmi2");
  AllowCodecAvx512(true);
  if (CpuHasCodecAvx512()) f("avx512");
}

}  // namespace deltasync::compact
