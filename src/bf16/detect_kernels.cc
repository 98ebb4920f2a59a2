// SIMD kernels: fp32 -> bf16 rounding, finiteness, change detection into
// index and value lists (the gaps route is detect_gaps_kernels.cc).
//
// Highway compiles this file once per target (foreach_target.h re-includes
// it); HWY_EXPORT/HWY_DYNAMIC_DISPATCH at the bottom pick one at run time.
// Every loop ends with a scalar tail that uses the same scalar definitions
// (round.h), so results never depend on the target or on n's remainder.

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bf16/prefetch.h"
#include "bf16/raw_kernels.h"
#include "bf16/round.h"
#include "bf16/simd_kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bf16/detect_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "bf16/kernels-inl.h"

HWY_BEFORE_NAMESPACE();
namespace deltasync::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Returns whether any element was non-finite after rounding.
template <bool kCheck>
HWY_INLINE bool ConvertLoop(const uint32_t* HWY_RESTRICT src, uint16_t* HWY_RESTRICT dst,
                            size_t n) {
  const hn::ScalableTag<uint32_t> d32;
  const hn::RebindToSigned<decltype(d32)> di32;
  const hn::Rebind<uint16_t, decltype(d32)> d16;
  const size_t N = hn::Lanes(d32);
  const auto exp = hn::Set(d32, uint32_t{bf16::kBf16ExpMask});
  auto bad = hn::FirstN(d32, 0);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto r = RoundToBf16(d32, hn::LoadU(d32, src + i));
    // Results are < 2^16, so the saturating i32 -> u16 demotion is exact.
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di32, r)), d16, dst + i);
    if (kCheck) bad = hn::Or(bad, hn::Eq(hn::And(r, exp), exp));
  }
  bool any_bad = kCheck && !hn::AllFalse(d32, bad);
  for (; i < n; ++i) {
    dst[i] = bf16::RoundFp32ToBf16(bf16::LoadElement(src, i));
    if (kCheck) any_bad |= bf16::IsNonFinite(dst[i], bf16::kBf16ExpMask);
  }
  return any_bad;
}

template <typename T>
HWY_INLINE size_t FindNonFiniteT(const T* HWY_RESTRICT data, size_t n, T exp_mask) {
  const hn::ScalableTag<T> d;
  const size_t N = hn::Lanes(d);
  const auto exp = hn::Set(d, exp_mask);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto bad = hn::Eq(hn::And(hn::LoadU(d, data + i), exp), exp);
    if (!hn::AllFalse(d, bad)) return i + hn::FindKnownFirstTrue(d, bad);
  }
  for (; i < n; ++i) {
    if (bf16::IsNonFinite(bf16::LoadElement(data, i), exp_mask)) return i;
  }
  return n;
}

// Change detection runs in blocks of kBlock elements, in two passes:
//  1. vector compares of the whole block -> a bitmap of changed elements
//     (for fp32 input also the rounded bf16 values, in a block array);
//  2. the bitmap's set bits -> indices and values.
// Pass 1 streams through memory with no data-dependent branch, so loads
// keep flowing. Pass 2 emits each 64-bit word with a fixed number of
// unconditional stores (kEmitPerWord): at realistic change rates (a few
// percent, about two changes per word) it never branches on the data, where
// a loop over set bits would mispredict about once per word.
constexpr size_t kBlock = 1024;
constexpr size_t kWords = kBlock / 64;
constexpr size_t kEmitPerWord = 8;  // the output slack callers provide
static_assert(kEmitPerWord <= kCompareOutputSlack);

// Emits the changes of `bits` exactly, one bit at a time: the last, partial
// word of a call (only its existing elements are read), and the changes past
// the eighth of a dense full word.
template <typename V>
HWY_INLINE size_t EmitPartialWord(uint64_t bits, uint64_t index0, const V* HWY_RESTRICT values,
                                  uint64_t* HWY_RESTRICT idx_out, V* HWY_RESTRICT val_out,
                                  size_t count) {
  for (; bits != 0; bits &= bits - 1) {
    const size_t t = static_cast<size_t>(__builtin_ctzll(bits));
    idx_out[count] = index0 + t;
    val_out[count++] = bf16::LoadElement(values, t);
  }
  return count;
}

