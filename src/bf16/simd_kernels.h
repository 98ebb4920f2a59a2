// SIMD kernels of change detection and the state hash (internal).
//
// Each kernel is compiled for several x86 targets (SSSE3, SSE4, AVX2,
// AVX-512) and for a portable fallback (Highway's one-lane HWY_SCALAR, or
// EMU128 with GCC >= 12.3); the first call picks the best target this CPU
// supports (Highway dynamic dispatch), so one binary runs on any x86-64.
// Every target returns bit-identical results: they are tested against each
// other and against the scalar definitions.
//
// The kernels are single-threaded and work on one span of one tensor; the
// callers (detect.cc, state_hash.cc) split tensors into chunks and spread the
// chunks over threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace deltasync::kernels {

// --- fp32 -> bf16 --------------------------------------------------------

// Rounds n fp32 bit patterns to bf16 as bf16::RoundFp32ToBf16 does.
void ConvertF32ToBf16(const uint32_t* src, uint16_t* dst, size_t n);

// The same, and returns the offset of the first element whose bf16 result is
// Inf or NaN (finite fp32 above the bf16 range rounds to Inf), or n if none.
// dst is fully written either way.
size_t ConvertF32ToBf16Checked(const uint32_t* src, uint16_t* dst, size_t n);

// --- finiteness -----------------------------------------------------------

// Offset of the first element with every bit of `exp_mask` set (the IEEE
// exponent field all ones: Inf or NaN), or n if none.
size_t FindNonFinite16(const uint16_t* data, size_t n, uint16_t exp_mask);
size_t FindNonFinite32(const uint32_t* data, size_t n, uint32_t exp_mask);
size_t FindNonFinite64(const uint64_t* data, size_t n, uint64_t exp_mask);

// --- change detection -----------------------------------------------------

// Extra output room the Compare kernels need beyond n elements: they emit
// changes with unconditional stores and may write scratch values just past
// the real count.
inline constexpr size_t kCompareOutputSlack = 8;

// Compares n elements of `cur` with `pub`. For every offset k where they
// differ, in ascending order, writes base + k to idx_out and cur[k] to
// val_out, and returns how many it wrote: callers give both outputs room for
// n + kCompareOutputSlack elements.
//
// exp_mask == 0: no finiteness check; *first_bad = n.
// exp_mask != 0: *first_bad = offset of the first element of `cur` that is
// non-finite under exp_mask (see FindNonFinite), or n. When it is < n the
// outputs are unspecified (the caller reports an error instead).
size_t Compare8(const uint8_t* pub, const uint8_t* cur, size_t n, uint64_t base, uint64_t* idx_out,
                uint8_t* val_out);
size_t Compare16(const uint16_t* pub, const uint16_t* cur, size_t n, uint64_t base,
                 uint16_t exp_mask, uint64_t* idx_out, uint16_t* val_out, size_t* first_bad);
size_t Compare32(const uint32_t* pub, const uint32_t* cur, size_t n, uint64_t base,
                 uint32_t exp_mask, uint64_t* idx_out, uint32_t* val_out, size_t* first_bad);
size_t Compare64(const uint64_t* pub, const uint64_t* cur, size_t n, uint64_t base,
                 uint64_t exp_mask, uint64_t* idx_out, uint64_t* val_out, size_t* first_bad);

// As Compare16, with `cur` fp32 rounded to bf16 first (values written are the
// rounded bf16). check_finite checks the rounded value.
size_t CompareF32ToBf16(const uint16_t* pub, const uint32_t* cur, size_t n, uint64_t base,
                        bool check_finite, uint64_t* idx_out, uint16_t* val_out, size_t* first_bad);

// The gap_delta detect's compare (DetectAndEncodeGapDelta): as
// CompareF32ToBf16 with base 0, but for each change writes to gaps its
// offset minus the offset of the change before minus 1 (the first change's
// gap is its offset), and *last = the last change's offset (when any).
// n <= kCompareGapsMaxElements, so every gap fits 16 bits; gaps and val_out
// need room for n + kCompareGapsSlack entries (written past the count).
// check_finite as CompareF32ToBf16's: when *first_bad < n the outputs are
// unspecified.
inline constexpr size_t kCompareGapsMaxElements = size_t{1} << 16;
inline constexpr size_t kCompareGapsSlack = 32;
size_t CompareF32ToBf16Gaps(const uint16_t* pub, const uint32_t* cur, size_t n, bool check_finite, uint16_t* gaps,
                            uint16_t* val_out, size_t* last, size_t* first_bad);

