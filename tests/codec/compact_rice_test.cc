// Rice gaps read straight into ranks (compact_rice.h, GapRanks): the same
// ranks as the gaps summed afterwards, run on across calls (a class's parts
// in version 3's pieces), and `past` set exactly when a rank reaches the
// elements, huge gaps (which would wrap a sum) included; both routes of
// RankBuffer (u32 and u64 ranks) the same.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include <optional>
#include <random>
#include <string>
#include <vector>

#include "codec/codec_targets.h"
#include "codec/compact_rice.h"

namespace deltasync::compact {
namespace {

std::vector<uint8_t> Coded(const std::vector<uint64_t>& gaps) {
  BitWriter w;
  VectorGaps source(gaps);
  PutRiceGaps(w, gaps.size(), source);
  return w.Finish();
}

TEST(CompactRice, RanksInOnePassEqualTheSummedGapsAcrossCalls) {
  ForEachCodecCopy([&](const char* copy) {
  SCOPED_TRACE(copy);
  std::mt19937_64 rng(7);
  std::vector<uint64_t> gaps(5000);
  for (uint64_t& g : gaps) g = rng() % 8 == 0 ? rng() % 100000 : rng() % 20;  // escapes and short codes
  std::vector<uint64_t> want(gaps.size());
  for (size_t i = 0; i < gaps.size(); ++i) want[i] = (i == 0 ? 0 : want[i - 1] + 1) + gaps[i];
  // Two calls (two parts of one class), each coded as its own run.
  const size_t cut = 2100;
  const std::vector<uint8_t> a = Coded({gaps.begin(), gaps.begin() + cut});
  const std::vector<uint8_t> b = Coded({gaps.begin() + cut, gaps.end()});
  for (uint64_t elements : {want.back() + 1, want.back()}) {
    GapRanks ranks;
    ranks.elements = elements;
    std::vector<uint64_t> got(gaps.size());
    BitReader ra(a), rb(b);
    ASSERT_FALSE(GetRiceGaps(ra, cut, got.data(), &ranks));
    ASSERT_FALSE(GetRiceGaps(rb, gaps.size() - cut, got.data() + cut, &ranks));
    EXPECT_EQ(got, want);
    EXPECT_EQ(ranks.past, elements == want.back()) << elements;
  }
  });
}

TEST(CompactRice, AGapThatWouldWrapTheRankIsPast) {
  ForEachCodecCopy([&](const char* copy) {
    const std::vector<uint8_t> coded = Coded({5, ~uint64_t{0} - 3, 0});
    GapRanks ranks;
    ranks.elements = 100;
    std::vector<uint64_t> got(3);
    BitReader r(coded);
    ASSERT_FALSE(GetRiceGaps(r, 3, got.data(), &ranks));
    EXPECT_TRUE(ranks.past) << copy;
  });
}

// The fast path (BitReader::RiceRun) settles `past` once per run of short
// codes: a run that starts just below 2^64 (after a huge gap read by the
// slow path, in an earlier call as an earlier piece's part would be) and
// wraps the rank is past, though its last rank is small; one that stops
// just below `elements` is not, one that reaches it is.
TEST(CompactRice, ARunOfShortCodesThatWrapsTheRankIsPast) {
  ForEachCodecCopy([&](const char* copy) {
    SCOPED_TRACE(copy);
    std::vector<uint64_t> small(40);
    for (size_t i = 0; i < small.size(); ++i) small[i] = i % 4;
    uint64_t span = 0;  // what the small gaps add to the rank
    for (uint64_t g : small) span += g + 1;
    const std::vector<uint8_t> tail = Coded(small);
    struct Case {
      uint64_t first_gap, elements;
      bool past;
    };
    const uint64_t top = ~uint64_t{0};
    for (const Case& c : {Case{top - 20, top, true},                    // wraps past 2^64
                          Case{top - 20, top - 1, true},                // the same
                          Case{1000, 1000 + span + 1, false},           // the last rank is 1000 + span
                          Case{1000, 1000 + span, true},                // ... reaching `elements`
                          Case{top - span - 2, top, false}}) {          // the last rank top - 2
      const std::vector<uint8_t> head = Coded({c.first_gap});
      GapRanks ranks;
      ranks.elements = c.elements;
      std::vector<uint64_t> got(1 + small.size());
      BitReader rh(head), rt(tail);
      ASSERT_FALSE(GetRiceGaps(rh, 1, got.data(), &ranks));
      ASSERT_FALSE(GetRiceGaps(rt, small.size(), got.data() + 1, &ranks));
      uint64_t want = c.first_gap;
      EXPECT_EQ(got[0], want);
      for (size_t i = 0; i < small.size(); ++i) {
        want += 1 + small[i];
        EXPECT_EQ(got[1 + i], want) << i;
      }
      EXPECT_EQ(ranks.past, c.past) << c.first_gap << " " << c.elements;
      EXPECT_EQ(ranks.next, want + 1);
    }
  });
}

// RankBuffer's two routes read the same ranks: the narrow (u32) one for up
// to 2^32 elements, its top rank 2^32 - 1 included (and a rank of 2^32
// past), the wide one above; ForceWideRanks sends a small tensor wide.
TEST(CompactRice, NarrowAndWideRankRoutesReadTheSameRanks) {
  ForEachCodecCopy([&](const char* copy) {
  SCOPED_TRACE(copy);
  constexpr uint64_t kTop = RankBuffer::kNarrowMax;
  // Short codes, a huge gap up to rank 2^32 - 2, then a gap of 0 (2^32 - 1),
  // then, for the past test, one more (2^32).
  std::vector<uint64_t> gaps = {3, 0, 17};
  gaps.push_back(kTop - 2 - 23);  // rank 23 + gap
  gaps.push_back(0);
  const std::vector<uint8_t> coded = Coded(gaps);
  std::vector<uint64_t> want(gaps.size());
  for (size_t i = 0; i < gaps.size(); ++i) want[i] = (i == 0 ? 0 : want[i - 1] + 1) + gaps[i];
  ASSERT_EQ(want.back(), kTop - 1);
  for (const uint64_t elements : {kTop, kTop + 1, uint64_t{1} << 40}) {
    for (const bool force_wide : {false, true}) {
      ForceWideRanks(force_wide);
      RankBuffer buf;
      buf.Resize(gaps.size(), elements);
      ForceWideRanks(false);
      EXPECT_EQ(buf.is_narrow, elements <= kTop && !force_wide) << elements;
      EXPECT_EQ(buf.narrow.size(), buf.is_narrow ? gaps.size() : 0u);
      EXPECT_EQ(buf.wide.size(), buf.is_narrow ? 0u : gaps.size());
      BitReader r(coded);
      GapRanks ranks;
      ranks.elements = elements;
      ASSERT_FALSE(buf.Read(r, 0, gaps.size(), ranks));
      EXPECT_FALSE(ranks.past);
      for (size_t i = 0; i < gaps.size(); ++i) EXPECT_EQ(buf[i], want[i]) << i;
    }
  }
  // One rank more (2^32) is past 2^32 elements, on the narrow route too.
  gaps.push_back(0);
  const std::vector<uint8_t> longer = Coded(gaps);
  RankBuffer buf;
  buf.Resize(gaps.size(), kTop);
  ASSERT_TRUE(buf.is_narrow);
  BitReader r(longer);
  GapRanks ranks;
  ranks.elements = kTop;
  ASSERT_FALSE(buf.Read(r, 0, gaps.size(), ranks));
  EXPECT_TRUE(ranks.past);
  });
}

// RankBuffer::Resize sizes its route without writing a rank (the parse
// writes every one), reports a fresh allocation's bytes, and empties the
// other route keeping its memory.
TEST(CompactRice, RankBufferResizeWritesNothingAndReportsFreshMemory) {
  RankBuffer buf;
  std::vector<MutableByteSpan> fresh;
  buf.Resize(500, 1000, &fresh);
  ASSERT_TRUE(buf.is_narrow);
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0].data(), reinterpret_cast<uint8_t*>(buf.narrow.data()));
  EXPECT_EQ(fresh[0].size(), 2000u);
  for (uint32_t i = 0; i < 500; ++i) buf.narrow[i] = 3 * i + 1;
  buf.Resize(7, 1000, &fresh);
  buf.Resize(500, 1000, &fresh);
  EXPECT_EQ(fresh.size(), 1u);
  for (uint32_t i = 0; i < 500; ++i) ASSERT_EQ(buf[i], 3 * i + 1) << i;
  // The wide route: fresh u64 memory; the narrow one emptied, its memory kept.
  const uint32_t* const narrow_at = buf.narrow.data();
  ForceWideRanks(true);
  buf.Resize(300, 1000, &fresh);
  ForceWideRanks(false);
  ASSERT_FALSE(buf.is_narrow);
  EXPECT_TRUE(buf.narrow.empty());
  EXPECT_EQ(buf.narrow.data(), narrow_at);
  ASSERT_EQ(fresh.size(), 2u);
  EXPECT_EQ(fresh[1].data(), reinterpret_cast<uint8_t*>(buf.wide.data()));
  EXPECT_EQ(fresh[1].size(), 2400u);
  // Back to narrow within its capacity: nothing fresh, its ranks as left.
  buf.Resize(500, 1000, &fresh);
  EXPECT_EQ(fresh.size(), 2u);
  EXPECT_TRUE(buf.wide.empty());
  for (uint32_t i = 0; i < 500; ++i) ASSERT_EQ(buf[i], 3 * i + 1) << i;
}

