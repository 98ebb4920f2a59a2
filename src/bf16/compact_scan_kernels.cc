// ScanCompactSpan (compact_scan.h): the fused detect -> code -> hash -> apply
// pass, per block of kBlock elements:
//  1. vectors: the new bf16 values (fp32 rounded), the changed-element
//     bitmap, each base element's exponent class as a byte, and whether
//     any new value is non-finite;
//  2. per 64-element word: one mask per class (vector compares of the class
//     bytes), so a change's gap is its class count so far plus a popcount;
//     then the word's changes, one at a time (about two per word at a
//     realistic change rate);
//  3. the block's hash change in one vector call over its changes.
// Compiled per target like the other kernels (foreach_target.h). On the
// AVX-512 targets, where the CPU has VBMI, VBMI2, GFNI, BITALG, VPOPCNTDQ and BF16,
// pass 1, step 2's masks and counts, and the changes' indices, diff bytes,
// old and new values (packed) are one raw-intrinsics pass instead
// (compact_scan_avx512.h), which also stores the new values; each change's
// gap then runs in one flat loop over the block's changes.

#include <algorithm>
#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bf16/compact_scan.h"
#include "bf16/compact_scan_avx512.h"
#include "bf16/prefetch.h"
#include "bf16/round.h"
#include "bf16/simd_kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bf16/compact_scan_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "bf16/kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace deltasync::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// GCC 12's AVX-512 headers start some results from _mm512_undefined_*(),
// which its -Wmaybe-uninitialized then flags in the scan's block pass
// (a known false positive; clang has no such warning group).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

constexpr size_t kScanBlock = kScanBlockElements;
constexpr size_t kScanWords = kScanBlock / 64;
constexpr uint8_t kNoClass = 0xFF;

// compact::ClassOf of the bf16 bits in u32 lanes (clamp(exponent - 112, 0,
// 15)).
template <class D32>
HWY_INLINE hn::Vec<D32> ClassLanes(D32 d32, hn::Vec<D32> bits) {
  const auto e = hn::And(hn::ShiftRight<7>(bits), hn::Set(d32, 0xFFu));
  const auto c112 = hn::Set(d32, 112u);
  return hn::Min(hn::Sub(hn::Max(e, c112), c112), hn::Set(d32, 15u));
}

// The classify blocks' scalar tail: elements i..len one by one, then the
// block's last word padded with kNoClass. true when one is NaN/Inf.
template <bool kF32>
HWY_INLINE bool ClassifyTail(const uint16_t* HWY_RESTRICT pub, const void* cur_raw, size_t i, size_t len,
                             uint16_t* HWY_RESTRICT fresh, uint64_t* HWY_RESTRICT words,
                             uint8_t* HWY_RESTRICT cls, int& lo, int& hi) {
  bool any_bad = false;
  for (; i < len; ++i) {
    uint16_t r;
    if constexpr (kF32) {
      r = bf16::RoundFp32ToBf16(bf16::LoadElement(static_cast<const uint32_t*>(cur_raw), i));
    } else {
      r = bf16::LoadElement(static_cast<const uint16_t*>(cur_raw), i);
    }
    const uint16_t p = bf16::LoadElement(pub, i);
    fresh[i] = r;
    any_bad |= bf16::IsNonFinite(r, bf16::kBf16ExpMask);
    words[i / 64] |= static_cast<uint64_t>(r != p) << (i % 64);
    cls[i] = static_cast<uint8_t>(compact::ClassOf(p));
    lo = std::min(lo, static_cast<int>(cls[i]));
    hi = std::max(hi, static_cast<int>(cls[i]));
  }
  std::memset(cls + len, kNoClass, (len + 63) / 64 * 64 - len);
  return any_bad;
}