// Emits the changes of a word of 64 elements that all exist (values[0..63]
// are readable). Slots past the word's real count get scratch writes, which
// the caller's slack absorbs and later words overwrite.
template <typename V>
HWY_INLINE size_t EmitFullWord(uint64_t bits, uint64_t index0, const V* HWY_RESTRICT values,
                               uint64_t* HWY_RESTRICT idx_out, V* HWY_RESTRICT val_out,
                               size_t count) {
  const size_t total = static_cast<size_t>(__builtin_popcountll(bits));
  for (size_t k = 0; k < kEmitPerWord; ++k) {
    // Once bits runs out, bit 63 stands in: ctz stays defined, reads stay in range.
    const size_t t = static_cast<size_t>(__builtin_ctzll(bits | (uint64_t{1} << 63)));
    idx_out[count + k] = index0 + t;
    val_out[count + k] = bf16::LoadElement(values, t);
    bits &= bits - 1;
  }
  if (bits != 0) EmitPartialWord(bits, index0, values, idx_out, val_out, count + kEmitPerWord);  // dense words only
  return count + total;
}

// The same for 16-bit values (bf16, and fp32 rounded to bf16: the hot
// case), the eight value slots written as two 64-bit stores. Written as
// above, GCC packs the eight 16-bit loads into a vector through the stack,
// and each packing load that spans two just-stored halves stalls on store
// forwarding: that made the emit cost more than the compare it follows.
HWY_INLINE size_t EmitFullWord(uint64_t bits, uint64_t index0, const uint16_t* HWY_RESTRICT values,
                               uint64_t* HWY_RESTRICT idx_out, uint16_t* HWY_RESTRICT val_out,
                               size_t count) {
  const size_t total = static_cast<size_t>(__builtin_popcountll(bits));
  uint64_t packed[2] = {0, 0};
  for (size_t k = 0; k < kEmitPerWord; ++k) {
    // Once bits runs out, bit 63 stands in: ctz stays defined, reads stay in range.
    const size_t t = static_cast<size_t>(__builtin_ctzll(bits | (uint64_t{1} << 63)));
    idx_out[count + k] = index0 + t;
    packed[k / 4] |= uint64_t{bf16::LoadElement(values, t)} << (16 * (k % 4));
    bits &= bits - 1;
  }
  std::memcpy(val_out + count, packed, sizeof(packed));
  if (bits != 0) EmitPartialWord(bits, index0, values, idx_out, val_out, count + kEmitPerWord);  // dense words only
  return count + total;
}
static_assert(kEmitPerWord == 8, "the 16-bit emit packs eight values into two words");


// No prefetches (EmitBlock's `ahead` for the same-width compares).
struct NoPrefetch {
  void operator()(size_t) const {}
};

// Pass 2 over one block's bitmap; `values` holds the block's new values.
// ahead(w) runs before word w's emit (and for every word of a block without
// changes): a caller's prefetches, spread between the emits.
template <typename V, typename Ahead = NoPrefetch>
HWY_INLINE size_t EmitBlock(const uint8_t* bitmap, size_t len, uint64_t index0,
                            const V* HWY_RESTRICT values, uint64_t* HWY_RESTRICT idx_out,
                            V* HWY_RESTRICT val_out, size_t count, const Ahead& ahead = {}) {
  uint64_t words[kWords];
  std::memcpy(words, bitmap, sizeof(words));
  uint64_t any = 0;
  for (size_t w = 0; w < kWords; ++w) any |= words[w];
  const size_t n_words = (len + 63) / 64;
  if (any == 0) {  // common when nothing changed: skip the stores
    for (size_t w = 0; w < n_words; ++w) ahead(w);
    return count;
  }
  for (size_t w = 0; w < n_words; ++w) {
    ahead(w);
    if (64 * (w + 1) <= len) {
      count = EmitFullWord(words[w], index0 + 64 * w, values + 64 * w, idx_out, val_out, count);
    } else {
      count = EmitPartialWord(words[w], index0 + 64 * w, values + 64 * w, idx_out, val_out, count);
    }
  }
  return count;
}

