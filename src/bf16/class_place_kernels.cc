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
// block in two phases instead (PlaceBlockAvx512, session 34, in
// class_place_avx512-inl.h): per class 16 ranks at once into a block list
// of entries, then one loop over the list, each change independent of the
// others.
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

}  // namespace deltasync::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

// The AVX-512 route of the three kernels below (PlaceBlockAvx512), on AVX3
// targets; it uses the helpers above.
#include "bf16/class_place_avx512-inl.h"

HWY_BEFORE_NAMESPACE();
namespace deltasync::kernels::HWY_NAMESPACE {

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
