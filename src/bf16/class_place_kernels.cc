// ClassPlace16 and ClassPlaceApply16 (simd_kernels.h): the compact decoder's
// per-block select (codec/compact_walk.cc), in a tight loop per change
// (session 26 replaced session 23's ClassSelect16 / ClassApply16 with
// these: select 1.21-1.26x, apply 1.01-1.22x faster per change;
// docs/benchmarks.md):
//  - a change's canonical check without branches: a diff byte d != kEscape
//    gives new = old + UnZigZag(d) (mod 2^16), whose DiffByte is d exactly
//    unless either is non-finite, so the check is one test of bit 15 of
//    ((old & 0x7F80) + 0x80) | ((new & 0x7F80) + 0x80) (NotCanonical);
//    escapes (rare) keep compact::DiffByte; only classes 0 and 15 need
//    the test of a diff byte at all (kEdgeClasses: from classes 1-14 every
//    diff byte is canonical), so the walk of the others has none (session
//    33); the apply ORs the checks of a
//    class's changes in a block into one flag and looks for the offset only
//    where it is set (FirstNotCanonical), instead of a minimum per change;
//  - the class's ranks and diff bytes walked by pointer against the block's
//    last rank (off + total), so the loop's state stays in registers;
//  - the hits zeroed by vector stores (a 128-byte memset became `rep stos`,
//    whose start-up cost is paid per block);
//  - each class's rank and diff streams prefetched a few lines ahead per
//    block (session 30: about 10% fewer of the apply kernel's samples).
// On AVX3 targets where raw kernels may run (raw_kernels.h), both walk a
// block in two phases instead (PlaceBlockAvx512, session 34): per class 16
// ranks at once into a block list of entries, then one loop over the list,
// each change independent of the others.
// Compiled per target like the other kernels (foreach_target.h).

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "bf16/compact_scan.h"
#include "bf16/class_bytes_avx512.h"
#include "bf16/prefetch.h"
#include "bf16/raw_kernels.h"
#include "bf16/round.h"
#include "bf16/simd_kernels.h"
#include "codec/compact_bf16.h"

#ifndef DELTASYNC_CLASS_PLACE_FAST_PDEP
#define DELTASYNC_CLASS_PLACE_FAST_PDEP
namespace deltasync::kernels {
namespace {
// Whether PDEP is one fast instruction: on every x86-64 CPU with BMI2 but
// AMD's (and Hygon's) before Zen 3 (family 0x19), where it is microcoded
// (Zen 1/2 take up to hundreds of cycles).
bool PlaceFastPdep() {
#if defined(__x86_64__)
  static const bool fast = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
    const bool amd = (b == 0x68747541 && d == 0x69746E65 && c == 0x444D4163) ||  // AuthenticAMD
                     (b == 0x6F677948 && d == 0x6E65476E && c == 0x656E6975);    // HygonGenuine
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned family = ((a >> 8) & 0xF) == 0xF ? 0xF + ((a >> 20) & 0xFF) : (a >> 8) & 0xF;
    return !amd || family >= 0x19;
  }();
  return fast;
#else
  return false;
#endif
}
}  // namespace
}  // namespace deltasync::kernels
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bf16/class_place_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace deltasync::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr size_t kPlaceWords = kScanBlockElements / 64;

// Position of the r-th (0-based) set bit of x, r < popcount(x): PDEP where
// it is fast, else whole bytes skipped by their popcount and a table within
// the byte.
HWY_INLINE unsigned PlaceSelectBit(uint64_t x, uint64_t r, bool fast_pdep) {
#if HWY_TARGET <= HWY_AVX3 && !defined(HWY_DISABLE_BMI2_FMA) && (HWY_ARCH_X86_64)
  (void)fast_pdep;
  return static_cast<unsigned>(__builtin_ctzll(_pdep_u64(uint64_t{1} << r, x)));
#elif HWY_TARGET == HWY_AVX2 && !defined(HWY_DISABLE_BMI2_FMA) && (HWY_ARCH_X86_64)
  if (fast_pdep) return static_cast<unsigned>(__builtin_ctzll(_pdep_u64(uint64_t{1} << r, x)));
#else
  (void)fast_pdep;
#endif
  static constexpr auto kInByte = [] {
    std::array<std::array<uint8_t, 8>, 256> t{};
    for (int v = 0; v < 256; ++v) {
      int k = 0;
      for (int b = 0; b < 8; ++b) {
        if (v >> b & 1) t[v][k++] = static_cast<uint8_t>(b);
      }
    }
    return t;
  }();
  unsigned pos = 0;
  for (;;) {
    const uint64_t in_byte = static_cast<uint64_t>(__builtin_popcountll(x & 0xFF));
    if (r < in_byte) return pos + kInByte[x & 0xFF][r];
    r -= in_byte;
    x >>= 8;
    pos += 8;
  }
}