// cur vs pub for same-width elements. The finiteness check ORs per-vector
// masks and looks only at the end: the rare failing call then locates the
// first bad element.
template <typename T, bool kCheck>
HWY_INLINE size_t CompareLoop(const T* HWY_RESTRICT pub, const T* HWY_RESTRICT cur, size_t n,
                              uint64_t base, T exp_mask, uint64_t* HWY_RESTRICT idx_out,
                              T* HWY_RESTRICT val_out, size_t* first_bad) {
  const hn::ScalableTag<T> d;
  const size_t N = hn::Lanes(d);
  const auto exp = hn::Set(d, exp_mask);
  auto bad = hn::FirstN(d, 0);
  bool any_bad = false;
  size_t count = 0;
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t len = std::min(kBlock, n - start);
    const T* HWY_RESTRICT p = pub + start;
    const T* HWY_RESTRICT c = cur + start;
    HWY_ALIGN uint8_t bitmap[kBlock / 8] = {};
    size_t i = 0;
    for (; i + N <= len; i += N) {
      const auto cv = hn::LoadU(d, c + i);
      if (kCheck) bad = hn::Or(bad, hn::Eq(hn::And(cv, exp), exp));
      SetMaskBits(d, hn::Ne(cv, hn::LoadU(d, p + i)), i, bitmap);
    }
    for (; i < len; ++i) {
      const T cv = bf16::LoadElement(c, i);
      if (kCheck) any_bad |= bf16::IsNonFinite(cv, exp_mask);
      bitmap[i / 8] |= static_cast<uint8_t>((cv != bf16::LoadElement(p, i)) << (i % 8));
    }
    count = EmitBlock(bitmap, len, base + start, c, idx_out, val_out, count);
  }
  any_bad |= kCheck && !hn::AllFalse(d, bad);
  *first_bad = any_bad ? FindNonFiniteT(cur, n, exp_mask) : n;
  return count;
}

template <typename T>
HWY_INLINE size_t CompareT(const T* pub, const T* cur, size_t n, uint64_t base, T exp_mask,
                           uint64_t* idx_out, T* val_out, size_t* first_bad) {
  if (exp_mask == 0)
    return CompareLoop<T, false>(pub, cur, n, base, 0, idx_out, val_out, first_bad);
  return CompareLoop<T, true>(pub, cur, n, base, exp_mask, idx_out, val_out, first_bad);
}