// Pass 1 over one block of len <= kScanBlock elements.
// Also gives the lowest and highest class of the block's base elements.
template <bool kF32>
HWY_INLINE bool ClassifyBlock(const uint16_t* HWY_RESTRICT pub, const void* cur_raw, size_t len,
                              uint16_t* HWY_RESTRICT fresh, uint64_t* HWY_RESTRICT words,
                              uint8_t* HWY_RESTRICT cls, int& lo, int& hi) {
  const hn::ScalableTag<uint32_t> d32;
  const hn::RebindToSigned<decltype(d32)> di32;
  const hn::Rebind<uint16_t, decltype(d32)> d16;
  const hn::Rebind<uint8_t, decltype(d32)> d8;
  const size_t N = hn::Lanes(d32);
  const auto exp = hn::Set(d32, uint32_t{bf16::kBf16ExpMask});
  auto bad = hn::FirstN(d32, 0);
  auto vlo = hn::Set(d32, 15u), vhi = hn::Zero(d32);
  uint8_t* bitmap = reinterpret_cast<uint8_t*>(words);
  std::memset(words, 0, kScanWords * sizeof(uint64_t));
  size_t i = 0;
  for (; i + N <= len; i += N) {
    hn::Vec<decltype(d32)> r;
    if constexpr (kF32) {
      r = RoundToBf16(d32, hn::LoadU(d32, static_cast<const uint32_t*>(cur_raw) + i));
    } else {
      r = hn::PromoteTo(d32, hn::LoadU(d16, static_cast<const uint16_t*>(cur_raw) + i));
    }
    const auto p = hn::PromoteTo(d32, hn::LoadU(d16, pub + i));
    bad = hn::Or(bad, hn::Eq(hn::And(r, exp), exp));
    SetMaskBits(d32, hn::Ne(r, p), i, bitmap);
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di32, r)), d16, fresh + i);
    const auto c = ClassLanes(d32, p);
    vlo = hn::Min(vlo, c);
    vhi = hn::Max(vhi, c);
    hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di32, c)), d8, cls + i);
  }
  lo = static_cast<int>(hn::GetLane(hn::MinOfLanes(d32, vlo)));
  hi = static_cast<int>(hn::GetLane(hn::MaxOfLanes(d32, vhi)));
  const bool tail_bad = ClassifyTail<kF32>(pub, cur_raw, i, len, fresh, words, cls, lo, hi);
  return tail_bad || !hn::AllFalse(d32, bad);
}

#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
// ClassifyBlock on AVX-512, 32 elements a step: after the fp32 rounding
// (16 lanes of u32, twice) everything runs on 32 u16 lanes, and the compare
// masks are stored as they come (32 bits of the bitmap, one mask of bad
// values). Same results as ClassifyBlock.
template <bool kF32>
HWY_INLINE bool ClassifyBlock32(const uint16_t* HWY_RESTRICT pub, const void* cur_raw, size_t len,
                                uint16_t* HWY_RESTRICT fresh, uint64_t* HWY_RESTRICT words,
                                uint8_t* HWY_RESTRICT cls, int& lo, int& hi) {
  const hn::ScalableTag<uint32_t> d32;
  const __m512i exp = _mm512_set1_epi16(static_cast<short>(bf16::kBf16ExpMask));
  const __m512i c112 = _mm512_set1_epi16(112), c15 = _mm512_set1_epi16(15);
  __m512i vlo = c15, vhi = _mm512_setzero_si512();
  __mmask32 bad = 0;
  uint8_t* bitmap = reinterpret_cast<uint8_t*>(words);
  std::memset(words, 0, kScanWords * sizeof(uint64_t));
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    __m512i r;
    if constexpr (kF32) {
      const auto* cur = static_cast<const uint32_t*>(cur_raw) + i;
      const __m256i a = _mm512_cvtepi32_epi16(RoundToBf16(d32, hn::LoadU(d32, cur)).raw);
      const __m256i b = _mm512_cvtepi32_epi16(RoundToBf16(d32, hn::LoadU(d32, cur + 16)).raw);
      r = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    } else {
      r = _mm512_loadu_si512(static_cast<const uint16_t*>(cur_raw) + i);
    }
    const __m512i p = _mm512_loadu_si512(pub + i);
    const uint32_t changed = _mm512_cmpneq_epu16_mask(r, p);
    std::memcpy(bitmap + i / 8, &changed, 4);
    bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(r, exp), exp);
    _mm512_storeu_si512(fresh + i, r);
    const __m512i c = _mm512_min_epu16(_mm512_subs_epu16(_mm512_srli_epi16(_mm512_and_si512(p, exp), 7), c112), c15);
    vlo = _mm512_min_epu16(vlo, c);
    vhi = _mm512_max_epu16(vhi, c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cls + i), _mm512_cvtepi16_epi8(c));
  }
  HWY_ALIGN uint16_t los[32], his[32];
  _mm512_store_si512(los, vlo);
  _mm512_store_si512(his, vhi);
  lo = 15;
  hi = 0;
  for (int k = 0; k < 32; ++k) {
    lo = std::min(lo, static_cast<int>(los[k]));
    hi = std::max(hi, static_cast<int>(his[k]));
  }
  const bool tail_bad = ClassifyTail<kF32>(pub, cur_raw, i, len, fresh, words, cls, lo, hi);
  return tail_bad || bad != 0;
}
#endif

