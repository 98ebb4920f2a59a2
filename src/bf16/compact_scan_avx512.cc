// ScanBlockAvx512 (compact_scan_avx512.h). Per 64-element word, 512-bit
// vectors:
//  1. the new values: fp32 rounded 32 at a time by VCVTNE2PS2BF16, which
//     rounds to nearest even exactly as bf16::RoundFp32ToBf16 does, except
//     for NaN (it keeps the payload) and denormals (it flushes them to
//     zero): a word holding either (VFPCLASSPS, rare) is rounded element by
//     element instead;
//  2. the changed bits (u16 compares) and the Inf/NaN check;
//  3. the class bytes (class_bytes_avx512.h: one VPERMT2B of the exponent
//     bytes, then min(e -sat 112, 15));
//  4. every class's mask at once (one-hot bytes, GF2P8AFFINEQB transposes,
//     an 8 x 8 byte transpose: ClassMasks64) and the running counts as two
//     vectors of u64 (VPOPCNTQ of the masks); each change's rank from them,
//     8 changes at a time (VPERMT2Q of the masks and counts by class,
//     VPSLLVQ, VPOPCNTQ), and its flat index beside it;
//  5. the changes packed in element order by VPCOMPRESSB/W (into registers,
//     then stored whole: a compress straight to memory is slow on Zen 4):
//     class bytes, old and new values; and the new values stored into the
//     base (masked stores, changed elements only).
// After the block's words, the diff bytes (compact::DiffByte on 32 u16
// lanes) of its changes, 32 at a time from the packed old and new values.
// The scan's per-change loop then only appends each change to its class's
// gap and diff streams: no compare, popcount or add per class per word, and
// no per-change rank, diff byte, load of the values, or store of the old
// value, the new value or the hash inputs.
#include "bf16/compact_scan_avx512.h"

#include "bf16/class_counts_avx512.h"
#include "bf16/raw_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "bf16/class_bytes_avx512.h"
#include "bf16/prefetch.h"
#include "bf16/round.h"
#include "bf16/round_avx512.h"
#endif

namespace deltasync::kernels {

bool HasCompactScanAvx512() { return CpuHasCompactScanAvx512() && RawKernelsAllowed(); }

#if defined(__x86_64__)

bool CpuHasCompactScanAvx512() {
  static const bool has = CpuHasClassCountsAvx512() && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vbmi2") && __builtin_cpu_supports("avx512vpopcntdq") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
}

DS_AVX512_WARNINGS_PUSH

#define DS_AVX512_SCAN                                                                                         \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512vbmi2,gfni,avx512bitalg," \
                        "avx512vpopcntdq,avx512bf16,bmi2,popcnt")))

namespace {

// The diff bytes (compact::DiffByte) of 32 changes on u16 lanes, base
// values in p and new ones in r, in the low byte of each lane: kEscape
// where the sign changes or either is Inf/NaN (non_finite: r's), else the
// zigzag of r - p, kEscape from 255 on. Same sign and both finite, r - p
// fits in 16 bits and so does its zigzag.
DS_AVX512_SCAN inline __m512i DiffBytes32(__m512i p, __m512i r, __mmask32 non_finite) {
  const __m512i exp = _mm512_set1_epi16(static_cast<short>(bf16::kBf16ExpMask));
  const __m512i escape = _mm512_set1_epi16(0xFF);
  const __mmask32 special = _mm512_test_epi16_mask(_mm512_xor_si512(p, r), _mm512_set1_epi16(static_cast<short>(0x8000))) |
                            _mm512_cmpeq_epi16_mask(_mm512_and_si512(p, exp), exp) | non_finite;
  const __m512i d = _mm512_sub_epi16(r, p);
  const __m512i z = _mm512_xor_si512(_mm512_slli_epi16(d, 1), _mm512_srai_epi16(d, 15));
  return _mm512_mask_mov_epi16(_mm512_min_epu16(z, escape), special, escape);
}

// The n entries of v (u16 lanes) where `keep`, packed, at dst: the scratch
// form (a whole vector stored; room past them).
DS_AVX512_SCAN inline void Compress16(uint16_t* dst, __mmask32 keep, __m512i v) {
  _mm512_storeu_si512(dst, _mm512_maskz_compress_epi16(keep, v));
}

}  // namespace