// bf16 pub vs fp32 cur rounded to bf16. Compares in u32 lanes (pub widened)
// and keeps the rounded block in `rounded` for pass 2.
template <bool kCheck>
HWY_INLINE size_t CompareF32Loop(const uint16_t* HWY_RESTRICT pub, const uint32_t* HWY_RESTRICT cur,
                                 size_t n, uint64_t base, uint64_t* HWY_RESTRICT idx_out,
                                 uint16_t* HWY_RESTRICT val_out, size_t* first_bad) {
  const hn::ScalableTag<uint32_t> d32;
  const hn::RebindToSigned<decltype(d32)> di32;
  const hn::Rebind<uint16_t, decltype(d32)> d16;
  const size_t N = hn::Lanes(d32);
  const auto exp = hn::Set(d32, uint32_t{bf16::kBf16ExpMask});
  auto bad = hn::FirstN(d32, 0);
  bool any_bad = false;
  size_t count = 0;
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t len = std::min(kBlock, n - start);
    const uint16_t* HWY_RESTRICT p = pub + start;
    const uint32_t* HWY_RESTRICT c = cur + start;
    // Two blocks ahead, as the fused scan does (compact_scan_kernels.cc): the
    // emit pass between the loads lets the hardware prefetcher fall behind.
    // Spread over the emit's words (a word's share: 64 elements of each): a
    // burst of the block's 96 lines waited for free fill buffers.
    const bool prefetch = start + 3 * kBlock <= n;
    const auto* c_ahead = reinterpret_cast<const uint8_t*>(prefetch ? c + 2 * kBlock : c);
    const auto* p_ahead = reinterpret_cast<const uint8_t*>(prefetch ? p + 2 * kBlock : p);
    const auto ahead = [&](size_t w) {
      if (!prefetch) return;
      PrefetchWordShare(c_ahead, sizeof(uint32_t), p_ahead, w);
    };
    HWY_ALIGN uint8_t bitmap[kBlock / 8] = {};
    HWY_ALIGN uint16_t rounded[kBlock];
    size_t i = 0;
#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86_64
    // 32 elements a step on u16 lanes: one movemask per 32 bitmap bits.
    const __m256i exp16 = _mm256_set1_epi16(static_cast<short>(bf16::kBf16ExpMask));
    __m256i bad16 = _mm256_setzero_si256();
    for (; i + 32 <= len; i += 32) {
      const __m256i r0 = RoundToBf16x16(c + i), r1 = RoundToBf16x16(c + i + 16);
      const __m256i p0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
      const __m256i p1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 16));
      if (kCheck) bad16 = OrNonFinite16(bad16, r0, r1, exp16);
      const uint32_t changed = DiffBits32(r0, r1, p0, p1);
      std::memcpy(bitmap + i / 8, &changed, 4);
      _mm256_store_si256(reinterpret_cast<__m256i*>(rounded + i), r0);
      _mm256_store_si256(reinterpret_cast<__m256i*>(rounded + i + 16), r1);
    }
    if (kCheck) any_bad |= !_mm256_testz_si256(bad16, bad16);
#endif
    for (; i + N <= len; i += N) {
      const auto r = RoundToBf16(d32, hn::LoadU(d32, c + i));
      if (kCheck) bad = hn::Or(bad, hn::Eq(hn::And(r, exp), exp));
      SetMaskBits(d32, hn::Ne(r, hn::PromoteTo(d32, hn::LoadU(d16, p + i))), i, bitmap);
      hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di32, r)), d16, rounded + i);
    }
    for (; i < len; ++i) {
      rounded[i] = bf16::RoundFp32ToBf16(bf16::LoadElement(c, i));
      if (kCheck) any_bad |= bf16::IsNonFinite(rounded[i], bf16::kBf16ExpMask);
      bitmap[i / 8] |= static_cast<uint8_t>((rounded[i] != bf16::LoadElement(p, i)) << (i % 8));
    }
    count = EmitBlock(bitmap, len, base + start, rounded, idx_out, val_out, count, ahead);
  }
  any_bad |= kCheck && !hn::AllFalse(d32, bad);
  *first_bad = any_bad ? FirstNonFiniteRounded(cur, n) : n;
  return count;
}

// ---- exported (one symbol per target) ----

