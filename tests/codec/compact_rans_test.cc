// The rANS decoder of version 3's pieces (codec/compact_rans.h) against a
// reference written here from docs/format.md alone: an encoder with plain
// division and a decoder that reads its renormalisation bytes one at a time.
// Both must give the same diff bytes, or the same message, on valid pieces
// (1-symbol and 256-symbol tables, a symbol of frequency 1, pieces of 1, 63,
// 64, 65 and 65,536 changes, class borders at odd and even changes; the
// writer's whole pieces coded two at once) and on
// truncated, over-long and corrupted ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "codec/codec_targets.h"
#include "codec/compact_rans.h"
#include "codec/compact_rice.h"

namespace deltasync::compact {
namespace {

// The piece's rANS bytes for diffs d[lo, hi) as docs/format.md states them:
// last change first, change r on state (r - lo) & 1 when the piece has at
// least kRansTwoStates changes (else all on state 0); before a symbol of
// frequency f, bytes (low first, so the decoder reads them high first)
// while x >= 2^19 * f; then x = (x / f) * 4096 + x % f + start. The final
// states lead, state 0 first, little-endian.
std::vector<uint8_t> ReferenceEncode(const std::vector<uint8_t>& d, uint64_t lo, uint64_t hi,
                                     const std::array<uint64_t, kClasses + 1>& begin, const V3Tables& t) {
  const bool two = hi - lo >= kRansTwoStates;
  uint32_t xs[2] = {kRansLow, kRansLow};
  std::vector<uint8_t> rev;  // bytes in the order written (reversed at the end)
  for (uint64_t r = hi; r-- > lo;) {
    int cl = 0;
    while (begin[cl + 1] <= r) ++cl;
    uint32_t& x = xs[two ? (r - lo) & 1 : 0];
    const uint32_t f = t.classes[cl].freq[d[r]];
    while (x >= (kRansLow >> kRansScaleBits << 8) * f) {
      rev.push_back(static_cast<uint8_t>(x));
      x >>= 8;
    }
    x = (x / f) * kRansTotal + x % f + t.classes[cl].start[d[r]];
  }
  for (int j = two ? 1 : 0; j >= 0; --j) {
    for (int k = 3; k >= 0; --k) rev.push_back(static_cast<uint8_t>(xs[j] >> (8 * k)));
  }
  return {rev.rbegin(), rev.rend()};
}

// The decoder the format describes, a byte at a time, with
// DecodeRansPiece's messages.
std::optional<std::string> ReferenceDecode(ByteSpan rans, const std::array<uint64_t, kClasses + 1>& begin,
                                           uint64_t lo, uint64_t hi, const V3Tables& t, uint8_t* d) {
  const bool two = hi - lo >= kRansTwoStates;
  const size_t state_bytes = two ? 8 : 4;
  if (rans.size() < state_bytes) return "rANS bytes shorter than the initial states";
  uint32_t xs[2] = {kRansLow, kRansLow};
  for (size_t j = 0; j < state_bytes / 4; ++j) {
    xs[j] = 0;
    for (int k = 0; k < 4; ++k) xs[j] |= static_cast<uint32_t>(rans[4 * j + k]) << (8 * k);
  }
  for (uint32_t x : xs) {
    if (x < kRansLow || x >= (uint32_t{1} << 31)) return "rANS state out of range";
  }
  size_t pos = state_bytes;
  for (uint64_t r = lo; r < hi; ++r) {
    int cl = 0;
    while (begin[cl + 1] <= r) ++cl;
    uint32_t& x = xs[two ? (r - lo) & 1 : 0];
    const V3Tables::Class& c = t.classes[cl];
    const uint32_t slot = x % kRansTotal;
    int sym = 0;
    while (!(c.freq[sym] > 0 && c.start[sym] <= slot && slot < c.start[sym] + c.freq[sym])) ++sym;
    d[r] = static_cast<uint8_t>(sym);
    x = c.freq[sym] * (x / kRansTotal) + slot - c.start[sym];
    while (x < kRansLow) {
      if (pos == rans.size()) return "rANS bytes end early, in class " + std::to_string(cl);
      x = x << 8 | rans[pos++];
    }
  }
  if (xs[0] != kRansLow || xs[1] != kRansLow) return "rANS final states are not the initial ones";
  if (pos != rans.size()) return std::to_string(rans.size() - pos) + " trailing rANS bytes";
  return std::nullopt;
}

struct Case {
  V3Tables tables;
  std::array<uint64_t, kClasses + 1> begin{};
  std::vector<uint8_t> diffs;
};

// `count` changes over the classes in `sizes` (class order), each class's
// diffs drawn from its own histogram kind: 0 one symbol only, 1 all 256
// symbols equally, 2 a +-1 ULP mix with a rare symbol (frequency 1), 3 a
// random sparse set of symbols.
Case MakeCase(std::mt19937_64& rng, const std::vector<std::pair<int, uint64_t>>& sizes, const std::vector<int>& kinds) {
  Case c;
  DiffHistogram h{};
  std::array<std::vector<int>, kClasses> alphabet;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int cl = sizes[i].first;
    std::vector<int>& a = alphabet[cl];
    switch (kinds[i % kinds.size()]) {
      case 0: a = {static_cast<int>(rng() % 256)}; break;
      case 1: for (int s = 0; s < 256; ++s) a.push_back(s); break;
      case 2: a = {1, 2, 3, 4, 255}; break;
      default: for (int s = 0; s < 256; ++s) if (rng() % 9 == 0) a.push_back(s); if (a.empty()) a.push_back(7);
    }
  }
  for (int cl = 0; cl < kClasses; ++cl) {
    uint64_t m = 0;
    for (const auto& [k, n] : sizes) m += k == cl ? n : 0;
    c.begin[cl + 1] = c.begin[cl] + m;
    for (uint64_t j = 0; j < m; ++j) {
      const std::vector<int>& a = alphabet[cl];
      int s = a[rng() % a.size()];
      if (a.size() == 5) s = rng() % 1000 == 0 ? 255 : a[rng() % 2];  // 255 rare: frequency 1 in its table
      c.diffs.push_back(static_cast<uint8_t>(s));
      h[cl][s]++;
    }
    if (m > 0 && alphabet[cl].size() == 5) h[cl][255] = std::max<uint64_t>(h[cl][255], 1);
  }
  c.tables = V3Tables::Build(h);
  return c;
}

// Every piece of `c` (kV3Piece changes each) through both decoders, on the
// valid bytes and, with `broken`, on truncated, over-long and flipped ones.
void CheckPieces(const Case& c, std::mt19937_64& rng, bool broken) {
  const uint64_t count = c.diffs.size();
  for (uint64_t lo = 0; lo < count; lo += kV3Piece) {
    const uint64_t hi = std::min(count, lo + kV3Piece);
    const std::vector<uint8_t> coded = ReferenceEncode(c.diffs, lo, hi, c.begin, c.tables);
    std::vector<std::vector<uint8_t>> inputs{coded};
    if (broken) {
      for (size_t cut = 1; cut <= std::min<size_t>(coded.size(), 12); ++cut) {
        inputs.emplace_back(coded.begin(), coded.end() - cut);  // truncated, near the end (the careful path)
      }
      inputs.emplace_back(coded.begin(), coded.begin() + coded.size() / 2);
      inputs.emplace_back(coded.begin(), coded.begin() + std::min<size_t>(coded.size(), 9));
      for (int extra = 1; extra <= 3; ++extra) {
        std::vector<uint8_t> longer = coded;
        longer.insert(longer.end(), extra, static_cast<uint8_t>(rng()));  // over-long
        inputs.push_back(std::move(longer));
      }
      for (int flip = 0; flip < 24; ++flip) {
        std::vector<uint8_t> f = coded;
        f[flip < 8 ? flip % f.size() : rng() % f.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));  // states too
        inputs.push_back(std::move(f));
      }
    }
    for (const std::vector<uint8_t>& in : inputs) {
      std::vector<uint8_t> got(count, 0), want(count, 0);
      const std::optional<std::string> err = DecodeRansPiece(in, c.begin, lo, hi, c.tables, got.data());
      const std::optional<std::string> want_err = ReferenceDecode(in, c.begin, lo, hi, c.tables, want.data());
      ASSERT_EQ(err, want_err) << "piece at " << lo << ", " << in.size() << " of " << coded.size() << " bytes";
      if (!want_err) {
        ASSERT_TRUE(std::equal(got.begin() + lo, got.begin() + hi, want.begin() + lo)) << lo;
      }
      if (&in == &inputs.front()) {
        ASSERT_FALSE(err) << *err;
        ASSERT_TRUE(std::equal(got.begin() + lo, got.begin() + hi, c.diffs.begin() + lo)) << lo;
      }
    }
  }
}