// A reference reader of Rice-coded gaps: code by code through BitReader's
// Get and Unary only (never RiceRun, the fast path), with GetRiceGaps's
// messages.
std::optional<std::string> ReferenceGaps(BitReader& r, uint64_t count, uint64_t* out) {
  for (uint64_t b = 0; b < count; b += kRiceBlock) {
    std::optional<uint64_t> k = r.Get(6);
    if (!k) return "truncated Rice parameter";
    if (*k > kMaxRiceK) return "Rice parameter " + std::to_string(*k) + " above " + std::to_string(kMaxRiceK);
    const int kk = static_cast<int>(*k);
    for (uint64_t i = b; i < std::min<uint64_t>(count, b + kRiceBlock); ++i) {
      std::optional<int> q = r.Unary(kUnaryEscape);
      if (!q) return "gap " + std::to_string(i) + " is truncated";
      if (*q < kUnaryEscape) {
        std::optional<uint64_t> low = r.Get(kk);
        if (!low) return "gap " + std::to_string(i) + " is truncated";
        out[i] = (static_cast<uint64_t>(*q) << kk) | *low;
        continue;
      }
      std::optional<uint64_t> width = r.Get(7);
      std::optional<uint64_t> gap = width && *width <= 64 ? r.Get(static_cast<int>(*width)) : std::nullopt;
      if (!gap) return "escaped gap " + std::to_string(i) + " is truncated or wider than 64 bits";
      const int bits = *gap ? 64 - __builtin_clzll(*gap) : 0;
      if ((*gap >> kk) < kUnaryEscape || bits != static_cast<int>(*width)) {
        return "escaped gap " + std::to_string(i) + " is not canonical";
      }
      out[i] = *gap;
    }
  }
  return std::nullopt;
}