DS_AVX512_SCAN size_t ScanBlockAvx512(uint16_t* pub, const void* cur, bool f32, size_t len, const uint64_t* seen_in,
                                      const ScanBlockAhead& ahead, const ScanBlockOut& out, size_t* changed) {
  const __m512i exp = _mm512_set1_epi16(static_cast<short>(bf16::kBf16ExpMask));
  const __m512i byte_iota = _mm512_set_epi64(0x3F3E3D3C3B3A3938ll, 0x3736353433323130ll, 0x2F2E2D2C2B2A2928ll,
                                             0x2726252423222120ll, 0x1F1E1D1C1B1A1918ll, 0x1716151413121110ll,
                                             0x0F0E0D0C0B0A0908ll, 0x0706050403020100ll);
  const __m512i c64 = _mm512_set1_epi64(64);
  // In locals: the stores through them could alias `out` itself.
  uint64_t* const out_words = out.words;
  uint64_t* const out_ranks = out.ranks;
  uint64_t* const out_indices = out.indices;
  uint8_t* const out_classes = out.classes;
  uint8_t* const out_diffs = out.diffs;
  uint16_t* const out_old = out.old_values;
  uint16_t* const out_new = out.new_values;
  size_t n_changed = 0;
  __m512i seen_low = _mm512_loadu_si512(seen_in), seen_high = _mm512_loadu_si512(seen_in + 8);
  size_t first_bad = len;
  const size_t n_words = (len + 63) / 64;
  for (size_t w = 0; w < n_words; ++w) {
    const size_t at = 64 * w;
    // Into L2 (prefetcht2): the same lines prefetched into L1 made the
    // scan 15-20% slower (docs/benchmarks.md, session 35; presumably as L1
    // also holds the block at hand, its packed outputs and the class
    // streams' lines).
    if (ahead.cur != nullptr) PrefetchWordShare<1>(ahead.cur, ahead.elem_size, ahead.pub, w);
    const __mmask64 valid = len - at >= 64 ? ~__mmask64{0} : _bzhi_u64(~uint64_t{0}, static_cast<unsigned>(len - at));
    const auto valid_low = static_cast<__mmask32>(valid), valid_high = static_cast<__mmask32>(valid >> 32);
    __m512i r0, r1;
    if (f32) {
      const auto* c = static_cast<const uint32_t*>(cur) + at;
      __mmask16 special = 0;
      r0 = avx512::RoundWord32(c, valid_low, &special);
      r1 = avx512::RoundWord32(c + 32, valid_high, &special);
      if (special != 0) [[unlikely]] {
        alignas(64) uint16_t rounded[64];
        for (size_t k = 0; k < 64; ++k) rounded[k] = at + k < len ? bf16::RoundFp32ToBf16(bf16::LoadElement(c, k)) : 0;
        r0 = _mm512_load_si512(rounded);
        r1 = _mm512_load_si512(rounded + 32);
      }
    } else {
      const auto* c = static_cast<const uint16_t*>(cur) + at;
      r0 = _mm512_maskz_loadu_epi16(valid_low, c);
      r1 = _mm512_maskz_loadu_epi16(valid_high, c + 32);
    }
    uint16_t* const p = pub + at;
    const __m512i p0 = _mm512_maskz_loadu_epi16(valid_low, p);
    const __m512i p1 = _mm512_maskz_loadu_epi16(valid_high, p + 32);
    const __mmask32 changed0 = _mm512_cmpneq_epu16_mask(r0, p0), changed1 = _mm512_cmpneq_epu16_mask(r1, p1);
    const __mmask64 changed64 = uint64_t{changed0} | uint64_t{changed1} << 32;
    out_words[w] = changed64;
    const __mmask32 bad0 = _mm512_cmpeq_epi16_mask(_mm512_and_si512(r0, exp), exp);
    const __mmask32 bad1 = _mm512_cmpeq_epi16_mask(_mm512_and_si512(r1, exp), exp);
    if ((bad0 | bad1) != 0 && first_bad == len) [[unlikely]] {
      first_bad = at + static_cast<size_t>(__builtin_ctzll(uint64_t{bad0} | uint64_t{bad1} << 32));
    }
    // The class bytes, masks and running counts.
    const __m512i c = avx512::ClassBytesOf(p0, p1, valid);
    __m512i mask_low, mask_high;
    avx512::ClassMasks64(c, &mask_low, &mask_high);
    // The changes, packed in element order: each one's class byte (64
    // lanes at once), old and new value (32 at once).
    __m512i classes = _mm512_maskz_compress_epi8(changed64, c);
    _mm512_storeu_si512(out_classes + n_changed, classes);
    // Their ranks and flat indices, 8 at a time (once unless the word has
    // more than 8 changes): the count of their class before the word, plus
    // the class's elements before them in it (its mask shifted left by 64 -
    // position: VPSLLVQ gives 0 from 64 on); the word's first index plus
    // the position.
    __m512i positions = _mm512_maskz_compress_epi8(changed64, byte_iota);
    const size_t n_word = static_cast<size_t>(__builtin_popcountll(changed64));
    const __m512i word_index = _mm512_set1_epi64(static_cast<long long>(out.index_base + at));
    for (size_t g = 0;;) {
      const __m512i cl = _mm512_maskz_cvtepu8_epi64(0xFF, _mm512_castsi512_si128(classes));
      const __m512i j = _mm512_maskz_cvtepu8_epi64(0xFF, _mm512_castsi512_si128(positions));
      const __m512i m = _mm512_permutex2var_epi64(mask_low, cl, mask_high);
      const __m512i before = _mm512_permutex2var_epi64(seen_low, cl, seen_high);
      const __m512i below = _mm512_popcnt_epi64(_mm512_sllv_epi64(m, _mm512_sub_epi64(c64, j)));
      _mm512_storeu_si512(out_ranks + n_changed + g, _mm512_add_epi64(before, below));
      _mm512_storeu_si512(out_indices + n_changed + g, _mm512_add_epi64(word_index, j));
      g += 8;
      if (g >= n_word) break;
      classes = _mm512_maskz_compress_epi8(~__mmask64{0xFF}, classes);
      positions = _mm512_maskz_compress_epi8(~__mmask64{0xFF}, positions);
    }
    seen_low = _mm512_add_epi64(seen_low, _mm512_popcnt_epi64(mask_low));
    seen_high = _mm512_add_epi64(seen_high, _mm512_popcnt_epi64(mask_high));
    const size_t n0 = static_cast<size_t>(__builtin_popcount(changed0));
    // Whole vectors: the entries past the changes are overwritten by the
    // next word's (the caller gives room past its count).
    Compress16(out_old + n_changed, changed0, p0);
    Compress16(out_old + n_changed + n0, changed1, p1);
    Compress16(out_new + n_changed, changed0, r0);
    Compress16(out_new + n_changed + n0, changed1, r1);
    // The new values into the base, changed elements only.
    _mm512_mask_storeu_epi16(p, changed0, r0);
    _mm512_mask_storeu_epi16(p + 32, changed1, r1);
    n_changed += n_word;
  }
  // The diff bytes from the packed old and new values, 32 changes a step
  // (not per word: a word has about 2 changes at a realistic rate).
  for (size_t i = 0; i < n_changed; i += 32) {
    const __mmask32 m = n_changed - i >= 32 ? ~__mmask32{0} : _bzhi_u32(~0u, static_cast<unsigned>(n_changed - i));
    const __m512i o = _mm512_maskz_loadu_epi16(m, out_old + i);
    const __m512i r = _mm512_maskz_loadu_epi16(m, out_new + i);
    const __mmask32 non_finite = _mm512_cmpeq_epi16_mask(_mm512_and_si512(r, exp), exp);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out_diffs + i), _mm512_cvtepi16_epi8(DiffBytes32(o, r, non_finite)));
  }
  _mm512_storeu_si512(out.seen_end, seen_low);
  _mm512_storeu_si512(out.seen_end + 8, seen_high);
  *changed = n_changed;
  return first_bad;
}

#undef DS_AVX512_SCAN
DS_AVX512_WARNINGS_POP

#else  // !__x86_64__

bool CpuHasCompactScanAvx512() { return false; }

size_t ScanBlockAvx512(uint16_t*, const void*, bool, size_t len, const uint64_t*, const ScanBlockAhead&,
                       const ScanBlockOut&, size_t* changed) {
  *changed = 0;
  return len;
}

#endif

}  // namespace deltasync::kernels