// Bit 15 set where old -> new, new = old + UnZigZag(d) mod 2^16 for a diff
// byte d != kEscape (|UnZigZag(d)| <= 127), is not what d codes
// (compact::DiffByte(old, new) != d): exactly where old or new is
// non-finite (exponent bits all set: adding 0x80 to them carries into bit
// 15). Otherwise both are finite and DiffByte gives d back, since a move of
// at most 127 that changes the sign bit passes through a non-finite
// value: from +0..126 down it wraps to 0xFF81..0xFFFF (NaN), from
// 0x8000..0x807F down it lands in 0x7F81..0x7FFF (NaN), and a finite
// positive value (<= 0x7F7F) cannot reach 0x8000 (nor a finite negative one
// 0x10000). So DiffByte's sign test adds nothing here
// (tests/bf16/class_place_test.cc checks every diff byte from the bases
// around both sign boundaries).
HWY_INLINE uint32_t NotCanonical(uint32_t o, uint32_t v) {
  return ((o & 0x7F80u) + 0x80u) | ((v & 0x7F80u) + 0x80u);
}

// The classes whose changes coded by a diff byte can be non-canonical: 0
// and 15. An element of classes 1-14 has exponent bits 113..126, so it lies
// in 0x3880..0x3F7F or 0xB880..0xBF7F, and a move of at most 127 (any diff
// byte but kEscape) keeps it in 0x3801..0x3FFE or 0xB801..0xBFFE: the same
// sign, finite, so NotCanonical is 0 and the kernels skip its test there
// (tests/bf16/class_place_test.cc checks every such base and diff byte).
constexpr uint32_t kEdgeClasses = 1u << 0 | 1u << 15;

// The smallest block offset among the `count` changes the apply walk just
// logged for one class (undo_pos / undo_old / h_new from `at`, diff bytes
// from dp) whose change code is not canonical, else n: the slow look that
// runs only where the class's ORed check flag says one is.
HWY_NOINLINE size_t FirstNotCanonical(const ClassApplyOut& out, size_t at, size_t count, const uint8_t* dp,
                                      size_t n) {
  size_t bad = n;
  for (size_t j = 0; j < count; ++j) {
    const uint16_t o = out.undo_old[at + j], v = out.h_new[at + j];
    const bool wrong = dp[j] == compact::kEscape ? compact::DiffByte(o, v) != dp[j] : (NotCanonical(o, v) & 0x8000u) != 0;
    if (wrong) bad = std::min(bad, static_cast<size_t>(out.undo_pos[at + j] - out.index0));
  }
  return bad;
}

// Whether class c has no change among the block's `total` elements of it;
// then its cursor skips them (a class past its last change keeps ~0).
HWY_INLINE bool SkipsBlock(ClassWalkCursor& cur, int c, uint64_t total) {
  const uint64_t r = cur.rem[c];
  if (r < total) return false;
  if (r != ~uint64_t{0}) cur.rem[c] = r - total;
  return true;
}

template <bool kApply, bool kFastPdep, typename Rank>
HWY_INLINE size_t PlaceWalk(const Rank* HWY_RESTRICT const ranks, const uint64_t* HWY_RESTRICT masks, const uint32_t* HWY_RESTRICT before, uint32_t classes,
                            uint16_t* HWY_RESTRICT data, size_t n, const ClassWalkStreams& s, ClassWalkCursor& cur,
                            uint64_t* HWY_RESTRICT hits, uint16_t* HWY_RESTRICT values, const ClassApplyOut* out,
                            size_t* placed) {
  if constexpr (!kApply) {
    const hn::ScalableTag<uint64_t> d64;
    const size_t N64 = hn::Lanes(d64);
    if (N64 <= kPlaceWords) {
      for (size_t w = 0; w < kPlaceWords; w += N64) hn::StoreU(hn::Zero(d64), d64, hits + w);
    } else {
      for (size_t w = 0; w < kPlaceWords; ++w) hits[w] = 0;
    }
  }
  size_t h = 0;
  size_t bad = n;
  const uint8_t* HWY_RESTRICT const diffs = s.diffs;
  const uint8_t* HWY_RESTRICT const escapes = s.escapes;
  const uint32_t index0 = kApply ? out->index0 : 0;
  uint32_t* HWY_RESTRICT undo_pos = kApply ? out->undo_pos : nullptr;
  uint16_t* HWY_RESTRICT undo_old = kApply ? out->undo_old : nullptr;
  uint16_t* HWY_RESTRICT h_new = kApply ? out->h_new : nullptr;
  const hn::CappedTag<int32_t, kPlaceWords> d32;
  const size_t N32 = hn::Lanes(d32);
  for (uint32_t left = classes; left != 0; left &= left - 1) {
    const int c = __builtin_ctz(left);
    const uint64_t* HWY_RESTRICT mask = masks;
    const uint32_t* HWY_RESTRICT bef = before;
    masks += kPlaceWords;
    before += kPlaceWords + 1;
    const uint64_t total = bef[kPlaceWords];
    if (SkipsBlock(cur, c, total)) continue;
    uint64_t r = cur.rem[c];
    // Change g's rank within the block is ranks[g] - off; the class's
    // changes in the block are those with ranks[g] < lim.
    const Rank* HWY_RESTRICT rp = ranks + cur.g[c];
    const Rank* HWY_RESTRICT const rend = ranks + s.end[c];
    const uint8_t* HWY_RESTRICT dp = diffs + cur.g[c];
    const uint64_t off = *rp - r;
    const uint64_t lim = off + total;
    const int32_t* HWY_RESTRICT through = reinterpret_cast<const int32_t*>(bef + 1);
#if HWY_TARGET <= HWY_AVX2 && HWY_ARCH_X86_64
    // The 16 running counts (<= 1024) as i16 lanes in one register, in the
    // packs' order (only how many exceed the rank matters).
    const __m256i through16 =
        _mm256_packs_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(through)),
                           _mm256_loadu_si256(reinterpret_cast<const __m256i*>(through + 8)));
