// The AVX-512 route of ClassPlace16, ClassPlaceDecode16 and
// ClassPlaceApply16 (PlaceBlockAvx512, session 34; simd_kernels.h), on
// Highway's AVX3 targets on x86-64 (empty on every other target). Internal:
// included by class_place_kernels.cc once per target of its foreach_target
// pass (Highway's "-inl.h" convention: the guard toggles with
// HWY_TARGET_TOGGLE), after the helpers it shares with the portable
// PlaceWalk there (kPlaceWords, NotCanonical, kEdgeClasses,
// FirstNotCanonical, SkipsBlock), and inside that file's AVX-512 warning
// suppression (DS_AVX512_WARNINGS_PUSH).
#if defined(DELTASYNC_BF16_CLASS_PLACE_AVX512_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef DELTASYNC_BF16_CLASS_PLACE_AVX512_INL_H_
#undef DELTASYNC_BF16_CLASS_PLACE_AVX512_INL_H_
#else
#define DELTASYNC_BF16_CLASS_PLACE_AVX512_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <hwy/highway.h>

#include "bf16/compact_scan.h"
#include "bf16/prefetch.h"
#include "bf16/round.h"
#include "bf16/simd_kernels.h"
#include "codec/compact_bf16.h"

HWY_BEFORE_NAMESPACE();
namespace deltasync::kernels::HWY_NAMESPACE {

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
}  // namespace deltasync::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // DELTASYNC_BF16_CLASS_PLACE_AVX512_INL_H_