// --- state hash (terms defined in hash_term.h) ----------------------------

// Adds sum_{k<n} ElementTerm(lane, seed[lane], base + k, data[k]) to
// sums[lane], mod 2^64, for both lanes.
void HashElements8(const uint8_t* data, size_t n, uint64_t base, const uint64_t seed[2],
                   uint64_t sums[2]);
void HashElements16(const uint16_t* data, size_t n, uint64_t base, const uint64_t seed[2],
                    uint64_t sums[2]);
void HashElements32(const uint32_t* data, size_t n, uint64_t base, const uint64_t seed[2],
                    uint64_t sums[2]);
void HashElements64(const uint64_t* data, size_t n, uint64_t base, const uint64_t seed[2],
                    uint64_t sums[2]);

// Adds sum_{k<n} ElementTerm(index[k], new_bits[k]) - ElementTerm(index[k],
// old_bits[k]) to sums[lane], for both lanes.
void HashTermDiffs(const uint64_t* index, const uint64_t* new_bits, const uint64_t* old_bits,
                   size_t n, const uint64_t seed[2], uint64_t sums[2]);
// The same for 16-bit elements (bf16, f16) read as little-endian bytes,
// 2 per element, at any alignment: the gap_delta apply passes the patch's
// values and its undo log as they lie, without widening them to 64 bits.
void HashTermDiffs16(const uint64_t* index, const uint8_t* new_bits, const uint8_t* old_bits, size_t n,
                     const uint64_t seed[2], uint64_t sums[2]);
// HashTermDiffs16 with element k at index base + offset[k]: the compact
// apply's undo log keeps 4-byte positions from the start of a chunk.
void HashTermDiffs16At(uint64_t base, const uint32_t* offset, const uint8_t* new_bits, const uint8_t* old_bits,
                       size_t n, const uint64_t seed[2], uint64_t sums[2]);

// --- compressed anchors: byte planes -------------------------------------

// Joins n bf16 elements from their byte planes (codec/compact_anchor.cc):
// element k's bits are (sign_mantissa[k] & 0x80) << 8 | exps[k] << 7 |
// (sign_mantissa[k] & 0x7F), written little-endian to dst[2k], dst[2k + 1].
// exps may be dst + n exactly (the plane decoded into the output's upper
// half, joined in place): elements are joined in ascending order and each is
// read before anything at or after it is written. Any other overlap is not
// allowed.
void JoinBf16Planes(const uint8_t* exps, const uint8_t* sign_mantissa, uint8_t* dst, size_t n);
// The inverse: n elements at src (little-endian, 2 bytes each) into their
// exponent bytes (bits 7-14) and sign+mantissa bytes (bit 15 as bit 7,
// bits 0-6). No overlap between the three.
void SplitBf16Planes(const uint8_t* src, uint8_t* exps, uint8_t* sign_mantissa, size_t n);

// --- compact codec: exponent classes --------------------------------------

// The compact decoder's walk (codec/compact_walk.cc): a chunk's class counts
// first, then per block of n <= 1024 base elements holding changes, the
// masks of only the classes with a change in it, then the changes placed:
//  - ClassCountsBytes16: per block b of 1024 of the n elements (the last
//    may be shorter), counts[16 b + c] = the block's elements of exponent
//    class c (compact::ClassOf) for each c whose bit is set in `classes`, 0
//    for the others; and bytes[i] = element i's class for i < n, then 0xFF
//    up to a multiple of 64 (`bytes` 64-byte aligned).
//  - ClassMasksOfBytes16: for the block whose class bytes (n <= 1024 of
//    them, from ClassCountsBytes16, at a multiple of 64) are at `bytes`, for
//    each exponent class c whose bit is set in `classes`, in ascending
//    order, slot by slot: masks[16 s + w] = which of the elements of word w
//    (64 elements; past n none) are of class c, and before[17 s + w] = the
//    class's elements in words [0, w), for w in [0, 16] (so
//    before[17 s + 16] is the block's total).
//  - ClassPlace16 (class_place_kernels.cc): from those, per class c in `classes`: cur.rem[c]
//    class-c elements are skipped before change cur.g[c]; that change's
//    element (offset i in the block) gets its bit in hits (16 words, all
//    written) and its new value in values[i]: base + UnZigZag(diff) for
//    its diff byte s.diffs[g], or for an escape (0xFF) the raw
//    s.escapes[cur.e[c]++] (u16 LE). Then ++g and rem = s.ranks[g] -
//    s.ranks[g - 1] - 1 (the gap to the class's next change; ranks
//    strictly ascending within a class, below 2^63; read from s.ranks32
//    instead where that is set, s.ranks then null), or ~0 once g reaches
//    s.end[c]. The cursors carry over to the next block; a rem of ~0 stays
//    ~0. Returns the smallest offset whose change code is not canonical
//    (compact::DiffByte(base, new) != diff: an escape where a diff fits,
//    or a diff into another sign or a non-finite value), else n.
struct ClassWalkStreams {
  const uint64_t* ranks;
  const uint32_t* ranks32;  // the same ranks, 32-bit (a tensor of at most 2^32 elements)
  const uint64_t* end;     // per class: one past its last change
  const uint8_t* diffs;
  const uint8_t* escapes;
};
struct ClassWalkCursor {
  uint64_t rem[16], g[16], e[16];
};
void ClassCountsBytes16(const uint16_t* data, size_t n, uint32_t classes, uint16_t* counts, uint8_t* bytes);
void ClassMasksOfBytes16(const uint8_t* bytes, size_t n, uint32_t classes, uint64_t* masks, uint32_t* before);
size_t ClassPlace16(const uint64_t* masks, const uint32_t* before, uint32_t classes, const uint16_t* data, size_t n,
                    const ClassWalkStreams& s, ClassWalkCursor& cur, uint64_t* hits, uint16_t* values);