#endif
    // The class's ranks and diff bytes a few lines ahead into L2: the walk
    // reads up to 16 such streams at once, a few changes of each per block,
    // too slowly and too many for the hardware prefetcher to keep them in
    // cache (the parse wrote them long before, whole tensors at a time).
    PrefetchPast<0, 2>(rp, 256);
    PrefetchPast<0, 2>(dp, 64);
    uint64_t rk = *rp;
    // Apply: each change's check ORed into one flag (bit 15), looked at
    // once per class and block (FirstNotCanonical finds the offset).
    const size_t h0 = h;
    const uint8_t* HWY_RESTRICT const dp0 = dp;
    uint32_t flag = 0;
    // The walk of the class's changes in the block, with or without the
    // check of changes coded by a diff byte (kEdge: only classes 0 and 15
    // need it, see kEdgeClasses).
    const auto walk = [&](auto edge) __attribute__((always_inline)) {
      constexpr bool kEdge = decltype(edge)::value;
      for (;;) {
        const uint64_t rr = rk - off;
#if HWY_TARGET <= HWY_AVX2 && HWY_ARCH_X86_64
        (void)N32;
        const uint32_t above = static_cast<uint32_t>(
            _mm256_movemask_epi8(_mm256_cmpgt_epi16(through16, _mm256_set1_epi16(static_cast<int16_t>(rr)))));
        const size_t w = kPlaceWords - static_cast<size_t>(__builtin_popcount(above)) / 2;
#else
        const auto vr = hn::Set(d32, static_cast<int32_t>(rr));
        size_t w = kPlaceWords;
        for (size_t k = 0; k < kPlaceWords; k += N32) w -= hn::CountTrue(d32, hn::Gt(hn::LoadU(d32, through + k), vr));
#endif
        const unsigned at = PlaceSelectBit(mask[w], rr - bef[w], kFastPdep);
        if constexpr (!kApply) hits[w] |= uint64_t{1} << at;
        const size_t i = 64 * w + at;
        const uint16_t o = bf16::LoadElement(data, i);
        const uint8_t d = *dp;
        uint16_t v;
        if (HWY_UNLIKELY(d == compact::kEscape)) {
          std::memcpy(&v, escapes + 2 * cur.e[c]++, 2);
          if constexpr (kApply) {
            flag |= static_cast<uint32_t>(compact::DiffByte(o, v) != d) << 15;
          } else if (HWY_UNLIKELY(compact::DiffByte(o, v) != d)) {
            bad = std::min(bad, i);
          }
        } else {
          v = static_cast<uint16_t>(o + (static_cast<int32_t>(d >> 1) ^ -static_cast<int32_t>(d & 1)));  // unzigzag
          if constexpr (!kEdge) {
            // Classes 1-14: canonical whatever the diff byte (kEdgeClasses).
          } else if constexpr (kApply) {
            flag |= NotCanonical(o, v);
          } else if (HWY_UNLIKELY(NotCanonical(o, v) & 0x8000u)) {
            bad = std::min(bad, i);
          }
        }
        if constexpr (kApply) {
          // Logged before written (the undo covers every change placed).
          undo_pos[h] = index0 + static_cast<uint32_t>(i);
          undo_old[h] = o;
          data[i] = v;
          h_new[h] = v;
          ++h;
        } else {
          values[i] = v;
        }
        ++rp;
        ++dp;
        if (rp == rend) {
          r = ~uint64_t{0};
          break;
        }
        rk = *rp;
        if (rk >= lim) {
          r = rk - lim;  // the class elements left after this block before the change
          break;
        }
      }
    };
    if ((kEdgeClasses >> c) & 1) {
      walk(std::true_type{});
    } else {
      walk(std::false_type{});
    }
    if constexpr (kApply) {
      if (HWY_UNLIKELY(flag & 0x8000u)) bad = std::min(bad, FirstNotCanonical(*out, h0, h - h0, dp0, n));
    } else {
      (void)h0;
      (void)dp0;
      (void)flag;
    }
    cur.g[c] = static_cast<uint64_t>(rp - ranks);
    cur.rem[c] = r;
  }
  if (placed) *placed = h;
  return bad;
}

