// The fused compact scan's per-block pass (ScanCompactSpan, compact_scan.h)
// on CPUs with AVX-512 VBMI, VBMI2, GFNI, BITALG, VPOPCNTDQ and BF16 (Zen 4 and
// later, Sapphire Rapids and later): every class's mask and running count
// of each 64-element word in one pass whose cost does not grow with the
// classes present, and the fp32 rounding by VCVTNE2PS2BF16 (internal;
// called from the AVX-512 target of compact_scan_kernels.cc, raw_kernels.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace deltasync::kernels {

// Whether this CPU has what ScanBlockAvx512 needs (those of
// CpuHasClassCountsAvx512, and AVX-512 DQ, VBMI2, VPOPCNTDQ and BF16). Always false
// off x86-64.
bool CpuHasCompactScanAvx512();
// Whether it runs here: the CPU has it and raw kernels are allowed.
bool HasCompactScanAvx512();

// Words of a block (1024 elements) and the entries per word of
// ScanBlockAvx512's masks and running counts; room past a block's changes
// that its `offsets` output needs (scratch written past the count).
inline constexpr size_t kScanBlockWords = 16;
inline constexpr size_t kScanWordClasses = 16;
inline constexpr size_t kScanOffsetsSlack = 32;

// Pass 1 of ScanCompactSpan over one block of len <= 1024 elements: the
// base's bf16 bits at pub, the new values at cur (fp32 bit patterns where
// f32, else bf16), any alignment. With w = 0 .. ceil(len / 64) - 1 the
// block's words:
//  - fresh[i] = element i's new bf16 bits (bf16::RoundFp32ToBf16 of fp32)
//    for i < len;
//  - words[w] bit k = element 64 w + k changed (new != base);
//  - cls[i] = compact::ClassOf(pub[i]) for i < len, then 0xFF up to a whole
//    word (64-byte aligned);
//  - masks[16 w + c] = word w's elements of class c (bit k: element 64 w + k);
//  - seen[16 w + c] = seen_in[c] + the class-c elements of words [0, w), for
//    w up to ceil(len / 64) included (the block's end);
//  - offsets[h] = the offset of the block's h-th changed element, ascending,
//    h < *changed (room for len + kScanOffsetsSlack).
// Returns whether any new value is Inf or NaN. fresh, masks and seen are
// 64-byte aligned. Where cur_ahead is not null, also prefetches a block's
// lines ahead, word w's share of them (PrefetchWordShare, prefetch.h) with
// word w.
struct ScanBlockAhead {
  const uint8_t* cur = nullptr;  // null: no prefetch
  size_t elem_size = 0;
  const uint8_t* pub = nullptr;
};
bool ScanBlockAvx512(const uint16_t* pub, const void* cur, bool f32, size_t len, const uint64_t* seen_in,
                     const ScanBlockAhead& ahead, uint16_t* fresh, uint64_t* words, uint8_t* cls, uint64_t* masks,
                     uint64_t* seen, uint16_t* offsets, size_t* changed);

}  // namespace deltasync::kernels