//  - ClassPlaceApply16: ClassPlace16's walk, but each change's new value is
//    written into data[i] itself (the block's own elements, each at most
//    once, read before it is written) and, in class order, change h of the
//    block logs out.undo_pos[h] = out.index0 + i, out.undo_old[h] = the old
//    value, and out.h_new[h] = the new value (the hash inputs are undo_pos,
//    h_new and undo_old: HashTermDiffs16At). *placed = the changes placed,
//    every one logged whether canonical or not. Same return value.
struct ClassApplyOut {
  uint32_t index0;     // the block's first element, from the start of its chunk (chunks: <= 2^32 elements)
  uint32_t* undo_pos;  // n each, at least
  uint16_t* undo_old;
  uint16_t* h_new;
};
size_t ClassPlaceApply16(const uint64_t* masks, const uint32_t* before, uint32_t classes, uint16_t* data, size_t n,
                         const ClassWalkStreams& s, ClassWalkCursor& cur, const ClassApplyOut& out, size_t* placed);

//  - ClassPlaceDecode16: ClassPlace16's walk with the decode's outputs
//    written in element order instead of hits and values by offset: the
//    block's changes, ascending by offset i, as out.indices[j] =
//    out.index0 + i, out.values[2 j..2 j + 2) = the new value (u16 LE) and
//    out.side[j] = the old one (data[i]); *placed = their count. Written
//    whether the return (ClassPlace16's) says a code is non-canonical or
//    not; nothing is written past the count (the slots after it can be
//    another thread's).
struct ClassDecodeOut {
  uint64_t index0;     // the block's first element in its tensor
  uint64_t* indices;   // the block's count each, at least
  uint8_t* values;     // u16 LE
  uint16_t* side;
};
size_t ClassPlaceDecode16(const uint64_t* masks, const uint32_t* before, uint32_t classes, const uint16_t* data,
                          size_t n, const ClassWalkStreams& s, ClassWalkCursor& cur, const ClassDecodeOut& out,
                          size_t* placed);

//  - HitOffsets16: the offsets of the set bits of a block's 16 hit words
//    (ClassPlace16's hits), ascending, into `out`, which has room for
//    their count + kHitOffsetsSlack (written past the count: scratch);
//    returns the count.
inline constexpr size_t kHitOffsetsSlack = 4;
size_t HitOffsets16(const uint64_t* hits, uint16_t* out);

// --- targets (tests and benchmarks) ----------------------------------------

// The target the kernels dispatch to now, e.g. "AVX3", "AVX2", "EMU128";
// "AVX3-no-raw" where AVX3 would run raw-intrinsics kernels on this CPU
// but they are off (raw_kernels.h).
std::string ActiveTargetName();
// Every compiled target this CPU supports, best first, each that would run
// raw kernels here followed by itself with them off ("AVX3", "AVX3-no-raw",
// "AVX2", ...), so that tests looping over them cover both routes.
std::vector<std::string> SupportedTargetNames();
// Restricts dispatch to the named target (one of SupportedTargetNames());
// "" lifts the restriction (and turns raw kernels back on). False if the
// name is unknown. For tests and benchmarks: not thread-safe against
// concurrent kernel calls.
bool UseOnlyTarget(std::string_view name);

}  // namespace deltasync::kernels