// GCC 12's false -Wmaybe-uninitialized on its AVX-512 headers, reported
// where the route below is inlined (class_bytes_avx512.h).
#if defined(__x86_64__)
DS_AVX512_WARNINGS_PUSH
#endif
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
// The AVX-512 route of both kernels (session 34), where raw kernels may run
// (raw_kernels.h: "AVX3-no-raw" runs PlaceWalk above instead). PlaceWalk
// places a class's changes one after the other, each one chain of dependent
// work (rank -> word search -> count and mask -> PDEP -> the base element)
// that the next hardly overlaps, with one data-dependent loop exit per class
// and block. Here a block is walked in two phases:
//  1. per class, 16 of its next ranks at once (masked loads: nothing past
//     the class's stream is read): the changes in the block are the prefix
//     of lanes with rank - off < total (ranks strictly ascend), each one's
//     word found by a four-step binary search of the class's running counts
//     (VPERMD), its rank within the word, its class slot: one u16 entry
//     (slot * 16 + word) << 6 | rank-in-word per change into a block list,
//     its diff byte beside it, an escape's raw value beside that (rare,
//     scalar, in the class's escape order); the cursors advance here;
//  2. one loop over the block list, in class order, each change then
//     independent work (mask word, PDEP, the base's load, the new value,
//     the stores), so one exit per block can mispredict instead of one per
//     class and block. An escape's DiffByte check is ORed into one flag
//     there; the diff bytes' NotCanonical check (only classes 0 and 15 can
//     fail it, see kEdgeClasses: the same set as PlaceWalk's) runs after the
//     loop over those two classes' entries, the list's first and last; the
//     offset is looked for only where the flag is set.
// The apply logs each change before it writes it, in class order, as
// PlaceWalk does.
constexpr size_t kListCap = kScanBlockElements + 16;  // each class's batch is stored whole (16 lanes)

// Lanes [0, 16) of a class's next ranks (at most `left` of them loaded),
// less off, as u32 (valid where *in_block has the lane's bit), and which of
// them lie in the block (rank - off < total): a prefix, the ranks ascending.
HWY_INLINE __m512i BlockRanks16(const uint32_t* rp, __mmask16 lm, uint64_t off, uint32_t total, __mmask16* in_block) {
  const __m512i rr = _mm512_sub_epi32(_mm512_maskz_loadu_epi32(lm, rp), _mm512_set1_epi32(static_cast<int32_t>(off)));
  *in_block = _mm512_mask_cmplt_epu32_mask(lm, rr, _mm512_set1_epi32(static_cast<int32_t>(total)));
  return rr;
}
HWY_INLINE __m512i BlockRanks16(const uint64_t* rp, __mmask16 lm, uint64_t off, uint32_t total, __mmask16* in_block) {
  const __m512i o = _mm512_set1_epi64(static_cast<int64_t>(off)), t = _mm512_set1_epi64(static_cast<int64_t>(total));
  const auto lo_m = static_cast<__mmask8>(lm), hi_m = static_cast<__mmask8>(lm >> 8);
  const __m512i lo = _mm512_sub_epi64(_mm512_maskz_loadu_epi64(lo_m, rp), o);
  const __m512i hi = _mm512_sub_epi64(_mm512_maskz_loadu_epi64(hi_m, rp + 8), o);
  *in_block = static_cast<__mmask16>(_mm512_mask_cmplt_epu64_mask(lo_m, lo, t) |
                                     static_cast<unsigned>(_mm512_mask_cmplt_epu64_mask(hi_m, hi, t)) << 8);
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(lo)), _mm512_cvtepi64_epi32(hi), 1);
}

// Change entry e's offset in the block (phase 2), its word in *w.
HWY_INLINE size_t PlaceEntryOffset(uint32_t e, const uint64_t* HWY_RESTRICT masks, size_t* w) {
  *w = (e >> 6) & (kPlaceWords - 1);
  return 64 * *w + static_cast<size_t>(__builtin_ctzll(_pdep_u64(uint64_t{1} << (e & 63), masks[e >> 6])));
}

// A block list change's new value from its old one o and diff byte d, or
// for an escape its raw value *escaped, whose DiffByte check is ORed into
// flag (bit 15); a diff byte's check is the caller's (kEdgeClasses).
HWY_INLINE uint16_t ListNewValue(uint16_t o, uint8_t d, const uint16_t* escaped, uint32_t& flag) {
  if (HWY_UNLIKELY(d == compact::kEscape)) {
    flag |= static_cast<uint32_t>(compact::DiffByte(o, *escaped) != d) << 15;
    return *escaped;
  }
  return static_cast<uint16_t>(o + (static_cast<int32_t>(d >> 1) ^ -static_cast<int32_t>(d & 1)));  // unzigzag
}