#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86_64
// ClassifyBlock on AVX2, 32 elements a step (as ClassifyBlock32), on u16
// lanes (kernels-inl.h's AVX2 helpers). Same results as ClassifyBlock.
template <bool kF32>
HWY_INLINE bool ClassifyBlockAvx2(const uint16_t* HWY_RESTRICT pub, const void* cur_raw, size_t len,
                                  uint16_t* HWY_RESTRICT fresh, uint64_t* HWY_RESTRICT words,
                                  uint8_t* HWY_RESTRICT cls, int& lo, int& hi) {
  const __m256i exp = _mm256_set1_epi16(static_cast<short>(bf16::kBf16ExpMask));
  const __m256i c112 = _mm256_set1_epi16(112), c15 = _mm256_set1_epi16(15);
  __m256i vlo = c15, vhi = _mm256_setzero_si256(), bad = _mm256_setzero_si256();
  uint8_t* bitmap = reinterpret_cast<uint8_t*>(words);
  std::memset(words, 0, kScanWords * sizeof(uint64_t));
  // 16 new values (u16 lanes in element order) from element k on.
  const auto fresh16 = [&](size_t k) {
    if constexpr (kF32) return RoundToBf16x16(static_cast<const uint32_t*>(cur_raw) + k);
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(cur_raw) + k));
  };
  size_t i = 0;
  for (; i + 32 <= len; i += 32) {
    const __m256i r0 = fresh16(i), r1 = fresh16(i + 16);
    const __m256i p0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pub + i));
    const __m256i p1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pub + i + 16));
    const uint32_t changed = DiffBits32(r0, r1, p0, p1);
    std::memcpy(bitmap + i / 8, &changed, 4);
    bad = OrNonFinite16(bad, r0, r1, exp);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(fresh + i), r0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(fresh + i + 16), r1);
    const __m256i k0 = _mm256_min_epu16(_mm256_subs_epu16(_mm256_srli_epi16(_mm256_and_si256(p0, exp), 7), c112), c15);
    const __m256i k1 = _mm256_min_epu16(_mm256_subs_epu16(_mm256_srli_epi16(_mm256_and_si256(p1, exp), 7), c112), c15);
    vlo = _mm256_min_epu16(vlo, _mm256_min_epu16(k0, k1));
    vhi = _mm256_max_epu16(vhi, _mm256_max_epu16(k0, k1));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(cls + i), _mm256_permute4x64_epi64(_mm256_packus_epi16(k0, k1), 0xD8));
  }
  HWY_ALIGN uint16_t los[16], his[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(los), vlo);
  _mm256_store_si256(reinterpret_cast<__m256i*>(his), vhi);
  lo = 15;
  hi = 0;
  for (int k = 0; k < 16; ++k) {
    lo = std::min(lo, static_cast<int>(los[k]));
    hi = std::max(hi, static_cast<int>(his[k]));
  }
  const bool tail_bad = ClassifyTail<kF32>(pub, cur_raw, i, len, fresh, words, cls, lo, hi);
  return tail_bad || !_mm256_testz_si256(bad, bad);
}
#endif

// mask[c] bit k = class byte k of the 64 at `cls` equals c.
HWY_INLINE void ClassMasks(const uint8_t* HWY_RESTRICT cls, uint64_t* HWY_RESTRICT mask) {
  const ClassByteTag d8;
  constexpr size_t kMax = HWY_MAX_BYTES;
  const size_t N = hn::Lanes(d8);
  if (N >= 8) {
    for (int c = 0; c < kScanClasses; ++c) {
      const auto want = hn::Set(d8, static_cast<uint8_t>(c));
      HWY_ALIGN uint8_t bits[8 + kMax / 8] = {};
      for (size_t i = 0; i < 64; i += N) hn::StoreMaskBits(d8, hn::Eq(hn::LoadU(d8, cls + i), want), bits + i / 8);
      std::memcpy(&mask[c], bits, 8);
    }
  } else {
    for (int c = 0; c < kScanClasses; ++c) mask[c] = 0;
    for (size_t k = 0; k < 64; ++k) {
      if (cls[k] != kNoClass) mask[cls[k]] |= uint64_t{1} << k;
    }
  }
}

