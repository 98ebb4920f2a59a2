// The gap_delta detect's fp32 compare (CompareF32ToBf16Gaps, simd_kernels.h)
// on CPUs with AVX-512 BW, DQ, VBMI2 and BF16 (Zen 4 and later, Sapphire
// Rapids and later): each change's gap and value packed by VPCOMPRESSW, 32
// elements a step, with no bitmap, no per-change loop and no 64-bit index
// (internal; called from the AVX-512 target of detect_gaps_kernels.cc,
// raw_kernels.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace deltasync::kernels {

// Whether this CPU has what CompareF32ToBf16GapsAvx512 needs. Always false
// off x86-64.
bool CpuHasDetectGapsAvx512();
// Whether it runs here: the CPU has it and raw kernels are allowed.
bool HasDetectGapsAvx512();

// CompareF32ToBf16Gaps (simd_kernels.h) by AVX-512: the same outputs for
// the same inputs (n <= kCompareGapsMaxElements; gaps and val_out with
// room for n + kCompareGapsSlack entries).
size_t CompareF32ToBf16GapsAvx512(const uint16_t* pub, const uint32_t* cur, size_t n, bool check_finite,
                                  uint16_t* gaps, uint16_t* val_out, size_t* last, size_t* first_bad);

}  // namespace deltasync::kernels