// Phase 2 of the decode (ClassPlaceDecode16, session 37): the block list's
// changes written straight into the decode's outputs in element order,
// instead of hits and values by offset that the caller then turned into
// offsets (HitOffsets16) and copied out change by change. Two passes over
// the list: the first places each change (its offset, as in phase 2
// above) and sets its bit in the block's 16 hit words; then each word's
// count of hits before it; the second gives each change its slot in
// element order, the hits before it (its word's count plus the popcount
// of its word's bits below it: no sort, the offsets are distinct), and
// writes its index, new value and old value there. The diff bytes' check
// runs inline for the list's edge-class ranges only (kEdgeClasses), an
// escape's DiffByte check for every escape, ORed into one flag; the
// offset is looked for only where the flag is set.
HWY_INLINE size_t DecodeListAvx512(const uint16_t* HWY_RESTRICT entries, const uint16_t* HWY_RESTRICT escaped,
                                   const uint8_t* HWY_RESTRICT diffs, size_t pos, size_t edge_lo, size_t edge_hi,
                                   const uint64_t* HWY_RESTRICT masks, const uint16_t* HWY_RESTRICT data, size_t n,
                                   const ClassDecodeOut& out, size_t* placed) {
  alignas(64) uint16_t offs[kListCap];
  uint64_t* HWY_RESTRICT const indices = out.indices;
  uint8_t* HWY_RESTRICT const values = out.values;
  uint16_t* HWY_RESTRICT const side = out.side;
  const uint64_t index0 = out.index0;
  uint32_t flag = 0;
  // Change j's slot by `slot_of(i)`, its offset i.
  const auto emit_with = [&](size_t from, size_t to, auto edge, const auto& slot_of) __attribute__((always_inline)) {
    constexpr bool kEdge = decltype(edge)::value;
    for (size_t j = from; j < to; ++j) {
      const size_t i = offs[j];
      const uint64_t slot = slot_of(i);
      const uint16_t o = bf16::LoadElement(data, i);
      const uint8_t d = diffs[j];
      const uint16_t v = ListNewValue(o, d, escaped + j, flag);
      if constexpr (kEdge) flag |= d == compact::kEscape ? 0u : NotCanonical(o, v);
      indices[slot] = index0 + i;
      std::memcpy(values + 2 * slot, &v, 2);
      side[slot] = o;
    }
  };
  const auto emit_all = [&](const auto& slot_of) __attribute__((always_inline)) {
    emit_with(0, edge_lo, std::true_type{}, slot_of);
    emit_with(edge_lo, edge_hi, std::false_type{}, slot_of);
    emit_with(edge_hi, pos, std::true_type{}, slot_of);
  };
  if (pos <= 64) {
    // Up to 64 changes (most blocks at a few percent changed): a change's
    // slot is how many of the list's offsets lie below its own, by one
    // compare of the 64 u16 lanes (past pos: 0xFFFF, never below).
    for (size_t j = 0; j < pos; ++j) {
      size_t w;
      offs[j] = static_cast<uint16_t>(PlaceEntryOffset(entries[j], masks, &w));
    }
    const __m512i all = _mm512_set1_epi16(-1);
    const uint64_t live = pos == 64 ? ~uint64_t{0} : (uint64_t{1} << pos) - 1;
    const __m512i lo = _mm512_mask_loadu_epi16(all, static_cast<__mmask32>(live), offs);
    const __m512i hi = _mm512_mask_loadu_epi16(all, static_cast<__mmask32>(live >> 32), offs + 32);
    emit_all([&](size_t i) __attribute__((always_inline)) {
      const __m512i at = _mm512_set1_epi16(static_cast<int16_t>(i));
      const uint64_t below = _cvtmask32_u32(_mm512_cmplt_epu16_mask(lo, at)) |
                             uint64_t{_cvtmask32_u32(_mm512_cmplt_epu16_mask(hi, at))} << 32;
      return static_cast<uint64_t>(__builtin_popcountll(below));
    });
    *placed = pos;
  } else {
    alignas(64) uint64_t hits[kPlaceWords];
    _mm512_store_si512(hits, _mm512_setzero_si512());
    _mm512_store_si512(hits + 8, _mm512_setzero_si512());
    for (size_t j = 0; j < pos; ++j) {
      size_t w;
      const size_t i = PlaceEntryOffset(entries[j], masks, &w);
      offs[j] = static_cast<uint16_t>(i);
      hits[w] |= uint64_t{1} << (i & 63);
    }
    // The hits before each word: the popcounts' exclusive prefix sum.
    alignas(64) uint64_t first[kPlaceWords];
    uint64_t count = 0;
    for (size_t w = 0; w < kPlaceWords; ++w) {
      first[w] = count;
      count += static_cast<uint64_t>(__builtin_popcountll(hits[w]));
    }
    emit_all([&](size_t i) __attribute__((always_inline)) {
      const size_t w = i >> 6;
      return first[w] + static_cast<uint64_t>(__builtin_popcountll(_bzhi_u64(hits[w], static_cast<unsigned>(i & 63))));
    });
    *placed = static_cast<size_t>(count);
  }
  if (HWY_LIKELY((flag & 0x8000u) == 0)) return n;
  size_t bad = n;
  for (size_t j = 0; j < pos; ++j) {
    const size_t i = offs[j];
    const uint16_t o = data[i];
    const uint8_t d = diffs[j];
    const bool wrong = d == compact::kEscape
                           ? compact::DiffByte(o, escaped[j]) != d
                           : (NotCanonical(o, static_cast<uint16_t>(o + (static_cast<int32_t>(d >> 1) ^ -static_cast<int32_t>(d & 1)))) & 0x8000u) != 0;
    if (wrong) bad = std::min(bad, i);
  }
  return bad;
}