// Gaps whose blocks pick k from 0 to kMaxRiceK: all zero (k = 0), small,
// codes of 20-50 bits (each a refill of the 64-bit window or across one),
// near 2^60 (k = 56, codes longer than the window holds after a refill),
// escapes among short codes, and long unary parts among short ones.
std::vector<uint64_t> MixedGaps(std::mt19937_64& rng) {
  std::vector<uint64_t> gaps;
  auto block = [&](auto gen) {
    for (size_t i = 0; i < kRiceBlock; ++i) gaps.push_back(gen());
  };
  block([&] { return uint64_t{0}; });
  block([&] { return rng() % 3 == 0 ? uint64_t{1} : uint64_t{0}; });
  block([&] { return rng() % 40; });
  block([&] { return rng() >> (64 - 24 - rng() % 3); });
  block([&] { return rng() >> (64 - 45 - rng() % 5); });
  block([&] { return rng() >> 5 | uint64_t{1} << 59; });  // [2^59, 2^60): k = 56, codes of 65-73 bits
  block([&] { return rng() % 16 == 0 ? rng() >> (rng() % 40) : rng() % 12; });
  // Unary parts of up to 30 ones (k = 0 or 1) and long ones among short
  // codes: runs of ones that cross the bits held before a refill.
  block([&] { return rng() % 10 == 0 ? 20 + rng() % 11 : uint64_t{0}; });
  block([&] { return rng() % 8 == 0 ? rng() % 100000 : rng() % 20; });
  for (int i = 0; i < 700; ++i) gaps.push_back(rng() % 9);  // a partial last block
  return gaps;
}

TEST(CompactRice, FastReaderEqualsTheReferenceForEveryParameterAndWindow) {
  ForEachCodecCopy([&](const char* copy) {
  SCOPED_TRACE(copy);
  std::mt19937_64 rng(21);
  const std::vector<uint64_t> gaps = MixedGaps(rng);
  // Two runs back to back: the second starts wherever the fast path left
  // the reader, so a wrong position shows there.
  BitWriter w;
  VectorGaps first(gaps), second(gaps);
  PutRiceGaps(w, gaps.size(), first);
  PutRiceGaps(w, gaps.size(), second);
  const std::vector<uint8_t> coded = w.Finish();
  // The blocks' parameters cover 0 and kMaxRiceK.
  std::vector<int> ks;
  {
    BitReader r(coded);
    for (size_t b = 0; b < gaps.size(); b += kRiceBlock) {
      ks.push_back(static_cast<int>(*r.Get(6)));
      const uint64_t n = std::min<uint64_t>(kRiceBlock, gaps.size() - b);
      for (uint64_t i = 0; i < n; ++i) {
        const int q = *r.Unary(kUnaryEscape);
        if (q < kUnaryEscape) {
          r.Get(ks.back());
        } else {
          r.Get(static_cast<int>(*r.Get(7)));
        }
      }
    }
  }
  EXPECT_EQ(ks.front(), 0);
  EXPECT_NE(std::find(ks.begin(), ks.end(), kMaxRiceK), ks.end());
  std::vector<uint64_t> got(2 * gaps.size()), want(2 * gaps.size());
  BitReader fast(coded), slow(coded);
  ASSERT_FALSE(GetRiceGaps(fast, gaps.size(), got.data()));
  ASSERT_FALSE(GetRiceGaps(fast, gaps.size(), got.data() + gaps.size()));
  ASSERT_FALSE(ReferenceGaps(slow, gaps.size(), want.data()));
  ASSERT_FALSE(ReferenceGaps(slow, gaps.size(), want.data() + gaps.size()));
  EXPECT_TRUE(fast.AtPaddedEnd());
  EXPECT_EQ(got, want);
  for (size_t i = 0; i < gaps.size(); ++i) {
    ASSERT_EQ(got[i], gaps[i]) << i;
    ASSERT_EQ(got[gaps.size() + i], gaps[i]) << i;
  }
  });
}