// A class's gap and diff streams get a change every few blocks: 12-16
// streams at once, each crossing into a new cache line now and then, are too
// many for the hardware prefetcher, and their stores missed (a store buffer
// full of misses stalls the per-change loop). Each change asks for the line
// this many entries ahead of its own, for writing. The address is formed as
// an integer (it may lie past the buffer: a prefetch never faults).
constexpr size_t kGapsAhead = 64 / sizeof(uint32_t) * 2;
constexpr size_t kDiffsAhead = 64 * 2;
template <typename T>
HWY_INLINE void PrefetchForWrite(const T* p, size_t ahead) {
  PrefetchPast<1>(p, ahead * sizeof(T));
}

// The loop keeps every counter and output pointer in locals: the outputs
// are byte stores, which may alias anything reachable from `s` or `st`, so
// through those the compiler would reload them after every store.
// kRaw: each block's first pass is ScanBlockAvx512 (compact_scan_avx512.h),
// which also gives every word's class masks and running counts and the
// changes packed (indices, classes, diff bytes, old and new values), so that
// the changes run in one flat loop per block; only where
// HasCompactScanAvx512().
template <bool kF32, bool kRaw>
HWY_INLINE size_t ScanLoop(const CompactScanSpan& s, CompactScanState& st) {
  // The raw route's block pass and hash step exist only on x86-64 AVX3
  // targets (elsewhere the block pass is a stub and the hash step is not
  // compiled): instantiated anywhere else it would code nothing.
  static_assert(!kRaw || (HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64), "the raw scan route runs only on AVX3");
  HWY_ALIGN uint16_t fresh[kRaw ? 1 : kScanBlock];
  HWY_ALIGN uint8_t cls[kRaw ? 1 : kScanBlock];
  HWY_ALIGN uint64_t words[kRaw ? 1 : kScanWords];
  // kRaw: ScanBlockAvx512's changes' class bytes, ranks and diff bytes
  // (packed).
  static_assert(kScanWords == kScanBlockWords && kScanClasses == kScanWordClasses);
  static_assert(kScanOldSlack >= kScanOffsetsSlack);
  constexpr size_t kPacked = kRaw ? kScanBlock + kScanOffsetsSlack : 1;
  HWY_ALIGN uint64_t ranks[kPacked];
  HWY_ALIGN uint8_t ch_classes[kPacked];
  HWY_ALIGN uint8_t ch_diffs[kPacked];
  // The hash inputs of the block's changes: bf16 bits as u16 (HashTermDiffs16
  // multiplies them in one step less than u64 bits, and stores a quarter);
  // the old bits are the block's run of old_values. kRaw pads them to whole
  // vectors of 8 (see below).
  HWY_ALIGN uint64_t h_index[kScanBlock + kScanOffsetsSlack];
  HWY_ALIGN uint16_t h_new[kScanBlock + kScanOffsetsSlack];
  const uint64_t index0 = s.index0;
  uint64_t seen[kScanClasses], next[kScanClasses], count[kScanClasses], escapes[kScanClasses];
  uint32_t* gaps[kScanClasses];
  uint8_t* diffs[kScanClasses];
  uint16_t* escaped[kScanClasses];
  for (int c = 0; c < kScanClasses; ++c) {
    seen[c] = st.seen[c];
    next[c] = st.next[c];
    count[c] = st.changes[c];
    escapes[c] = st.escapes[c];
    gaps[c] = s.gaps[c];
    diffs[c] = s.diffs[c];
    escaped[c] = s.escapes[c];
  }
  uint16_t* const old_out = s.old_values;
  uint64_t n_old = st.old_values;
  uint64_t* const changed_words = s.changed_words;
  const uint8_t* const current = static_cast<const uint8_t*>(s.current);
  const size_t elem_size = kF32 ? 4 : 2;
  size_t result = s.n;
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
  __m512i want[kScanClasses];
  for (int c = 0; c < kScanClasses; ++c) want[c] = _mm512_set1_epi8(static_cast<char>(c));
#endif
  for (size_t start = 0; start < s.n; start += kScanBlock) {
    const size_t len = std::min(kScanBlock, s.n - start);
    uint16_t* HWY_RESTRICT pub = s.published + start;
    // Two blocks ahead: the per-change work between loads is enough to let
    // the hardware prefetcher fall behind. Spread over the block's words
    // (below): a burst of a whole block's lines would wait for free fill
    // buffers, and the work behind it with it.
    const bool prefetch = start + 3 * kScanBlock <= s.n;
    // (Formed only within the span: a pointer beyond its end would be undefined.)
    const uint8_t* const cur_ahead = prefetch ? current + (start + 2 * kScanBlock) * elem_size : current;
    const auto* const pub_ahead = reinterpret_cast<const uint8_t*>(prefetch ? pub + 2 * kScanBlock : pub);
    if constexpr (kRaw) {
      // The block's pass leaves its changes packed and the new values
      // stored; per change what is left is its class stream's entry.
      size_t n_changed = 0;
      const ScanBlockAhead ahead{prefetch ? cur_ahead : nullptr, elem_size, pub_ahead};
      uint64_t seen_end[kScanClasses];
      uint16_t* const old_copy = old_out + n_old;  // the block's run of old values
      const ScanBlockOut out{changed_words + (start >> 6), seen_end, ranks, h_index, index0 + start, ch_classes, ch_diffs,
                             old_copy, h_new};
      const size_t first_bad = ScanBlockAvx512(pub, current + start * elem_size, kF32, len, seen, ahead, out, &n_changed);
      if (first_bad < len && s.check_finite) [[unlikely]] {
        // The block untouched (its old values past n_old are left as scratch).
        for (size_t i = 0; i < n_changed; ++i) pub[h_index[i] - (index0 + start)] = old_copy[i];
        result = start + first_bad;
        break;
      }
      for (size_t i = 0; i < n_changed; ++i) {
        const int c = ch_classes[i];
        const uint64_t rank = ranks[i];
        const uint64_t k = count[c]++;
        PrefetchForWrite(gaps[c] + k, kGapsAhead);
        PrefetchForWrite(diffs[c] + k, kDiffsAhead);
        gaps[c][k] = static_cast<uint32_t>(rank - next[c]);
        next[c] = rank + 1;
        const uint8_t d = ch_diffs[i];
        diffs[c][k] = d;
        if (HWY_UNLIKELY(d == compact::kEscape)) escaped[c][escapes[c]++] = h_new[i];
      }
      n_old += n_changed;
      std::memcpy(seen, seen_end, sizeof(seen));
      if (n_changed > 0) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
        // Whole vectors of 8 (HashTermDiffs16's lanes here): the entries
        // past the changes get equal old and new values (0), so they add
        // nothing whatever their index, and no scalar tail runs. (The old
        // values' run has room past its count: kScanOldSlack.)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(h_new + n_changed), _mm_setzero_si128());
        _mm_storeu_si128(reinterpret_cast<__m128i*>(old_copy + n_changed), _mm_setzero_si128());
        HashTermDiffs16(h_index, reinterpret_cast<const uint8_t*>(h_new), reinterpret_cast<const uint8_t*>(old_copy),
                        (n_changed + 7) & ~size_t{7}, s.seed, st.hash);
#endif
      }
    } else {
      int lo = kScanClasses - 1, hi = 0;
      bool bad;
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
      bad = ClassifyBlock32<kF32>(pub, current + start * elem_size, len, fresh, words, cls, lo, hi);
#elif HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86_64
      bad = ClassifyBlockAvx2<kF32>(pub, current + start * elem_size, len, fresh, words, cls, lo, hi);
#else
      bad = ClassifyBlock<kF32>(pub, current + start * elem_size, len, fresh, words, cls, lo, hi);
#endif
      if (bad && s.check_finite) {
        size_t k = 0;
        while (k < len && !bf16::IsNonFinite(fresh[k], bf16::kBf16ExpMask)) ++k;
        if (k < len) {
          result = start + k;
          break;
        }
      }
      size_t h = 0;
      const uint16_t* const h_old = old_out + n_old;
      const size_t n_words = (len + 63) / 64;
      // Element e of the block changed; its class c, its rank among the
      // chunk's class-c elements.
      const auto emit = [&](size_t e, int c, uint64_t rank) {
        const uint64_t k = count[c]++;
        PrefetchForWrite(gaps[c] + k, kGapsAhead);
        PrefetchForWrite(diffs[c] + k, kDiffsAhead);
        gaps[c][k] = static_cast<uint32_t>(rank - next[c]);
        next[c] = rank + 1;
        const uint16_t old_bits = pub[e], new_bits = fresh[e];
        const uint8_t d = compact::DiffByte(old_bits, new_bits);
        diffs[c][k] = d;
        if (HWY_UNLIKELY(d == compact::kEscape)) escaped[c][escapes[c]++] = new_bits;
        old_out[n_old++] = old_bits;
        pub[e] = new_bits;
        h_index[h] = index0 + start + e;
        h_new[h] = new_bits;
        ++h;
      };
      for (size_t w = 0; w < n_words; ++w) {
        if (prefetch) {
          PrefetchWordShare(cur_ahead, elem_size, pub_ahead, w);
        }
        uint64_t mask[kScanClasses];
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
        // One compare per class present in the block, straight into a mask
        // register: no other class's mask or count is ever used.
        const __m512i x = _mm512_loadu_si512(cls + 64 * w);
        for (int c = lo; c <= hi; ++c) mask[c] = static_cast<uint64_t>(_mm512_cmpeq_epi8_mask(x, want[c]));
#elif HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86_64
        // The same on AVX2: two compares and two movemasks per class present,
        // straight into the mask (no store and reload of mask bytes).
        const __m256i x0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(cls + 64 * w));
        const __m256i x1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(cls + 64 * w + 32));
        for (int c = lo; c <= hi; ++c) {
          const __m256i want_c = _mm256_set1_epi8(static_cast<char>(c));
          mask[c] = static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(x0, want_c))) |
                    static_cast<uint64_t>(static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_cmpeq_epi8(x1, want_c))))
                        << 32;
        }