template <bool kApply, bool kDecode = false, typename Rank>
HWY_INLINE size_t PlaceBlockAvx512(const Rank* HWY_RESTRICT const ranks, const uint64_t* HWY_RESTRICT const masks,
                                   const uint32_t* HWY_RESTRICT before, uint32_t classes, uint16_t* HWY_RESTRICT data,
                                   size_t n, const ClassWalkStreams& s, ClassWalkCursor& cur,
                                   uint64_t* HWY_RESTRICT hits, uint16_t* HWY_RESTRICT values,
                                   const ClassApplyOut* out, size_t* placed, const ClassDecodeOut* dec = nullptr) {
  alignas(64) uint16_t entries[kListCap];
  alignas(64) uint16_t escaped[kListCap];  // set only where the diff byte is kEscape
  alignas(64) uint8_t diffs[kListCap];
  size_t pos = 0;
  const uint8_t* HWY_RESTRICT const escapes = s.escapes;
  // Phase 1: the block's list, class by class.
  const uint64_t g_first = cur.g[0], g_last = cur.g[15];
  uint32_t slot = 0;
  for (uint32_t left_classes = classes; left_classes != 0; left_classes &= left_classes - 1, ++slot) {
    const int c = __builtin_ctz(left_classes);
    const uint32_t* HWY_RESTRICT const bef = before + slot * (kPlaceWords + 1);
    const uint64_t total = bef[kPlaceWords];
    if (SkipsBlock(cur, c, total)) continue;
    const uint64_t r = cur.rem[c];
    const Rank* HWY_RESTRICT rp = ranks + cur.g[c];
    const uint8_t* HWY_RESTRICT dp = s.diffs + cur.g[c];
    uint64_t left = s.end[c] - cur.g[c];  // > 0: r is not ~0
    PrefetchPast<0, 2>(rp, 256);
    PrefetchPast<0, 2>(dp, 64);
    const uint64_t off = *rp - r;
    const __m512i befv = _mm512_loadu_si512(bef);  // the running counts of words 0..15
    const __m512i tag = _mm512_set1_epi32(static_cast<int32_t>(slot * kPlaceWords));
    for (;;) {
      const __mmask16 lm = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
      __mmask16 in_block;
      const __m512i rr = BlockRanks16(rp, lm, off, static_cast<uint32_t>(total), &in_block);
      const auto k = static_cast<size_t>(__builtin_ctz(~static_cast<uint32_t>(in_block)));  // the prefix in the block
      // The word: the last w in [0, 16) with before[w] <= rr (before[0] = 0).
      __m512i w = _mm512_setzero_si512();
      for (int step = 8; step >= 1; step >>= 1) {
        const __m512i cand = _mm512_add_epi32(w, _mm512_set1_epi32(step));
        w = _mm512_mask_mov_epi32(w, _mm512_cmple_epu32_mask(_mm512_permutexvar_epi32(cand, befv), rr), cand);
      }
      const __m512i q = _mm512_sub_epi32(rr, _mm512_permutexvar_epi32(w, befv));
      const __m512i e = _mm512_or_si512(_mm512_slli_epi32(_mm512_add_epi32(w, tag), 6), q);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(entries + pos), _mm512_cvtepi32_epi16(e));
      const __m128i dv = _mm_maskz_loadu_epi8(lm, dp);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(diffs + pos), dv);
      uint32_t esc = _mm_cmpeq_epi8_mask(dv, _mm_set1_epi8(static_cast<char>(compact::kEscape))) &
                     ((uint32_t{1} << k) - 1);
      if (HWY_UNLIKELY(esc != 0)) {
        // Lane order is the class's order, so the escapes are taken in turn.
        for (; esc != 0; esc &= esc - 1) {
          std::memcpy(escaped + pos + static_cast<size_t>(__builtin_ctz(esc)), escapes + 2 * cur.e[c]++, 2);
        }
      }
      pos += k;
      rp += k;
      dp += k;
      left -= k;
      if (k < 16 || left == 0) break;
    }
    cur.g[c] = static_cast<uint64_t>(rp - ranks);
    cur.rem[c] = left == 0 ? ~uint64_t{0} : static_cast<uint64_t>(*rp) - (off + total);
  }
  // The diff bytes' check covers only classes 0 and 15 (kEdgeClasses):
  // the list's first and last entries (the classes' cursors moved by their
  // count).
  const size_t edge_lo = classes & 1u ? static_cast<size_t>(cur.g[0] - g_first) : 0;
  const size_t edge_hi = pos - (classes >> 15 & 1u ? static_cast<size_t>(cur.g[15] - g_last) : 0);
  if constexpr (kDecode) return DecodeListAvx512(entries, escaped, diffs, pos, edge_lo, edge_hi, masks, data, n, *dec, placed);
  // Phase 2: the changes of the list, each independent of the others.
  uint32_t flag = 0;
  const uint32_t index0 = kApply ? out->index0 : 0;
  uint32_t* HWY_RESTRICT const undo_pos = kApply ? out->undo_pos : nullptr;
  uint16_t* HWY_RESTRICT const undo_old = kApply ? out->undo_old : nullptr;
  uint16_t* HWY_RESTRICT const h_new = kApply ? out->h_new : nullptr;
  if constexpr (!kApply) {
    for (size_t w = 0; w < kPlaceWords; w += 8) _mm512_storeu_si512(hits + w, _mm512_setzero_si512());
  }
  for (size_t j = 0; j < pos; ++j) {
    size_t w;
    const size_t i = PlaceEntryOffset(entries[j], masks, &w);
    const uint16_t o = bf16::LoadElement(data, i);
    const uint8_t d = diffs[j];
    const uint16_t v = ListNewValue(o, d, escaped + j, flag);
    if constexpr (kApply) {
      // Logged before written (the undo covers every change placed).
      undo_pos[j] = index0 + static_cast<uint32_t>(i);
      undo_old[j] = o;
      data[i] = v;
      h_new[j] = v;
    } else {
      hits[w] |= uint64_t{1} << (i & 63);
      values[i] = v;
    }
  }
  // The diff bytes' check (edge_lo, edge_hi above).
  const auto check = [&](size_t from, size_t to) {
    for (size_t j = from; j < to; ++j) {
      if (diffs[j] == compact::kEscape) continue;  // checked above
      if constexpr (kApply) {
        flag |= NotCanonical(undo_old[j], h_new[j]);
      } else {
        size_t w;
        const size_t i = PlaceEntryOffset(entries[j], masks, &w);
        flag |= NotCanonical(data[i], values[i]);
      }
    }
  };
  check(0, edge_lo);
  check(edge_hi, pos);
  if (placed) *placed = pos;
  if (HWY_LIKELY((flag & 0x8000u) == 0)) return n;
  if constexpr (kApply) {
    return FirstNotCanonical(*out, 0, pos, diffs, n);
  } else {
    size_t bad = n;
    for (size_t j = 0; j < pos; ++j) {
      size_t w;
      const size_t i = PlaceEntryOffset(entries[j], masks, &w);
      const uint16_t o = data[i], v = values[i];
      const bool wrong =
          diffs[j] == compact::kEscape ? compact::DiffByte(o, v) != diffs[j] : (NotCanonical(o, v) & 0x8000u) != 0;
      if (wrong) bad = std::min(bad, i);
    }
    return bad;
  }
}
#endif  // HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64