// Every prefix of a coded stream (and the whole with a byte flipped): the
// fast reader decodes what the reference decodes and refuses with the same
// message, straight into ranks too.
TEST(CompactRice, TruncatedAndCorruptedStreamsFailAsTheReference) {
  ForEachCodecCopy([&](const char* copy) {
  SCOPED_TRACE(copy);
  std::mt19937_64 rng(5);
  std::vector<uint64_t> gaps;
  for (int i = 0; i < 1500; ++i) {
    const uint64_t kind = rng() % 10;
    gaps.push_back(kind == 0 ? rng() >> (rng() % 64) : kind < 4 ? rng() % (uint64_t{1} << 30) : rng() % 50);
  }
  const std::vector<uint8_t> coded = Coded(gaps);
  std::vector<std::vector<uint8_t>> inputs;
  for (size_t len = 0; len <= coded.size(); len += len < 64 ? 1 : 7) inputs.emplace_back(coded.begin(), coded.begin() + len);
  for (int flip = 0; flip < 60; ++flip) {
    std::vector<uint8_t> c = coded;
    c[rng() % c.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    inputs.push_back(std::move(c));
  }
  for (const std::vector<uint8_t>& in : inputs) {
    std::vector<uint64_t> got(gaps.size(), 0), want(gaps.size(), 0), ranks(gaps.size(), 0);
    BitReader fast(in), slow(in), ranked(in);
    const std::optional<std::string> err = GetRiceGaps(fast, gaps.size(), got.data());
    const std::optional<std::string> want_err = ReferenceGaps(slow, gaps.size(), want.data());
    GapRanks r;
    const std::optional<std::string> rank_err = GetRiceGaps(ranked, gaps.size(), ranks.data(), &r);
    ASSERT_EQ(err, want_err) << in.size() << " bytes";
    ASSERT_EQ(rank_err, want_err) << in.size() << " bytes";
    if (!want_err) {
      ASSERT_EQ(got, want);
      uint64_t next = 0;
      for (size_t i = 0; i < gaps.size(); ++i) {
        ASSERT_EQ(ranks[i], next + want[i]) << i;
        next = ranks[i] + 1;
      }
    }
  }
  });
}

// The fast path reads two codes a step (BitReader::RiceRun): a long unary
// part (16-30 ones, or an escape: left to the slower reader) as the first or the second
// code of a pair, pairs whose second code ends just inside or just past the
// bits held (codes of 1-62 bits, k = 0..45 around the fast path's k <= 40),
// blocks and runs of odd and even lengths (1-9 codes, a block's last odd
// code read alone), and every prefix of each stream: the gaps, the ranks and
// the messages of the code-by-code reference, and the reader left where the
// reference left it (a second run read after the first).
TEST(CompactRice, TwoCodesAStepEqualTheReference) {
  ForEachCodecCopy([&](const char* copy) {
  SCOPED_TRACE(copy);
  std::mt19937_64 rng(38);
  for (int trial = 0; trial < 400; ++trial) {
    const int k = trial % 46;
    const uint64_t n = trial % 3 == 0 ? 1 + rng() % 9 : trial % 3 == 1 ? kRiceBlock - 1 + rng() % 3 : 1 + rng() % 2100;
    // Rare enough not to raise the block's k (the encoder's choice, from
    // the block's mean), at either parity.
    const uint64_t long_every = 24 + rng() % 40;
    const uint64_t long_at = rng() % long_every;
    std::vector<uint64_t> gaps(n);
    for (uint64_t i = 0; i < n; ++i) {
      // A block's k follows its mean: around 2^k, with some unary parts
      // of 16-40 (31 and above are escapes; placed at one parity of a
      // pair) and the others of 0-3.
      uint64_t low = k == 0 ? 0 : rng() & ((uint64_t{1} << k) - 1);
      const uint64_t q = i % long_every == long_at ? 16 + rng() % 25 : rng() % 3;
      gaps[i] = (q << k) | low;
    }
    BitWriter w;
    VectorGaps first(gaps), second(gaps);
    PutRiceGaps(w, n, first);
    PutRiceGaps(w, n, second);
    const std::vector<uint8_t> coded = w.Finish();
    std::vector<size_t> lens = {coded.size()};
    for (int j = 0; j < 6; ++j) lens.push_back(rng() % (coded.size() + 1));
    for (size_t len : lens) {
      const std::vector<uint8_t> in(coded.begin(), coded.begin() + static_cast<ptrdiff_t>(len));
      std::vector<uint64_t> got(2 * n, 7), want(2 * n, 7), ranks(2 * n, 7);
      BitReader fast(in), slow(in), ranked(in);
      std::optional<std::string> err = GetRiceGaps(fast, n, got.data());
      if (!err) err = GetRiceGaps(fast, n, got.data() + n);
      std::optional<std::string> want_err = ReferenceGaps(slow, n, want.data());
      if (!want_err) want_err = ReferenceGaps(slow, n, want.data() + n);
      GapRanks r;
      std::optional<std::string> rank_err = GetRiceGaps(ranked, n, ranks.data(), &r);
      if (!rank_err) rank_err = GetRiceGaps(ranked, n, ranks.data() + n, &r);
      ASSERT_EQ(err, want_err) << "k " << k << ", " << n << " gaps, " << len << " of " << coded.size() << " bytes";
      ASSERT_EQ(rank_err, want_err) << "k " << k << ", " << n << " gaps";
      if (want_err) continue;
      ASSERT_EQ(got, want) << "k " << k << ", " << n << " gaps";
      EXPECT_TRUE(fast.AtPaddedEnd());
      uint64_t next = 0;
      for (size_t i = 0; i < 2 * n; ++i) {
        ASSERT_EQ(got[i], gaps[i % n]) << i;
        ASSERT_EQ(ranks[i], next + want[i]) << i;
        next = ranks[i] + 1;
      }
      EXPECT_EQ(r.next, next);
      EXPECT_FALSE(r.past);
    }
  }
  });
}

// BitWriter::Local (the state in locals, PutRiceGaps' writer) writes the
// same bits as Put: any widths 0..64, high bits of the values ignored, runs
// of local puts between plain ones, the writer growing in between.
TEST(CompactRice, LocalPutsWriteWhatPutWrites) {
  std::mt19937_64 rng(11);
  BitWriter plain, local;
  for (int run = 0; run < 300; ++run) {
    const int n = static_cast<int>(rng() % 200);
    std::vector<std::pair<uint64_t, int>> puts(n);
    uint64_t bits = 0;
    for (auto& [value, width] : puts) {
      value = rng();
      width = static_cast<int>(rng() % 8 == 0 ? rng() % 65 : rng() % 12);
      bits += static_cast<uint64_t>(width);
    }
    for (const auto& [value, width] : puts) plain.Put(value, width);
    if (run % 3 == 0) {  // plain puts on both between the runs
      for (const auto& [value, width] : puts) local.Put(value, width);
      continue;
    }
    BitWriter::Local l = local.Begin(bits);
    for (const auto& [value, width] : puts) l.Put(value, width);
    local.End(l);
  }
  EXPECT_EQ(local.Finish(), plain.Finish());
}

// The Rice writer as it was first written (plain BitWriter::Put, the mean
// as a sum of doubles in gap order, each candidate k's cost in its own pass):
// PutRiceGaps's faster passes must choose the same k and write the same bits,
// in both of its compiled copies.
void ReferencePutRice(BitWriter& w, uint64_t gap, int k) {
  const int width = gap ? 64 - __builtin_clzll(gap) : 0;
  if ((gap >> k) < static_cast<uint64_t>(kUnaryEscape)) {
    const int q = static_cast<int>(gap >> k);
    for (int i = 0; i < q; ++i) w.Put(1, 1);
    w.Put(0, 1);
    w.Put(gap, k);
  } else {
    w.Put((uint64_t{1} << kUnaryEscape) - 1, kUnaryEscape);
    w.Put(static_cast<uint64_t>(width), 7);
    w.Put(gap, width);
  }
}

uint64_t ReferenceCost(const std::vector<uint64_t>& gaps, size_t b, size_t e, int k) {
  uint64_t bits = 0;
  for (size_t i = b; i < e; ++i) {
    const int width = gaps[i] ? 64 - __builtin_clzll(gaps[i]) : 0;
    bits += (gaps[i] >> k) < static_cast<uint64_t>(kUnaryEscape) ? (gaps[i] >> k) + 1 + static_cast<uint64_t>(k)
                                                                   : kUnaryEscape + 7 + static_cast<uint64_t>(width);
  }
  return bits;
}

std::vector<uint8_t> ReferenceCoded(const std::vector<uint64_t>& gaps) {
  BitWriter w;
  for (size_t b = 0; b < gaps.size(); b += kRiceBlock) {
    const size_t e = std::min(gaps.size(), b + kRiceBlock);
    double sum = 0;
    for (size_t i = b; i < e; ++i) sum += static_cast<double>(gaps[i]);
    const double scaled = sum / static_cast<double>(e - b) * 0.6931471805599453;
    const int guess = scaled >= 1 ? std::min(kMaxRiceK, static_cast<int>(std::log2(scaled))) : 0;
    const int lo = std::max(0, guess - 1), hi = std::min(kMaxRiceK, guess + 1);
    int best_k = lo;
    uint64_t best = ReferenceCost(gaps, b, e, lo);
    auto take = [&](int k) {
      const uint64_t c = ReferenceCost(gaps, b, e, k);
      if (c < best) best = c, best_k = k;
    };
    for (int k = lo + 1; k <= hi; ++k) take(k);
    // Every k below where more than half the gaps are below 2^lo, then while
    // the best is the largest k tried, the three above.
    size_t below_lo = 0;
    for (size_t i = b; i < e; ++i) below_lo += (gaps[i] >> lo) == 0;
    if (2 * below_lo > e - b) {
      for (int k = lo - 1; k >= 0; --k) take(k);
    }
    for (int edge = hi; best_k == edge && edge < kMaxRiceK; edge = std::min(kMaxRiceK, edge + 3)) {
      for (int k = edge + 1; k <= std::min(kMaxRiceK, edge + 3); ++k) take(k);
    }
    w.Put(static_cast<uint64_t>(best_k), 6);
    for (size_t i = b; i < e; ++i) ReferencePutRice(w, gaps[i], best_k);
  }
  return w.Finish();
}

// Short and long runs, all zeros, geometric gaps of many means, escapes
// (some deciding the block's k),
// gaps just below and above 2^42 (where the mean's sum leaves the integer
// path) and near 2^64 (an integer sum of them would wrap; the doubles round).
TEST(CompactRice, WriterEqualsTheReferenceWriter) {
  std::mt19937_64 rng(11);
  std::vector<std::vector<uint64_t>> cases = {{0}, {7}, std::vector<uint64_t>(1025, 0), std::vector<uint64_t>(3000, 1)};
  for (double mean : {0.3, 3.0, 29.0, 500.0, 1e5, 1e9}) {
    std::geometric_distribution<uint64_t> geo(1.0 / (1.0 + mean));
    std::vector<uint64_t> g(2500);
    for (uint64_t& x : g) x = geo(rng);
    g[100] = 1u << 20;  // an escape among them
    cases.push_back(g);
  }
  for (uint64_t top : {uint64_t{1} << 41, uint64_t{1} << 42, uint64_t{1} << 52, uint64_t{1} << 62,
                       uint64_t{1} << 63, ~uint64_t{0}}) {
    std::vector<uint64_t> g(1100);
    for (uint64_t& x : g) x = top - rng() % (top / 4 + 1);
    cases.push_back(g);
    g.resize(1024);
    for (size_t i = 0; i < g.size(); i += 2) g[i] = rng() % 16;  // half tiny, half huge
    cases.push_back(g);
  }
  // Blocks where escapes decide k: small gaps with a share of gaps whose
  // q is 31-70 at one of the candidates (escaped there, not at the next k
  // up), so that a cost that missed or misjudged an escape picks another k.
  for (int t = 0; t < 300; ++t) {
    const uint64_t small = 1 + rng() % 64, share = 1 + rng() % 30;
    const int shift = static_cast<int>(rng() % 7);
    std::vector<uint64_t> g(kRiceBlock);
    for (uint64_t& x : g) x = rng() % 100 < share ? (31 + rng() % 40) << shift | rng() % (1u << shift) : rng() % small;
    cases.push_back(g);
  }
  // Blocks whose best k is far below the guess: mostly short gaps, a few
  // long ones that set the mean (and escape at the best k or not).
  for (int t = 0; t < 200; ++t) {
    std::vector<uint64_t> g(1 + rng() % kRiceBlock);
    const uint64_t small = 1 + rng() % 8, share = 1 + rng() % 5;
    const int top = 8 + static_cast<int>(rng() % 30);
    for (uint64_t& x : g) x = rng() % 100 < share ? uint64_t{1} << top | rng() % 1000 : rng() % small;
    cases.push_back(g);
  }
  // Both compiled copies of the writer (codec_targets.h).
  ForEachCodecCopy([&](const char* copy) {
    for (size_t c = 0; c < cases.size(); ++c) {
      EXPECT_EQ(Coded(cases[c]), ReferenceCoded(cases[c])) << copy << " copy, case " << c;
    }
  });
}

// A block of short gaps with a few long ones (as real models' rows give):
// the mean's guess is far above the best k; the writer finds the best k of
// all and reads back.
TEST(CompactRice, KFarFromTheMeansGuessIsFound) {
  std::mt19937_64 rng(23);
  for (int t = 0; t < 50; ++t) {
    std::vector<uint64_t> g(kRiceBlock);
    for (uint64_t& x : g) x = rng() % 100 < 2 ? 20000 + rng() % 20000 : rng() % 4;
    const std::vector<uint8_t> coded = Coded(g);
    int best_k = 0;
    for (int k = 1; k <= kMaxRiceK; ++k) {
      if (ReferenceCost(g, 0, g.size(), k) < ReferenceCost(g, 0, g.size(), best_k)) best_k = k;
    }
    ASSERT_EQ(coded[0] & 63, best_k) << "case " << t;
    EXPECT_LE(best_k, 3);
    BitReader r(coded);
    std::vector<uint64_t> got(g.size());
    ASSERT_FALSE(GetRiceGaps(r, g.size(), got.data()));
    EXPECT_EQ(got, g);
  }
}

// The search below the mean's three candidates runs only where more than
// half the block's gaps are below 2^lo (lo = guess - 1): a block whose
// median is above (as a geometric block's is) keeps the three's best even
// where a k below costs less (rare: 1 of 20,000 random mixtures of a few
// gap sizes in a model of the writer). 22 zeros, two escapes at k <= 2 and
// 47 gaps of 2: the mean's guess is 2, only 22 of 71 gaps are below 2^1,
// and k = 0 (255 bits) beats the three's best k = 1 (277 bits); with 50
// zeros, 50 of 99 are below and the writer finds k = 0.
TEST(CompactRice, TheSearchBelowRunsWhereTheMedianIsBelowTheLowestCandidate) {
  auto block = [](size_t zeros) {
    std::vector<uint64_t> g(zeros, 0);
    g.insert(g.end(), {245, 245});
    g.insert(g.end(), 47, 2);
    return g;
  };
  for (const auto& [zeros, want_k] : {std::pair<size_t, int>{22, 1}, {50, 0}}) {
    const std::vector<uint64_t> g = block(zeros);
    ForEachCodecCopy([&](const char* copy) {
      const std::vector<uint8_t> coded = Coded(g);
      ASSERT_EQ(coded[0] & 63, want_k) << copy << " copy, " << zeros << " zeros";
      EXPECT_EQ(coded, ReferenceCoded(g)) << copy << " copy, " << zeros << " zeros";
      BitReader r(coded);
      std::vector<uint64_t> got(g.size());
      ASSERT_FALSE(GetRiceGaps(r, g.size(), got.data()));
      EXPECT_EQ(got, g);
    });
  }
  EXPECT_LT(ReferenceCost(block(22), 0, 71, 0), ReferenceCost(block(22), 0, 71, 1));
}

// The writer's AVX-512 route (eight codes a step, joined into two writes,
// the scalar route for eights with an escape or a four of more than 56
// bits) against the reference: blocks of every length modulo 8, their k
// from small to large, long codes and escapes at every place in an eight,
// fours just under and over 56 bits. Every compiled copy.
TEST(CompactRice, WriterRoutesEqualTheReferenceAroundEveryEight) {
  std::mt19937_64 rng(17);
  std::vector<std::vector<uint64_t>> cases;
  for (int t = 0; t < 600; ++t) {
    const size_t n = 8 * (1 + rng() % 40) + rng() % 8 + (t % 5 == 0 ? kRiceBlock : 0);
    const int shift = static_cast<int>(rng() % 12);   // about the block's k
    const uint64_t long_q = 6 + rng() % 30;            // q of the long codes: fours near 56 bits and escapes
    const uint64_t share = rng() % 40;                 // per cent of long codes
    std::vector<uint64_t> g(n);
    for (uint64_t& x : g) {
      const uint64_t q = rng() % 100 < share ? long_q + rng() % 3 : rng() % 3;
      x = q << shift | (shift ? rng() % (uint64_t{1} << shift) : 0);
    }
    if (t % 3 == 0) g[rng() % n] = uint64_t{1} << (40 + rng() % 20);  // an escape at any place
    cases.push_back(g);
  }
  ForEachCodecCopy([&](const char* copy) {
    for (size_t c = 0; c < cases.size(); ++c) {
      ASSERT_EQ(Coded(cases[c]), ReferenceCoded(cases[c])) << copy << " copy, case " << c;
    }
  });
}

// The k search (the mean's three, the median test's passes below, the
// passes above while the best is the largest) at its edges, read back: every
// k from 0 to kMaxRiceK chosen by some block, blocks of one gap and a last
// partial block, all-zero gaps, gaps at and around 2^31, 2^32 and 2^63 and
// up to 2^64 - 1 (escapes of every width up to 64), blocks whose k is
// pushed down (most gaps tiny) or up (all huge). Each stream decodes, by
// the fast reader and the code-by-code reference, to exactly its gaps, and
// is the reference writer's; on every compiled copy of the writer.
TEST(CompactRice, EveryChosenKAndEveryGapWidthReadsBack) {
  std::mt19937_64 rng(29);
  std::vector<std::vector<uint64_t>> cases;
  const uint64_t edges[] = {0, 1, 2, (uint64_t{1} << 31) - 1, uint64_t{1} << 31, (uint64_t{1} << 32) - 1,
                            uint64_t{1} << 32, (uint64_t{1} << 56) - 1, uint64_t{1} << 56, uint64_t{1} << 63,
                            ~uint64_t{0} - 1, ~uint64_t{0}};
  for (uint64_t e : edges) {
    cases.push_back({e});                                           // a block of one gap
    cases.push_back(std::vector<uint64_t>(kRiceBlock + 1, e));     // a full block and one more
    std::vector<uint64_t> mixed(1 + rng() % (2 * kRiceBlock), 0);  // tiny gaps with it among them
    for (uint64_t& x : mixed) x = rng() % 7 == 0 ? e - (e ? rng() % 4 % e : 0) : rng() % 3;
    cases.push_back(mixed);
  }
  // Uniform gaps below 2^j and in [2^j, 2^(j + 1)): the chosen k walks
  // from 0 to kMaxRiceK.
  for (int j = 0; j <= 64; ++j) {
    std::vector<uint64_t> g(1 + rng() % kRiceBlock);
    for (uint64_t& x : g) x = j == 0 ? 0 : rng() >> (64 - j);
    cases.push_back(g);
    if (j == 64) break;
    for (uint64_t& x : g) x = uint64_t{1} << j | (j == 0 ? 0 : rng() >> (64 - j));
    cases.push_back(g);
  }
  // Mostly tiny gaps and a few of a random width (the search below), and
  // all wide ones with a few tiny (the search above).
  for (int t = 0; t < 200; ++t) {
    std::vector<uint64_t> g(1 + rng() % (3 * kRiceBlock));
    const int width = 1 + static_cast<int>(rng() % 64);
    const uint64_t share = rng() % 100;
    for (uint64_t& x : g) x = rng() % 100 < share ? rng() >> (64 - width) : rng() % 4;
    cases.push_back(g);
  }
  ForEachCodecCopy([&](const char* copy) {
    std::vector<bool> chosen(kMaxRiceK + 1, false);
    for (size_t c = 0; c < cases.size(); ++c) {
      const std::vector<uint64_t>& g = cases[c];
      const std::vector<uint8_t> coded = Coded(g);
      ASSERT_EQ(coded, ReferenceCoded(g)) << copy << " copy, case " << c;
      BitReader fast(coded), slow(coded);
      std::vector<uint64_t> got(g.size()), want(g.size());
      const std::optional<std::string> err = GetRiceGaps(fast, g.size(), got.data());
      ASSERT_FALSE(err) << copy << " copy, case " << c << ": " << *err;
      ASSERT_FALSE(ReferenceGaps(slow, g.size(), want.data())) << copy << " copy, case " << c;
      ASSERT_EQ(got, g) << copy << " copy, case " << c;
      ASSERT_EQ(want, g) << copy << " copy, case " << c;
      EXPECT_TRUE(fast.AtPaddedEnd()) << copy << " copy, case " << c;
      // Each block's k (its first 6 bits), skipping its codes.
      BitReader r(coded);
      for (size_t b = 0; b < g.size(); b += kRiceBlock) {
        const int k = static_cast<int>(*r.Get(6));
        ASSERT_LE(k, kMaxRiceK);
        chosen[static_cast<size_t>(k)] = true;
        for (size_t i = b; i < std::min(g.size(), b + kRiceBlock); ++i) {
          const int q = *r.Unary(kUnaryEscape);
          r.Get(q < kUnaryEscape ? k : static_cast<int>(*r.Get(7)));
        }
      }
    }
    for (int k = 0; k <= kMaxRiceK; ++k) EXPECT_TRUE(chosen[static_cast<size_t>(k)]) << copy << " copy: k " << k;
  });
}

}  // namespace
}  // namespace deltasync::compact