#else
        ClassMasks(cls + 64 * w, mask);
#endif
        uint64_t bits = words[w];
        changed_words[(start >> 6) + w] = bits;
        for (; bits != 0; bits &= bits - 1) {
          const unsigned j = static_cast<unsigned>(__builtin_ctzll(bits));
          const size_t e = 64 * w + j;
          const int c = cls[e];
          emit(e, c, seen[c] + static_cast<uint64_t>(__builtin_popcountll(mask[c] & ((uint64_t{1} << j) - 1))));
        }
#if (HWY_TARGET <= HWY_AVX3 || HWY_TARGET == HWY_AVX2) && HWY_ARCH_X86_64
        for (int c = lo; c <= hi; ++c) seen[c] += static_cast<uint64_t>(__builtin_popcountll(mask[c]));
#else
        for (int c = 0; c < kScanClasses; ++c) seen[c] += static_cast<uint64_t>(__builtin_popcountll(mask[c]));
#endif
      }
      if (h > 0) {
        HashTermDiffs16(h_index, reinterpret_cast<const uint8_t*>(h_new), reinterpret_cast<const uint8_t*>(h_old), h,
                        s.seed, st.hash);
      }
    }
  }
  for (int c = 0; c < kScanClasses; ++c) {
    st.seen[c] = seen[c];
    st.next[c] = next[c];
    st.changes[c] = count[c];
    st.escapes[c] = escapes[c];
  }
  st.old_values = n_old;
  return result;
}

#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
// ScanLoop with its raw first pass, kept out of line (each loop is large).
HWY_NOINLINE size_t ScanLoopRaw(const CompactScanSpan& span, CompactScanState& state) {
  return span.f32 ? ScanLoop<true, true>(span, state) : ScanLoop<false, true>(span, state);
}
#endif

size_t ScanCompactSpanImpl(const CompactScanSpan& span, CompactScanState& state) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86_64
  // Where the CPU has VBMI, VBMI2, GFNI, BITALG, VPOPCNTDQ and BF16: every
  // class's masks and counts of a word in one pass (same results).
  if (HasCompactScanAvx512()) return ScanLoopRaw(span, state);
#endif
  return span.f32 ? ScanLoop<true, false>(span, state) : ScanLoop<false, false>(span, state);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
}  // namespace deltasync::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deltasync::kernels {

HWY_EXPORT(ScanCompactSpanImpl);

size_t ScanCompactSpan(const CompactScanSpan& span, CompactScanState& state) {
  return HWY_DYNAMIC_DISPATCH(ScanCompactSpanImpl)(span, state);
}

}  // namespace deltasync::kernels
#endif  // HWY_ONCE
