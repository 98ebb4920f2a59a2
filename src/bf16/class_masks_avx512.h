// The compact decoder walk's per-block class masks of every class at once,
// straight from the base (internal to src/bf16; session 36): on CPUs with
// AVX-512 VBMI, GFNI, BITALG (class_counts_avx512.h's set) and VPOPCNTDQ
// (Ice Lake and later, Zen 4 and later) the walk no
// longer builds each needed class's masks from the chunk's class bytes
// (ClassMasksOfBytes16: a compare, a move, a store, a popcount and an add
// per class and word) but all 16 classes' masks and running counts of a
// block in one pass over its base elements (already in L1 for the
// placing): per word the class bytes' one-hot bits transposed into 16
// masks (ClassMasks64), four 8 x 8 transposes of u64 lanes into class
// order, and per class one prefix sum of its 16 words' counts.
#pragma once

#include <cstddef>
#include <cstdint>

namespace deltasync::kernels {

// Whether this CPU has what ClassMasksAll16Avx512 needs:
// CpuHasClassCountsAvx512()'s extensions and VPOPCNTDQ. Always false off
// x86-64.
bool CpuHasClassMasksAvx512();

// For the block of n <= 1024 bf16 elements at data, every class c in
// 0..15: masks[16 c + w] = which of the elements of word w (64 elements;
// past n none) are of class c (compact::ClassOf), and before[17 c + w] =
// the class's elements in words [0, w), for w in [0, 16] (so
// before[17 c + 16] is the block's total). ClassMasksOfBytes16's layout
// with every class asked for (simd_kernels.h), so ClassPlace16 and
// ClassPlaceApply16 take it with classes = 0xFFFF. `masks` 64-byte
// aligned; nothing past data[n - 1] is read (masked loads).
// Only where CpuHasClassMasksAvx512().
void ClassMasksAll16Avx512(const uint16_t* data, size_t n, uint64_t* masks, uint32_t* before);

// Whether the compact walk uses ClassMasksAll16Avx512 here: the Highway
// target the kernels dispatch to is AVX3 or better, the raw counting pass
// runs on it (HasClassCountsAvx512(): the CPU has it and raw kernels are
// allowed) and the CPU has VPOPCNTDQ too. Elsewhere the walk keeps ClassMasksOfBytes16 for the
// classes with a change in a block. (class_masks_kernels.cc)
bool UseClassMasksAll16();

}  // namespace deltasync::kernels