size_t ClassPlace16Impl(const uint64_t* HWY_RESTRICT masks, const uint32_t* HWY_RESTRICT before, uint32_t classes,
                        const uint16_t* HWY_RESTRICT data, size_t n, const ClassWalkStreams& s, ClassWalkCursor& cur,
                        uint64_t* HWY_RESTRICT hits, uint16_t* HWY_RESTRICT values) {
  // Never written: the select walk only reads data.
  uint16_t* const d = const_cast<uint16_t*>(data);
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
  if (RawKernelsAllowed()) {
    return s.ranks32 ? PlaceBlockAvx512<false>(s.ranks32, masks, before, classes, d, n, s, cur, hits, values, nullptr, nullptr)
                     : PlaceBlockAvx512<false>(s.ranks, masks, before, classes, d, n, s, cur, hits, values, nullptr, nullptr);
  }
#endif
  if (s.ranks32) {
    return PlaceFastPdep()
               ? PlaceWalk<false, true>(s.ranks32, masks, before, classes, d, n, s, cur, hits, values, nullptr, nullptr)
               : PlaceWalk<false, false>(s.ranks32, masks, before, classes, d, n, s, cur, hits, values, nullptr, nullptr);
  }
  return PlaceFastPdep()
             ? PlaceWalk<false, true>(s.ranks, masks, before, classes, d, n, s, cur, hits, values, nullptr, nullptr)
             : PlaceWalk<false, false>(s.ranks, masks, before, classes, d, n, s, cur, hits, values, nullptr, nullptr);
}

size_t HitOffsets16Impl(const uint64_t* HWY_RESTRICT hits, uint16_t* HWY_RESTRICT out);

size_t ClassPlaceDecode16Impl(const uint64_t* HWY_RESTRICT masks, const uint32_t* HWY_RESTRICT before,
                              uint32_t classes, const uint16_t* HWY_RESTRICT data, size_t n, const ClassWalkStreams& s,
                              ClassWalkCursor& cur, const ClassDecodeOut& out, size_t* placed) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
  if (RawKernelsAllowed()) {
    uint16_t* const d = const_cast<uint16_t*>(data);  // never written
    return s.ranks32 ? PlaceBlockAvx512<false, true>(s.ranks32, masks, before, classes, d, n, s, cur, nullptr, nullptr,
                                                     nullptr, placed, &out)
                     : PlaceBlockAvx512<false, true>(s.ranks, masks, before, classes, d, n, s, cur, nullptr, nullptr,
                                                     nullptr, placed, &out);
  }
