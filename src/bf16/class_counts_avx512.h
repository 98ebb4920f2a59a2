// kernels::ClassCountsBytes16 on CPUs with AVX-512 VBMI, GFNI and BITALG
// (Ice Lake and later, Zen 4 and later): the counting pass's cost no longer
// grows with the classes counted (internal; called from the AVX-512 target
// of class_count_kernels.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace deltasync::kernels {

// Whether this CPU has what ClassCountsBytes16Avx512 needs (AVX-512
// F/BW/VL/VBMI, GFNI, BITALG and BMI2). Always false off x86-64.
bool CpuHasClassCountsAvx512();
// Whether it runs here: the CPU has it and raw kernels are allowed
// (raw_kernels.h).
bool HasClassCountsAvx512();

// ClassCountsBytes16's contract (simd_kernels.h), same results: per block b
// of 1024 of the n elements, counts[16 b + c] = the block's elements of
// class c for each c set in `classes`, 0 for the others; bytes[i] = element
// i's class for i < n, then 0xFF up to a multiple of 64 (`bytes` 64-byte
// aligned). Only where HasClassCountsAvx512().
void ClassCountsBytes16Avx512(const uint16_t* data, size_t n, uint32_t classes, uint16_t* counts, uint8_t* bytes);

}  // namespace deltasync::kernels
