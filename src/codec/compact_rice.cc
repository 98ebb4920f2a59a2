// Rice-coded gaps (compact_rice.h).
#include "codec/compact_rice.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "codec/codec_targets.h"
#include "common/pages.h"
#if DS_CODEC_HAS_AVX512
#include <immintrin.h>
#endif

namespace deltasync::compact {
namespace {

DS_CODEC_INLINE int BitWidth(uint64_t v) { return v ? 64 - __builtin_clzll(v) : 0; }

DS_CODEC_INLINE uint64_t RiceBits(uint64_t gap, int k) {
  const uint64_t q = gap >> k;
  return q < kUnaryEscape ? q + 1 + static_cast<uint64_t>(k) : kUnaryEscape + 7 + BitWidth(gap);
}

// The ordinary code of a gap whose q = gap >> k is below kUnaryEscape: q
// ones, a zero, then the k low bits (q + 1 + k bits, the first bit lowest).
// Needs q + 1 + k <= 64.
DS_CODEC_INLINE uint64_t OrdinaryCode(uint64_t gap, int k, uint64_t q) {
  const uint64_t low = gap & ((uint64_t{1} << k) - 1);  // k <= 56: 0 for k = 0
  return ((uint64_t{1} << q) - 1) | (low << (q + 1));
}

template <class Writer>
DS_CODEC_INLINE void PutRice(Writer& w, uint64_t gap, int k) {
  const uint64_t q = gap >> k;
  if (q < kUnaryEscape) {
    // One write when it fits.
    if (q + 1 + k <= 56) {
      w.PutFitting(OrdinaryCode(gap, k, q), static_cast<int>(q) + 1 + k);
    } else {
      w.Put((uint64_t{1} << q) - 1, static_cast<int>(q) + 1);
      w.Put(gap, k);
    }
  } else {
    w.Put((uint64_t{1} << kUnaryEscape) - 1, kUnaryEscape);
    w.Put(static_cast<uint64_t>(BitWidth(gap)), 7);
    w.Put(gap, BitWidth(gap));
  }
}

// The codes of the four gaps at g, as four PutRice calls would write them,
// in one write: the four codes are computed apart (no chain through the
// writer) and joined. Only where all four are ordinary and together fit in
// 56 bits; returns false, having written nothing, otherwise.
template <class Writer>
DS_CODEC_INLINE bool PutRice4(Writer& w, const uint64_t* g, int k) {
  const uint64_t q0 = g[0] >> k, q1 = g[1] >> k, q2 = g[2] >> k, q3 = g[3] >> k;
  if (std::max(std::max(q0, q1), std::max(q2, q3)) >= kUnaryEscape) return false;
  const uint64_t l0 = q0 + 1 + static_cast<uint64_t>(k), l1 = q1 + 1 + static_cast<uint64_t>(k);
  const uint64_t l2 = q2 + 1 + static_cast<uint64_t>(k), l3 = q3 + 1 + static_cast<uint64_t>(k);
  const uint64_t bits = l0 + l1 + l2 + l3;
  if (bits > 56) return false;
  const uint64_t lo = OrdinaryCode(g[0], k, q0) | OrdinaryCode(g[1], k, q1) << l0;
  const uint64_t hi = OrdinaryCode(g[2], k, q2) | OrdinaryCode(g[3], k, q3) << l2;
  w.PutFitting(lo | hi << (l0 + l1), static_cast<int>(bits));
  return true;
}

// The sums of RiceBits(gaps[i], k[j]) over n gaps for the three parameters
// k[0..2] in one pass. A gap takes (gap >> k) + 1 + k bits unless escaped;
// the sums of shifts are a loop the compiler vectorises, and escapes (rare)
// are corrected one by one (mod 2^64: the corrections undo any wrap of the
// plain sum). Whether any gap escapes is known exactly from the same pass:
// q | (q + 1) is at least 32 if and only if q >= kUnaryEscape (31; q + 1
// wraps only for q = 2^64 - 1), and so is the OR of it over the gaps, so the
// one-by-one pass runs only for a k that some gap really escapes.
//
// Also returns the number of gaps below 2^k[0] (q = 0 at k[0]): more than
// half of them puts the block's median below 2^k[0], a sign that it is far
// from geometric (PutRiceGapsBody).
DS_CODEC_INLINE uint64_t RiceCosts3(const uint64_t* gaps, size_t n, const int k[3], uint64_t cost[3]) {
  static_assert(kUnaryEscape == 31, "the escape test below is for q >= 31");
  uint64_t q0 = 0, q1 = 0, q2 = 0, e0 = 0, e1 = 0, e2 = 0, below = 0;
  const int k0 = k[0], k1 = k[1], k2 = k[2];
  for (size_t i = 0; i < n; ++i) {
    const uint64_t a0 = gaps[i] >> k0, a1 = gaps[i] >> k1, a2 = gaps[i] >> k2;
    q0 += a0;
    q1 += a1;
    q2 += a2;
    e0 |= a0 | (a0 + 1);
    e1 |= a1 | (a1 + 1);
    e2 |= a2 | (a2 + 1);
    below += a0 == 0;
  }
  const uint64_t q[3] = {q0, q1, q2};
  const uint64_t escapes[3] = {e0, e1, e2};
  for (int j = 0; j < 3; ++j) {
    uint64_t bits = q[j] + n * static_cast<uint64_t>(1 + k[j]);
    if (escapes[j] >= 32) {
      for (size_t i = 0; i < n; ++i) {
        if ((gaps[i] >> k[j]) >= kUnaryEscape) {
          bits += RiceBits(gaps[i], k[j]) - ((gaps[i] >> k[j]) + 1 + static_cast<uint64_t>(k[j]));
        }
      }
    }
    cost[j] = bits;
  }
  return below;
}

// Costs the three parameters ks in one pass (RiceCosts3) and keeps the
// cheapest in best_k / best_bits where it is below best_bits (the first on a
// tie, so a repeated k never displaces itself). Returns RiceCosts3's count
// of gaps below 2^ks[0].
DS_CODEC_INLINE uint64_t TakeCheapest3(const uint64_t* gaps, size_t n, const int (&ks)[3], int& best_k,
                                       uint64_t& best_bits) {
  uint64_t cost[3];
  const uint64_t below = RiceCosts3(gaps, n, ks, cost);
  for (int j = 0; j < 3; ++j) {
    if (cost[j] < best_bits) best_bits = cost[j], best_k = ks[j];
  }
  return below;
}

// The codes of a block's gaps [0, e) at parameter k, as PutRice would
// write them one by one: four at a time, joined where they fit.
DS_CODEC_INLINE void PutRiceCodes(BitWriter::Local& l, const uint64_t* gaps, size_t e, int k) {
  size_t i = 0;
  for (; i + 4 <= e; i += 4) {
    if (!PutRice4(l, gaps + i, k)) {
      for (size_t j = i; j < i + 4; ++j) PutRice(l, gaps[j], k);
    }
  }
  for (; i < e; ++i) PutRice(l, gaps[i], k);
}

#if DS_CODEC_HAS_AVX512
// PutRiceCodes on AVX-512, eight gaps a step: each gap's ordinary code and
// length in a u64 lane (q = gap >> k; (2^q - 1) | low << (q + 1); q + 1 + k
// bits), lanes 2j and 2j + 1 joined into lane 2j, then lanes 4j and 4j + 2
// into lane 4j: two writes of up to 56 bits (PutFitting) for eight codes,
// where the scalar route computes every code apart and joins four. Eight
// with an escape (q >= 31) or a four longer than 56 bits take the scalar
// route (PutRice4, PutRice): the same bits either way, the codes being
// concatenated in order. Not inlined: a function of this target is called
// from the body (inlining it into a body of no target would be refused).
// GCC 12's AVX-512 headers start some results from _mm512_undefined_*(),
// which its -Wmaybe-uninitialized then flags (a known false positive;
// clang has no such warning group).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
DS_CODEC_AVX512_TARGET __attribute__((noinline)) void PutRiceCodesAvx512(BitWriter::Local& w, const uint64_t* gaps,
                                                                          size_t e, int k) {
  BitWriter::Local l = w;
  const __m128i vk = _mm_cvtsi32_si128(k);
  const __m512i k1 = _mm512_set1_epi64(k + 1);
  const __m512i one = _mm512_set1_epi64(1);
  const __m512i low_mask = _mm512_set1_epi64(static_cast<int64_t>((uint64_t{1} << k) - 1));  // k <= 56
  const __m512i last_q = _mm512_set1_epi64(kUnaryEscape - 1);
  const __m512i fit = _mm512_set1_epi64(56);
  size_t i = 0;
  for (; i + 8 <= e; i += 8) {
    const __m512i g = _mm512_loadu_si512(gaps + i);
    const __m512i q = _mm512_srl_epi64(g, vk);
    const __m512i len = _mm512_add_epi64(q, k1);
    // (2^q - 1) | low << (q + 1); a shift by 64 or more gives 0 (such a
    // lane fails the length test below).
    const __m512i ones = _mm512_sub_epi64(_mm512_sllv_epi64(one, q), one);
    const __m512i low = _mm512_sllv_epi64(_mm512_and_si512(g, low_mask), _mm512_add_epi64(q, one));
    const __m512i code = _mm512_or_si512(ones, low);
    // Pairs into even lanes: the odd lane's code after the even one's.
    const __m512i code_odd = _mm512_shuffle_epi32(code, _MM_PERM_BADC);
    const __m512i len_odd = _mm512_shuffle_epi32(len, _MM_PERM_BADC);
    const __m512i pair = _mm512_or_si512(code, _mm512_sllv_epi64(code_odd, len));
    const __m512i pair_len = _mm512_add_epi64(len, len_odd);
    // Fours into lanes 0 and 4: lane 2's pair after lane 0's, 6's after 4's.
    const __m512i pair_next = _mm512_alignr_epi64(pair, pair, 2);
    const __m512i pair_len_next = _mm512_alignr_epi64(pair_len, pair_len, 2);
    const __m512i four = _mm512_or_si512(pair, _mm512_sllv_epi64(pair_next, pair_len));
    const __m512i four_len = _mm512_add_epi64(pair_len, pair_len_next);
    // Four lengths of at most 56 bits in all bound every code and pair
    // below 64 bits, so that no shift above lost bits.
    const auto bad = static_cast<unsigned>(_mm512_cmpgt_epu64_mask(q, last_q)) |
                     (static_cast<unsigned>(_mm512_cmpgt_epu64_mask(four_len, fit)) & 0x11u);
    if (bad != 0) [[unlikely]] {
      PutRiceCodes(l, gaps + i, 8, k);
      continue;
    }
    const __m128i lo = _mm512_castsi512_si128(four), lo_len = _mm512_castsi512_si128(four_len);
    const __m128i hi = _mm512_extracti64x2_epi64(four, 2), hi_len = _mm512_extracti64x2_epi64(four_len, 2);
    l.PutFitting(static_cast<uint64_t>(_mm_cvtsi128_si64(lo)), static_cast<int>(_mm_cvtsi128_si64(lo_len)));
    l.PutFitting(static_cast<uint64_t>(_mm_cvtsi128_si64(hi)), static_cast<int>(_mm_cvtsi128_si64(hi_len)));
  }
  PutRiceCodes(l, gaps + i, e - i, k);
  w = l;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

// PutRiceGaps's body, inlined into its copies (codec_targets.h); the third
// (kAvx512) writes the codes by PutRiceCodesAvx512.
template <bool kAvx512>
DS_CODEC_INLINE void PutRiceGapsBody(BitWriter& w, uint64_t count, GapSource& source) {
  uint64_t gaps[kRiceBlock];
  for (uint64_t done = 0; done < count;) {
    const size_t e = source.Next(gaps, static_cast<size_t>(std::min<uint64_t>(kRiceBlock, count - done)));
    if (e == 0) break;  // a source shorter than its count (never, for the two encoders' sources)
    done += e;
    // The gaps' OR has the top bit of the largest (all that the 2^42 test
    // below reads); a sum and an OR vectorise on every x86-64 (a max of u64
    // needs AVX-512).
    uint64_t int_sum = 0, any_bits = 0;
    for (size_t i = 0; i < e; ++i) {
      int_sum += gaps[i];
      any_bits |= gaps[i];
    }
    // The mean as the format has always taken it: a sum of doubles in gap
    // order. Below 2^42 a gap (2^52 all 1024 together), every partial sum
    // is an integer a double holds exactly, so the integer sum is that sum;
    // above, the doubles round, and are summed as they always were.
    double sum = static_cast<double>(int_sum);
    if (any_bits >= uint64_t{1} << 42) {
      sum = 0;
      for (size_t i = 0; i < e; ++i) sum += static_cast<double>(gaps[i]);
    }
    // A geometric source's best k is about log2(mean x ln 2); the exact cost
    // decides among it and its neighbours, and beyond them (below).
    const double scaled = sum / static_cast<double>(e) * 0.6931471805599453;
    const int guess = scaled >= 1 ? std::min(kMaxRiceK, static_cast<int>(std::log2(scaled))) : 0;
    // The three candidates' costs in one pass (k = guess - 1 only when >= 0).
    const int lo = std::max(0, guess - 1), hi = std::min(kMaxRiceK, guess + 1);
    int best_k = lo;
    uint64_t best_bits = ~uint64_t{0};
    const uint64_t below_lo = TakeCheapest3(gaps, e, {lo, lo + 1 <= hi ? lo + 1 : lo, hi}, best_k, best_bits);
    // Every k below the three where the block's median is below 2^lo, and
    // past the highest while the best is at that edge. A block whose gaps
    // are far from geometric (runs of short gaps among a few long ones, as
    // on real models) can want a k well below the mean's guess, and its cost
    // is not convex in k where the long gaps start to escape. The median
    // tells such blocks apart for free: a geometric block's median is about
    // mean x ln 2 (about 2^guess), and at most ~29% of its gaps lie below
    // 2^lo = 2^(guess - 1), so geometric blocks (a synthetic model's) skip
    // the passes below, which cost ~5 ns a gap where most gaps escape at a
    // small k (measured: the publish's stream writing 2.3x slower).
    if (2 * below_lo > e) {
      for (int edge = lo; edge > 0; edge = std::max(0, edge - 3)) {
        TakeCheapest3(gaps, e, {edge - 1, std::max(0, edge - 2), std::max(0, edge - 3)}, best_k, best_bits);
      }
    }
    for (int edge = hi; best_k == edge && edge < kMaxRiceK; edge = std::min(kMaxRiceK, edge + 3)) {
      TakeCheapest3(gaps, e, {edge + 1, std::min(kMaxRiceK, edge + 2), std::min(kMaxRiceK, edge + 3)}, best_k,
                    best_bits);
    }
    // At most kUnaryEscape + 7 + 64 bits a gap (an escape), and the 6 of k.
    BitWriter::Local l = w.Begin(6 + e * (kUnaryEscape + 7 + 64));
    l.Put(static_cast<uint64_t>(best_k), 6);
#if DS_CODEC_HAS_AVX512
    if constexpr (kAvx512) {
      PutRiceCodesAvx512(l, gaps, e, best_k);
    } else {
      PutRiceCodes(l, gaps, e, best_k);
    }
#else
    PutRiceCodes(l, gaps, e, best_k);
#endif
    w.End(l);
  }
}

void PutRiceGapsBaseline(BitWriter& w, uint64_t count, GapSource& source) {
  PutRiceGapsBody<false>(w, count, source);
}

DS_CODEC_BMI2_TARGET void PutRiceGapsBmi2(BitWriter& w, uint64_t count, GapSource& source) {
  PutRiceGapsBody<false>(w, count, source);
}

#if DS_CODEC_HAS_AVX512
DS_CODEC_AVX512_TARGET void PutRiceGapsAvx512(BitWriter& w, uint64_t count, GapSource& source) {
  PutRiceGapsBody<true>(w, count, source);
}
#endif

}  // namespace

void PutRiceGaps(BitWriter& w, uint64_t count, GapSource& source) {
#if DS_CODEC_HAS_AVX512
  if (UseCodecAvx512()) return PutRiceGapsAvx512(w, count, source);
#endif
  if (UseCodecBmi2()) return PutRiceGapsBmi2(w, count, source);
  PutRiceGapsBaseline(w, count, source);
}

// Reads `count` gaps of one class into `out`; nullopt-style error text.
// Inlined into its two copies (codec_targets.h): the BMI2 one's fast path
// (BitReader::RiceRun) shifts without a move to cl and counts with TZCNT.
static_assert(kRiceBlock <= BitReader::kFastRun, "RiceRun takes a whole block");
static_assert(kUnaryEscape >= BitReader::kFastUnary, "RiceRun's codes are ordinary ones");

namespace {

template <typename T>
DS_CODEC_INLINE std::optional<std::string> GetRiceGapsBody(BitReader& r, uint64_t count, T* out, GapRanks* ranks) {
  static_assert(std::is_same_v<T, uint64_t> || std::is_same_v<T, uint32_t>);
  if constexpr (std::is_same_v<T, uint32_t>) {
    if (ranks == nullptr) return "internal: 32-bit gaps without ranks";
  }
  for (uint64_t b = 0; b < count; b += kRiceBlock) {
    std::optional<uint64_t> k = r.Get(6);
    if (!k) return "truncated Rice parameter";
    if (*k > kMaxRiceK) return "Rice parameter " + std::to_string(*k) + " above " + std::to_string(kMaxRiceK);
    const int kk = static_cast<int>(*k);
    const uint64_t e = std::min<uint64_t>(count, b + kRiceBlock);
    for (uint64_t i = b; i < e; ++i) {
      // Fast: a run of ordinary codes; then one code the slow way.
      i = ranks ? r.RiceRun(kk, out, i, e, ranks) : r.RiceRun(kk, out, i, e);
      if (i == e) break;
      std::optional<int> q = r.Unary(kUnaryEscape);
      if (!q) return "gap " + std::to_string(i) + " is truncated";
      if (*q < kUnaryEscape) {
        std::optional<uint64_t> low = r.Get(kk);
        if (!low) return "gap " + std::to_string(i) + " is truncated";
        const uint64_t gap = (static_cast<uint64_t>(*q) << kk) | *low;
        out[i] = static_cast<T>(ranks ? ranks->Next(gap) : gap);
        continue;
      }
      std::optional<uint64_t> width = r.Get(7);
      std::optional<uint64_t> gap = width && *width <= 64 ? r.Get(static_cast<int>(*width)) : std::nullopt;
      if (!gap) return "escaped gap " + std::to_string(i) + " is truncated or wider than 64 bits";
      if ((*gap >> kk) < kUnaryEscape || BitWidth(*gap) != static_cast<int>(*width)) {
        return "escaped gap " + std::to_string(i) + " is not canonical";
      }
      out[i] = static_cast<T>(ranks ? ranks->Next(*gap) : *gap);
    }
  }
  return std::nullopt;
}

template <typename T>
std::optional<std::string> GetRiceGapsBaseline(BitReader& r, uint64_t count, T* out, GapRanks* ranks) {
  return GetRiceGapsBody(r, count, out, ranks);
}

template <typename T>
DS_CODEC_BMI2_TARGET std::optional<std::string> GetRiceGapsBmi2(BitReader& r, uint64_t count, T* out,
                                                                GapRanks* ranks) {
  return GetRiceGapsBody(r, count, out, ranks);
}

}  // namespace

template <typename T>
std::optional<std::string> GetRiceGaps(BitReader& r, uint64_t count, T* out, GapRanks* ranks) {
  if (UseCodecBmi2()) return GetRiceGapsBmi2(r, count, out, ranks);
  return GetRiceGapsBaseline(r, count, out, ranks);
}

template std::optional<std::string> GetRiceGaps(BitReader&, uint64_t, uint64_t*, GapRanks*);
template std::optional<std::string> GetRiceGaps(BitReader&, uint64_t, uint32_t*, GapRanks*);

namespace {
std::atomic<bool> force_wide_ranks{false};
}  // namespace

void ForceWideRanks(bool wide) { force_wide_ranks.store(wide, std::memory_order_relaxed); }

void RankBuffer::Resize(uint64_t count, uint64_t elements, std::vector<MutableByteSpan>* fresh) {
  is_narrow = elements <= kNarrowMax && !force_wide_ranks.load(std::memory_order_relaxed);
  if (is_narrow) {
    SizeUninit(narrow, static_cast<size_t>(count), fresh);
    wide.clear();
  } else {
    SizeUninit(wide, static_cast<size_t>(count), fresh);
    narrow.clear();
  }
}

std::optional<std::string> RankBuffer::Read(BitReader& r, uint64_t begin, uint64_t count, GapRanks& ranks) {
  return is_narrow ? GetRiceGaps(r, count, narrow.data() + begin, &ranks)
                   : GetRiceGaps(r, count, wide.data() + begin, &ranks);
}

size_t VectorGaps::Next(uint64_t* out, size_t max) {
  const size_t n = std::min(max, gaps_.size() - pos_);
  if (n) std::memcpy(out, gaps_.data() + pos_, n * sizeof(uint64_t));
  pos_ += n;
  return n;
}

}  // namespace deltasync::compact