#endif
  // Every other route: the select's hits and values by offset, then the
  // offsets in order and the changes copied out one by one.
  alignas(64) uint64_t hits[kPlaceWords];
  alignas(64) uint16_t values[kScanBlockElements];
  alignas(64) uint16_t offsets[kScanBlockElements + kHitOffsetsSlack];
  const size_t bad = ClassPlace16Impl(masks, before, classes, data, n, s, cur, hits, values);
  const size_t count = HitOffsets16Impl(hits, offsets);
  for (size_t j = 0; j < count; ++j) {
    const size_t i = offsets[j];
    out.indices[j] = out.index0 + i;
    std::memcpy(out.values + 2 * j, &values[i], 2);
    out.side[j] = data[i];
  }
  *placed = count;
  return bad;
}

size_t ClassPlaceApply16Impl(const uint64_t* HWY_RESTRICT masks, const uint32_t* HWY_RESTRICT before,
                             uint32_t classes, uint16_t* HWY_RESTRICT data, size_t n, const ClassWalkStreams& s,
                             ClassWalkCursor& cur, const ClassApplyOut& out, size_t* placed) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
  if (RawKernelsAllowed()) {
    return s.ranks32 ? PlaceBlockAvx512<true>(s.ranks32, masks, before, classes, data, n, s, cur, nullptr, nullptr, &out, placed)
                     : PlaceBlockAvx512<true>(s.ranks, masks, before, classes, data, n, s, cur, nullptr, nullptr, &out, placed);
  }
#endif
  if (s.ranks32) {
    return PlaceFastPdep()
               ? PlaceWalk<true, true>(s.ranks32, masks, before, classes, data, n, s, cur, nullptr, nullptr, &out, placed)
               : PlaceWalk<true, false>(s.ranks32, masks, before, classes, data, n, s, cur, nullptr, nullptr, &out, placed);
  }
  return PlaceFastPdep()
             ? PlaceWalk<true, true>(s.ranks, masks, before, classes, data, n, s, cur, nullptr, nullptr, &out, placed)
             : PlaceWalk<true, false>(s.ranks, masks, before, classes, data, n, s, cur, nullptr, nullptr, &out, placed);
}

#if defined(__x86_64__)
DS_AVX512_WARNINGS_POP
#endif

// Four offsets a word are written whether its bits are set or not (the
// count advances by the word's popcount, so those past it are scratch) and
// only a word with more than four set bits loops: at a few percent changed
// a word holds about two, too few and too varied for a loop per word, whose
// exit mispredicted about once a word. The ctz of a word ORed with its top
// bit is defined for every word and changes no real offset (only the last
// set bit can be bit 63).
size_t HitOffsets16Impl(const uint64_t* HWY_RESTRICT hits, uint16_t* HWY_RESTRICT out) {
  size_t n = 0;
  for (size_t w = 0; w < kPlaceWords; ++w) {
    uint64_t h = hits[w];
    const size_t count = static_cast<size_t>(__builtin_popcountll(h));
    uint16_t* HWY_RESTRICT const o = out + n;
    const auto base = static_cast<unsigned>(64 * w);
    for (size_t j = 0; j < kHitOffsetsSlack; ++j) {
      o[j] = static_cast<uint16_t>(base + static_cast<unsigned>(__builtin_ctzll(h | uint64_t{1} << 63)));
      h &= h - 1;
    }
    for (size_t j = kHitOffsetsSlack; j < count; ++j) {
      o[j] = static_cast<uint16_t>(base + static_cast<unsigned>(__builtin_ctzll(h)));
      h &= h - 1;
    }
    n += count;
  }
  return n;
}

}  // namespace deltasync::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deltasync::kernels {

HWY_EXPORT(ClassPlace16Impl);
HWY_EXPORT(ClassPlaceApply16Impl);
HWY_EXPORT(HitOffsets16Impl);
HWY_EXPORT(ClassPlaceDecode16Impl);

size_t HitOffsets16(const uint64_t* hits, uint16_t* out) { return HWY_DYNAMIC_DISPATCH(HitOffsets16Impl)(hits, out); }

size_t ClassPlace16(const uint64_t* masks, const uint32_t* before, uint32_t classes, const uint16_t* data, size_t n,
                    const ClassWalkStreams& s, ClassWalkCursor& cur, uint64_t* hits, uint16_t* values) {
  return HWY_DYNAMIC_DISPATCH(ClassPlace16Impl)(masks, before, classes, data, n, s, cur, hits, values);
}

size_t ClassPlaceDecode16(const uint64_t* masks, const uint32_t* before, uint32_t classes, const uint16_t* data,
                          size_t n, const ClassWalkStreams& s, ClassWalkCursor& cur, const ClassDecodeOut& out,
                          size_t* placed) {
  return HWY_DYNAMIC_DISPATCH(ClassPlaceDecode16Impl)(masks, before, classes, data, n, s, cur, out, placed);
}

size_t ClassPlaceApply16(const uint64_t* masks, const uint32_t* before, uint32_t classes, uint16_t* data, size_t n,
                         const ClassWalkStreams& s, ClassWalkCursor& cur, const ClassApplyOut& out, size_t* placed) {
  return HWY_DYNAMIC_DISPATCH(ClassPlaceApply16Impl)(masks, before, classes, data, n, s, cur, out, placed);
}

}  // namespace deltasync::kernels
#endif  // HWY_ONCE
