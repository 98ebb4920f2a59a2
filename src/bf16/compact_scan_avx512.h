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

// Words of a block (1024 elements) and the classes ScanBlockAvx512 counts;
// room past a block's changes that its per-change outputs need (scratch
// written past the count).
inline constexpr size_t kScanBlockWords = 16;
inline constexpr size_t kScanWordClasses = 16;
inline constexpr size_t kScanOffsetsSlack = 64;

// Where ScanBlockAvx512 leaves a block's results. With w = 0 ..
// ceil(len / 64) - 1 the block's words and h < the block's changes (in
// element order):
//  - words[w] bit k = element 64 w + k changed (new != base);
//  - seen_end[c] = seen_in[c] + the block's class-c elements;
//  - indices[h] = index_base + the offset of change h in the block;
//  - classes[h] = compact::ClassOf of its base value (c), ranks[h] =
//    seen_in[c] + the block's class-c elements before it; diffs[h] =
//    compact::DiffByte(base, new) (kEscape where it must be escaped);
//  - old_values[h] = its base value, new_values[h] = its new bf16 value.
// Every output is written in whole vectors past the count: ranks, indices,
// classes, diffs and new_values are scratch with room for len +
// kScanOffsetsSlack entries, and old_values (which may be the caller's own
// run) needs room for kScanOffsetsSlack entries past the block's changes
// (written there, overwritten by what comes next).
struct ScanBlockOut {
  uint64_t* words = nullptr;
  uint64_t* seen_end = nullptr;
  uint64_t* ranks = nullptr;
  uint64_t* indices = nullptr;
  uint64_t index_base = 0;
  uint8_t* classes = nullptr;
  uint8_t* diffs = nullptr;
  uint16_t* old_values = nullptr;
  uint16_t* new_values = nullptr;
};

// Pass 1 of ScanCompactSpan over one block of len <= 1024 elements: the
// base's bf16 bits at pub, the new values at cur (fp32 bit patterns where
// f32, else bf16: rounded as bf16::RoundFp32ToBf16), any alignment. Fills
// `out` (above), sets *changed to the block's changes and **stores each
// change's new value into pub** (the caller puts old_values back where it
// refuses the block). Returns the offset of the first new value that is Inf
// or NaN, len where none is. Where ahead.cur is not null, also prefetches a
// block's lines ahead, word w's share of them (PrefetchWordShare,
// prefetch.h) with word w.
struct ScanBlockAhead {
  const uint8_t* cur = nullptr;  // null: no prefetch
  size_t elem_size = 0;
  const uint8_t* pub = nullptr;
};
size_t ScanBlockAvx512(uint16_t* pub, const void* cur, bool f32, size_t len, const uint64_t* seen_in,
                       const ScanBlockAhead& ahead, const ScanBlockOut& out, size_t* changed);

}  // namespace deltasync::kernels