void ConvertF32ToBf16Impl(const uint32_t* src, uint16_t* dst, size_t n) {
  ConvertLoop<false>(src, dst, n);
}
size_t ConvertF32ToBf16CheckedImpl(const uint32_t* src, uint16_t* dst, size_t n) {
  if (!ConvertLoop<true>(src, dst, n)) return n;
  return FindNonFiniteT<uint16_t>(dst, n, bf16::kBf16ExpMask);
}
size_t FindNonFinite16Impl(const uint16_t* data, size_t n, uint16_t exp_mask) {
  return FindNonFiniteT(data, n, exp_mask);
}
size_t FindNonFinite32Impl(const uint32_t* data, size_t n, uint32_t exp_mask) {
  return FindNonFiniteT(data, n, exp_mask);
}
size_t FindNonFinite64Impl(const uint64_t* data, size_t n, uint64_t exp_mask) {
  return FindNonFiniteT(data, n, exp_mask);
}
size_t Compare8Impl(const uint8_t* pub, const uint8_t* cur, size_t n, uint64_t base,
                    uint64_t* idx_out, uint8_t* val_out) {
  size_t unused;
  return CompareLoop<uint8_t, false>(pub, cur, n, base, 0, idx_out, val_out, &unused);
}
size_t Compare16Impl(const uint16_t* pub, const uint16_t* cur, size_t n, uint64_t base,
                     uint16_t exp_mask, uint64_t* idx_out, uint16_t* val_out, size_t* first_bad) {
  return CompareT(pub, cur, n, base, exp_mask, idx_out, val_out, first_bad);
}
size_t Compare32Impl(const uint32_t* pub, const uint32_t* cur, size_t n, uint64_t base,
                     uint32_t exp_mask, uint64_t* idx_out, uint32_t* val_out, size_t* first_bad) {
  return CompareT(pub, cur, n, base, exp_mask, idx_out, val_out, first_bad);
}
size_t Compare64Impl(const uint64_t* pub, const uint64_t* cur, size_t n, uint64_t base,
                     uint64_t exp_mask, uint64_t* idx_out, uint64_t* val_out, size_t* first_bad) {
  return CompareT(pub, cur, n, base, exp_mask, idx_out, val_out, first_bad);
}
size_t CompareF32ToBf16Impl(const uint16_t* pub, const uint32_t* cur, size_t n, uint64_t base,
                            bool check_finite, uint64_t* idx_out, uint16_t* val_out,
                            size_t* first_bad) {
  if (check_finite) return CompareF32Loop<true>(pub, cur, n, base, idx_out, val_out, first_bad);
  return CompareF32Loop<false>(pub, cur, n, base, idx_out, val_out, first_bad);
}
int64_t TargetImpl() { return HWY_TARGET; }

}  // namespace deltasync::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace deltasync::kernels {

HWY_EXPORT(ConvertF32ToBf16Impl);
HWY_EXPORT(ConvertF32ToBf16CheckedImpl);
HWY_EXPORT(FindNonFinite16Impl);
HWY_EXPORT(FindNonFinite32Impl);
HWY_EXPORT(FindNonFinite64Impl);
HWY_EXPORT(Compare8Impl);
HWY_EXPORT(Compare16Impl);
HWY_EXPORT(Compare32Impl);
HWY_EXPORT(Compare64Impl);
HWY_EXPORT(CompareF32ToBf16Impl);
HWY_EXPORT(TargetImpl);