TEST(CompactRans, FastDecoderEqualsTheReferenceOnValidPieces) {
  std::mt19937_64 rng(3);
  for (uint64_t n : {1, 2, 3, 63, 64, 65, 200, 1000}) {
    for (int kind = 0; kind < 4; ++kind) {
      SCOPED_TRACE(std::to_string(n) + " changes, kind " + std::to_string(kind));
      CheckPieces(MakeCase(rng, {{5, n}}, {kind}), rng, false);
      // Three classes, borders at odd and even changes.
      CheckPieces(MakeCase(rng, {{0, n}, {7, n / 2 + 1}, {15, n / 3 + 2}}, {kind, 1, 2}), rng, false);
    }
  }
  // Whole pieces of 65,536 changes and a partial last one.
  CheckPieces(MakeCase(rng, {{2, 70001}, {3, 61071}}, {2, 3}), rng, false);
  CheckPieces(MakeCase(rng, {{9, kV3Piece}}, {1}), rng, false);
  CheckPieces(MakeCase(rng, {{9, kV3Piece}}, {0}), rng, false);  // one symbol: no bytes but the states
}

TEST(CompactRans, TruncatedOverLongAndCorruptedPiecesFailAsTheReference) {
  std::mt19937_64 rng(8);
  for (uint64_t n : {1, 63, 64, 65, 300}) {
    for (int kind = 0; kind < 4; ++kind) {
      SCOPED_TRACE(std::to_string(n) + " changes, kind " + std::to_string(kind));
      CheckPieces(MakeCase(rng, {{1, n}, {4, n / 2 + 1}}, {kind, 2}), rng, true);
    }
  }
  CheckPieces(MakeCase(rng, {{2, 5000}, {3, 3001}}, {2, 1}), rng, true);
}