void ConvertF32ToBf16(const uint32_t* src, uint16_t* dst, size_t n) {
  HWY_DYNAMIC_DISPATCH(ConvertF32ToBf16Impl)(src, dst, n);
}
size_t ConvertF32ToBf16Checked(const uint32_t* src, uint16_t* dst, size_t n) {
  return HWY_DYNAMIC_DISPATCH(ConvertF32ToBf16CheckedImpl)(src, dst, n);
}
size_t FindNonFinite16(const uint16_t* data, size_t n, uint16_t exp_mask) {
  return HWY_DYNAMIC_DISPATCH(FindNonFinite16Impl)(data, n, exp_mask);
}
size_t FindNonFinite32(const uint32_t* data, size_t n, uint32_t exp_mask) {
  return HWY_DYNAMIC_DISPATCH(FindNonFinite32Impl)(data, n, exp_mask);
}
size_t FindNonFinite64(const uint64_t* data, size_t n, uint64_t exp_mask) {
  return HWY_DYNAMIC_DISPATCH(FindNonFinite64Impl)(data, n, exp_mask);
}
size_t Compare8(const uint8_t* pub, const uint8_t* cur, size_t n, uint64_t base, uint64_t* idx_out,
                uint8_t* val_out) {
  return HWY_DYNAMIC_DISPATCH(Compare8Impl)(pub, cur, n, base, idx_out, val_out);
}
size_t Compare16(const uint16_t* pub, const uint16_t* cur, size_t n, uint64_t base,
                 uint16_t exp_mask, uint64_t* idx_out, uint16_t* val_out, size_t* first_bad) {
  return HWY_DYNAMIC_DISPATCH(Compare16Impl)(pub, cur, n, base, exp_mask, idx_out, val_out,
                                             first_bad);
}
size_t Compare32(const uint32_t* pub, const uint32_t* cur, size_t n, uint64_t base,
                 uint32_t exp_mask, uint64_t* idx_out, uint32_t* val_out, size_t* first_bad) {
  return HWY_DYNAMIC_DISPATCH(Compare32Impl)(pub, cur, n, base, exp_mask, idx_out, val_out,
                                             first_bad);
}
size_t Compare64(const uint64_t* pub, const uint64_t* cur, size_t n, uint64_t base,
                 uint64_t exp_mask, uint64_t* idx_out, uint64_t* val_out, size_t* first_bad) {
  return HWY_DYNAMIC_DISPATCH(Compare64Impl)(pub, cur, n, base, exp_mask, idx_out, val_out,
                                             first_bad);
}
size_t CompareF32ToBf16(const uint16_t* pub, const uint32_t* cur, size_t n, uint64_t base,
                        bool check_finite, uint64_t* idx_out, uint16_t* val_out,
                        size_t* first_bad) {
  return HWY_DYNAMIC_DISPATCH(CompareF32ToBf16Impl)(pub, cur, n, base, check_finite, idx_out,
                                                    val_out, first_bad);
}

std::string ActiveTargetName() {
  const int64_t target = HWY_DYNAMIC_DISPATCH(TargetImpl)();
  std::string name = hwy::TargetName(target);
  if (!RawKernelsAllowed() && TargetRunsRawKernels(target)) name += kNoRawSuffix;
  return name;
}

namespace {

// hwy::SupportedTargets() (under SupportedAndGeneratedTargets) in Highway 1.0
// sets the chosen target before it adds the vector-size targets (SVE_256
// where SVE vectors are 256 bits, SVE2_128 where SVE2's are 128), and leaves
// it so: every dispatch after it ran SVE2 where a fresh process runs SVE_256
// or SVE2_128 (Graviton3, Grace), found under qemu (docs/arm64.md). Cleared
// here, the next dispatch chooses again from the whole list. The mock of
// UseOnlyTarget, if any, stays.
std::vector<int64_t> SupportedTargetsKeepingDispatch() {
  std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  hwy::GetChosenTarget().DeInit();
  return targets;
}

}  // namespace

std::vector<std::string> SupportedTargetNames() {
  std::vector<std::string> names;
  for (int64_t target : SupportedTargetsKeepingDispatch()) {
    names.push_back(hwy::TargetName(target));
    if (TargetRunsRawKernels(target)) names.push_back(names.back() + kNoRawSuffix);
  }
  return names;
}

bool UseOnlyTarget(std::string_view name) {
  // Lift any earlier restriction first, so every target can be found again.
  hwy::SetSupportedTargetsForTest(0);
  AllowRawKernels(true);
  if (name.empty()) return true;
  for (int64_t target : SupportedTargetsKeepingDispatch()) {
    const std::string target_name = hwy::TargetName(target);
    const bool no_raw = TargetRunsRawKernels(target) && name == target_name + kNoRawSuffix;
    if (name == target_name || no_raw) {
      hwy::SetSupportedTargetsForTest(target);
      AllowRawKernels(!no_raw);
      return true;
    }
  }
  return false;
}

}  // namespace deltasync::kernels
#endif  // HWY_ONCE