// Two pieces of `c` at once (DecodeRansPieces of [lo, lo + n) and the
// piece after it, of up to n changes) against the reference on each, on
// the valid bytes and on broken ones (either piece's or both: truncated,
// over-long, flipped): the same bytes and the same error for each piece.
void CheckPair(const Case& c, uint64_t lo, uint64_t n, std::mt19937_64& rng) {
  const uint64_t count = c.diffs.size();
  const uint64_t hi = std::min(count, lo + n), lo2 = hi, hi2 = std::min(count, lo2 + n);
  const std::vector<uint8_t> a = ReferenceEncode(c.diffs, lo, hi, c.begin, c.tables);
  const std::vector<uint8_t> b = ReferenceEncode(c.diffs, lo2, hi2, c.begin, c.tables);
  auto broken = [&](const std::vector<uint8_t>& x, int how) {
    std::vector<uint8_t> y = x;
    if (how == 1) y.resize(y.size() - std::min<size_t>(y.size(), 1 + rng() % 12));
    if (how == 2) y.resize(y.size() / 2);
    if (how == 3) y.insert(y.end(), 1 + rng() % 3, static_cast<uint8_t>(rng()));
    if (how == 4 && !y.empty()) y[rng() % y.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
    if (how == 5 && !y.empty()) y[rng() % std::min<size_t>(y.size(), 8)] ^= static_cast<uint8_t>(1u << (rng() % 8));
    return y;
  };
  for (int ha = 0; ha <= 5; ++ha) {
    for (int hb = 0; hb <= 5; ++hb) {
      const std::vector<uint8_t> ia = broken(a, ha), ib = broken(b, hb);
      std::vector<uint8_t> got(count, 0), want(count, 0);
      std::vector<RansPiece> two(2);
      two[0].rans = ia;
      two[0].lo = lo;
      two[0].hi = hi;
      two[1].rans = ib;
      two[1].lo = lo2;
      two[1].hi = hi2;
      for (RansPiece& p : two) p.begin = &c.begin, p.d = got.data();
      DecodeRansPieces(two, c.tables);
      const std::optional<std::string> err_a = two[0].err, err_b = two[1].err;
      const std::optional<std::string> want_a = ReferenceDecode(ia, c.begin, lo, hi, c.tables, want.data());
      const std::optional<std::string> want_b = ReferenceDecode(ib, c.begin, lo2, hi2, c.tables, want.data());
      SCOPED_TRACE("pieces at " + std::to_string(lo) + " and " + std::to_string(lo2) + ", broken " +
                   std::to_string(ha) + " " + std::to_string(hb));
      ASSERT_EQ(err_a, want_a);
      ASSERT_EQ(err_b, want_b);
      if (!want_a) ASSERT_TRUE(std::equal(got.begin() + lo, got.begin() + hi, want.begin() + lo));
      if (!want_b) ASSERT_TRUE(std::equal(got.begin() + lo2, got.begin() + hi2, want.begin() + lo2));
      if (ha == 0 && hb == 0) {
        ASSERT_FALSE(err_a) << *err_a;
        ASSERT_FALSE(err_b) << *err_b;
        ASSERT_TRUE(std::equal(got.begin() + lo, got.begin() + hi2, c.diffs.begin() + lo));
      }
    }
  }
}

TEST(CompactRans, TwoPiecesAtOnceEqualTheReferenceOnEach) {
  std::mt19937_64 rng(11);
  // Class borders at odd and even changes, in different places in the two
  // pieces; the second piece shorter, of one state (below 64), or empty.
  for (uint64_t n : {64, 65, 127, 300, 1001}) {
    for (int kind = 0; kind < 4; ++kind) {
      SCOPED_TRACE(std::to_string(n) + " changes a piece, kind " + std::to_string(kind));
      const Case c = MakeCase(rng, {{0, n / 3 + 1}, {4, n / 2}, {7, n + 5}, {15, n / 5 + 2}}, {kind, 2, 1, 3});
      const uint64_t count = c.diffs.size();
      for (uint64_t lo : {uint64_t{0}, uint64_t{1}, n / 2, count - std::min(count, n + 40), count - std::min(count, n + 1)}) {
        CheckPair(c, lo, n, rng);
      }
    }
  }
  // Whole pieces of 65,536 changes and a partial last one.
  const Case c = MakeCase(rng, {{2, 70001}, {3, 61071}}, {2, 3});
  CheckPair(c, 0, kV3Piece, rng);
  CheckPair(c, kV3Piece - 1000, kV3Piece, rng);
}

// Many pieces at once (DecodeRansPieces), of two "tensors" sharing the
// tables (their own class borders and outputs), listed interleaved: pieces
// of 1 to 3,000 changes (one state below 64), some broken (truncated,
// over-long, flipped, states too) so that a lane ends early, late or at its
// start; each piece's bytes and error are the reference's.
TEST(CompactRans, ManyPiecesOfTwoTensorsAtOnceEqualTheReferenceOnEach) {
  std::mt19937_64 rng(17);
  // All 256 symbols in every class's table: any diff byte codes in any class.
  Case a = MakeCase(rng, {{0, 900}, {4, 2500}, {7, 4001}, {15, 300}}, {1, 2, 3, 0});
  Case b;
  for (int cl = 0; cl < kClasses; ++cl) {
    const uint64_t m = cl == 4 ? 3100 : cl == 7 ? 1777 : cl == 15 ? 2 : cl == 0 ? 65 : 0;
    b.begin[cl + 1] = b.begin[cl] + m;
  }
  for (uint64_t j = 0; j < b.begin[kClasses]; ++j) b.diffs.push_back(static_cast<uint8_t>(rng() % 6 == 0 ? rng() : rng() % 4));
  // One set of tables for both, from both tensors' diffs.
  DiffHistogram h{};
  for (const Case* c : {static_cast<const Case*>(&a), static_cast<const Case*>(&b)}) {
    for (int cl = 0; cl < kClasses; ++cl) {
      for (uint64_t j = c->begin[cl]; j < c->begin[cl + 1]; ++j) h[cl][c->diffs[j]]++;
    }
  }
  a.tables = V3Tables::Build(h);
  b.tables = a.tables;
  for (int trial = 0; trial < 40; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    // Each tensor cut into pieces of random sizes, then the two lists
    // interleaved at random.
    struct Cut {
      const Case* c;
      uint64_t lo, hi;
    };
    std::vector<Cut> cuts_a, cuts_b;
    for (const Case* c : {static_cast<const Case*>(&a), static_cast<const Case*>(&b)}) {
      std::vector<Cut>& cuts = c == &a ? cuts_a : cuts_b;
      const uint64_t count = c->diffs.size();
      for (uint64_t lo = 0; lo < count;) {
        static constexpr uint64_t kSizes[] = {1, 2, 63, 64, 65, 100, 777, 3000};
        const uint64_t hi = std::min(count, lo + kSizes[rng() % 8]);
        cuts.push_back({c, lo, hi});
        lo = hi;
      }
    }
    std::vector<Cut> order;
    size_t ia = 0, ib = 0;
    while (ia < cuts_a.size() || ib < cuts_b.size()) {
      const bool take_a = ib == cuts_b.size() || (ia < cuts_a.size() && rng() % 2 == 0);
      order.push_back(take_a ? cuts_a[ia++] : cuts_b[ib++]);
    }
    std::vector<std::vector<uint8_t>> inputs;
    std::vector<int> hows;
    for (const Cut& cut : order) {
      std::vector<uint8_t> y = ReferenceEncode(cut.c->diffs, cut.lo, cut.hi, cut.c->begin, cut.c->tables);
      const int how = trial == 0 ? 0 : static_cast<int>(rng() % 12);  // mostly intact
      if (how == 1) y.resize(y.size() - std::min<size_t>(y.size(), 1 + rng() % 12));
      if (how == 2) y.resize(y.size() / 2);
      if (how == 3) y.insert(y.end(), 1 + rng() % 3, static_cast<uint8_t>(rng()));
      if (how == 4 && !y.empty()) y[rng() % y.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      if (how == 5 && !y.empty()) y[rng() % std::min<size_t>(y.size(), 8)] ^= static_cast<uint8_t>(1u << (rng() % 8));
      inputs.push_back(std::move(y));
      hows.push_back(how);
    }
    std::vector<uint8_t> got_a(a.diffs.size(), 0), got_b(b.diffs.size(), 0);
    std::vector<uint8_t> want_a(a.diffs.size(), 0), want_b(b.diffs.size(), 0);
    std::vector<RansPiece> pieces(order.size());
    for (size_t j = 0; j < order.size(); ++j) {
      pieces[j].rans = inputs[j];
      pieces[j].lo = order[j].lo;
      pieces[j].hi = order[j].hi;
      pieces[j].begin = &order[j].c->begin;
      pieces[j].d = order[j].c == &a ? got_a.data() : got_b.data();
      pieces[j].err = "not decoded";
    }
    DecodeRansPieces(pieces, a.tables);
    for (size_t j = 0; j < order.size(); ++j) {
      const Cut& cut = order[j];
      std::vector<uint8_t>& want = cut.c == &a ? want_a : want_b;
      const std::vector<uint8_t>& got = cut.c == &a ? got_a : got_b;
      const std::optional<std::string> want_err =
          ReferenceDecode(inputs[j], cut.c->begin, cut.lo, cut.hi, cut.c->tables, want.data());
      ASSERT_EQ(pieces[j].err, want_err) << "piece " << j << ": [" << cut.lo << ", " << cut.hi << ") of "
                                         << (cut.c == &a ? "a" : "b");
      if (!want_err) {
        ASSERT_TRUE(std::equal(got.begin() + cut.lo, got.begin() + cut.hi, want.begin() + cut.lo)) << j;
      }
      if (hows[j] == 0) {
        ASSERT_FALSE(pieces[j].err) << *pieces[j].err;
        ASSERT_TRUE(std::equal(got.begin() + cut.lo, got.begin() + cut.hi, cut.c->diffs.begin() + cut.lo)) << j;
      }
    }
  }
  // None at all.
  DecodeRansPieces({}, a.tables);
}

// The library's writer (WriteBf16StreamV3, branch-free renormalisation)
// puts exactly the reference encoder's bytes in every piece, in both of its
// compiled copies.
TEST(CompactRans, WriterPiecesAreTheReferenceEncodersBytes) {
  std::mt19937_64 rng(12);
  const std::vector<Case> cases = {MakeCase(rng, {{2, 70001}, {3, 61071}}, {2, 3}),
                                   MakeCase(rng, {{0, 63}}, {1}), MakeCase(rng, {{0, 64}, {15, 1}}, {2, 0}),
                                   MakeCase(rng, {{6, 1}}, {3}), MakeCase(rng, {{1, 5000}, {4, 777}}, {1, 2}),
                                   // Whole pieces coded two at once (four whole and a short one; three
                                   // whole), classes starting at odd and even changes inside them.
                                   MakeCase(rng, {{0, 1}, {1, 65537}, {3, 3}, {4, 70000}, {7, 131071},
                                                  {9, 50000}, {15, 2}}, {1, 3, 2, 0, 1, 3, 2}),
                                   MakeCase(rng, {{2, 65535}, {5, 65536}, {11, 65537}}, {3, 1, 2})};
  // Both compiled copies of the writer (codec_targets.h).
  ForEachCodecCopy([&](const char* copy) {
    for (const Case& c : cases) {
      const uint64_t count = c.diffs.size();
      Bf16Streams s;
      std::vector<std::vector<uint64_t>> gaps(kClasses);
      std::vector<std::unique_ptr<VectorGaps>> sources;
      std::vector<uint8_t> escapes;
      for (int cl = 0; cl < kClasses; ++cl) {
        s.counts[cl] = c.begin[cl + 1] - c.begin[cl];
        gaps[cl].assign(s.counts[cl], 1);
        sources.push_back(std::make_unique<VectorGaps>(gaps[cl]));
        s.gaps[cl] = sources.back().get();
        if (s.counts[cl] > 0) s.diffs[cl].push_back(ByteSpan(c.diffs).subspan(c.begin[cl], s.counts[cl]));
      }
      for (uint8_t d : c.diffs) {
        if (d == kEscape) escapes.insert(escapes.end(), {0x80, 0x3F});
      }
      if (!escapes.empty()) s.escapes.push_back(escapes);
      std::vector<uint8_t> out;
      WriteBf16StreamV3(s, c.tables, out);
      Reader in(out);
      ASSERT_EQ(*in.Byte(), kStreamVersion3);
      in.Byte();
      ASSERT_EQ(*in.Varint(), count);
      in.Take(2);
      for (int cl = 0; cl < kClasses; ++cl) {
        if (s.counts[cl] > 0) ASSERT_EQ(*in.Varint(), s.counts[cl]);
      }
      const uint64_t pieces = (count + kV3Piece - 1) / kV3Piece;
      std::vector<std::pair<uint64_t, uint64_t>> lens;
      for (uint64_t p = 0; p < pieces; ++p) {
        const uint64_t g = *in.Varint();
        lens.push_back({g, *in.Varint()});
      }
      for (uint64_t p = 0; p < pieces; ++p) {
        in.Take(lens[p].first);
        const ByteSpan rans = *in.Take(lens[p].second);
        const uint64_t lo = p * kV3Piece, hi = std::min(count, lo + kV3Piece);
        const std::vector<uint8_t> want = ReferenceEncode(c.diffs, lo, hi, c.begin, c.tables);
        ASSERT_EQ(std::vector<uint8_t>(rans.begin(), rans.end()), want)
            << copy << " copy, piece " << p << " of " << count;
      }
    }
  });
}

// The encoder's constants (RansEncSymbol: a high multiply by ceil(2^64 / f)
// instead of a division, and the bias that makes f = 1 exact) give the
// format's step x -> (x / f) * 4096 + x % f + start for every frequency, at
// the ends of the state range the step sees (after renormalisation: from
// 2^7 up to 2^19 f - 1), around every multiple of f there and at random.
TEST(CompactRans, EncoderConstantsGiveTheFormatsStepForEveryFrequency) {
  std::mt19937_64 rng(21);
  for (uint32_t f = 1; f <= kRansTotal; ++f) {
    const uint32_t start = f == kRansTotal ? 0 : static_cast<uint32_t>(rng() % (kRansTotal - f + 1));
    const RansEncSymbol e = MakeRansEncSymbol(f, start);
    ASSERT_EQ(e.x_max, (kRansLow >> kRansScaleBits << 8) * f) << f;
    const uint64_t top = uint64_t{e.x_max} - 1;
    std::vector<uint64_t> xs = {kRansLow >> 16, top, top - 1, top / 2, top / 3};
    for (uint64_t m : {uint64_t{1}, uint64_t{2}, top / f / 2, top / f}) {
      for (int d = -1; d <= 1; ++d) xs.push_back(m * f + static_cast<uint64_t>(d));
    }
    for (int i = 0; i < 8; ++i) xs.push_back((kRansLow >> 16) + rng() % (top - (kRansLow >> 16) + 1));
    for (const uint64_t x : xs) {
      if (x < (kRansLow >> 16) || x > top) continue;
      const auto q = static_cast<uint64_t>((static_cast<unsigned __int128>(x) * e.rcp) >> 64);
      const uint64_t got = static_cast<uint32_t>(x + e.bias + q * e.cmpl);
      const uint64_t want = (x / f) * kRansTotal + x % f + start;
      ASSERT_EQ(got, want) << "f " << f << ", x " << x;
    }
  }
}

}  // namespace
}  // namespace deltasync::compact
