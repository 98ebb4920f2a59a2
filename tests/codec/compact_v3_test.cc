// Compact stream version 3 (codec/compact_v3.h, docs/format.md "Compact
// stream version 3") next to version 2: both round-trip the same changes,
// version 2 still decodes, pieces, the delta-wide tables, strict errors.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "codec/compact_bf16.h"
#include "codec/compact_container.h"
#include "codec/compact_rans.h"
#include "codec/compact_rice.h"
#include "codec/compact_v3.h"
#include "codec/patch_test_util.h"
#include "deltasync/compact.h"

namespace deltasync {
namespace {

using testing::Flatten;
using testing::ParseBytes;

struct Base {
  WeightState state;
  StateHash hash;
};

// bf16 tensors "big" (n elements, ~N(0, 0.02) with some large and tiny
// values), "one" (1 element), "flat" (64 elements all 0.5: one class).
Base MakeBase(uint64_t n, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint8_t> big(2 * n), one(2), flat(2 * 64);
  for (uint64_t k = 0; k < n; ++k) {
    float x = normal(rng) * (k % 97 == 0 ? 100.0f : k % 89 == 0 ? 1e-4f : 1.0f);
    uint32_t u;
    std::memcpy(&u, &x, 4);
    const uint16_t b = Fp32ToBf16(u);
    std::memcpy(big.data() + 2 * k, &b, 2);
  }
  const uint16_t o = 0x3F80, h = 0x3F00;  // 1.0, 0.5
  std::memcpy(one.data(), &o, 2);
  for (int k = 0; k < 64; ++k) std::memcpy(flat.data() + 2 * k, &h, 2);
  std::vector<TensorView> v{{"big", DType::kBF16, {n}, big}, {"flat", DType::kBF16, {8, 8}, flat},
                            {"one", DType::kBF16, {1}, one}};
  Base b{std::move(WeightState::FromViews(v)).value(), {}};
  b.hash = HashState(b.state, 1);
  return b;
}

PatchInfo Info() {
  PatchInfo info;
  info.model_version = 8;
  info.base_version = 7;
  return info;
}

std::vector<uint8_t> Encode(const Base& b, const std::vector<TensorChanges>& c, int version) {
  Result<EncodedPatch> e = EncodeCompactDelta(Info(), b.hash, b.state, c, 2, version);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? Flatten(*e) : std::vector<uint8_t>();
}

Result<CompactDelta> Decode(std::vector<uint8_t> bytes, const Base& b, int threads = 1) {
  DS_ASSIGN_OR_RETURN(SafetensorsFile f, ParseBytes(std::move(bytes), "v3.safetensors"));
  return DecodeCompactDelta(f, b.state, b.hash, threads);
}

// The stream version byte of every stream of an encoded delta (either
// container).
std::vector<int> Versions(const std::vector<uint8_t>& bytes) {
  Result<SafetensorsFile> f = ParseBytes(bytes, "x");
  Result<compact::RawStreams> raw = f.ok() ? compact::ReadContainer(*f) : f.status();
  EXPECT_TRUE(raw.ok()) << raw.status().ToString();
  std::vector<int> out;
  if (raw.ok()) {
    for (const compact::RawStream& s : raw->streams) out.push_back(s.bytes.empty() ? -1 : s.bytes[0]);
  }
  return out;
}

// Both versions decode to exactly `changes`; returns {v2 bytes, v3 bytes}.
std::pair<size_t, size_t> RoundTripBoth(const Base& b, std::vector<TensorChanges> changes) {
  std::sort(changes.begin(), changes.end(), [](auto& x, auto& y) { return x.name < y.name; });
  std::pair<size_t, size_t> sizes;
  for (int version : {2, 3}) {
    SCOPED_TRACE("stream version " + std::to_string(version));
    std::vector<uint8_t> bytes = Encode(b, changes, version);
    for (int v : Versions(bytes)) EXPECT_EQ(v, version);
    EXPECT_EQ(Encode(b, changes, version), bytes);  // deterministic
    for (int threads : {1, 3}) {
      Result<CompactDelta> d = Decode(bytes, b, threads);
      EXPECT_TRUE(d.ok()) << d.status().ToString();
      if (!d.ok()) continue;
      EXPECT_EQ(d->changes.size(), changes.size());
      for (size_t i = 0; i < std::min(changes.size(), d->changes.size()); ++i) {
        EXPECT_EQ(d->changes[i].name, changes[i].name);
        EXPECT_EQ(d->changes[i].indices, changes[i].indices);
        EXPECT_EQ(d->changes[i].values, changes[i].values);
      }
    }
    // inspect's sizes add up to the file.
    Result<SafetensorsFile> f = ParseBytes(bytes, "x");
    Result<CompactStreamSizes> s = f.ok() ? MeasureCompactDelta(*f) : f.status();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (s.ok()) {
      EXPECT_EQ(s->header_bytes + s->gap_bytes + s->diff_bytes + s->escape_bytes + s->value_bytes, bytes.size());
    }
    (version == 2 ? sizes.first : sizes.second) = bytes.size();
  }
  return sizes;
}

uint16_t Ulp(uint16_t o, uint64_t i) { return static_cast<uint16_t>(o + (i % 3 == 0 ? -1 : 1)); }

TEST(CompactV3, SmallerThanV2OnUlpMoves) {
  Base b = MakeBase(50000);
  std::mt19937_64 rng(2);
  auto [v2, v3] = RoundTripBoth(b, {testing::Bf16Changes(b.state, "big", testing::RandomIndices(rng, 50000, 2000), Ulp)});
  EXPECT_LT(v3, v2);
}

TEST(CompactV3, SignFlipsNanInfBigMovesAndSameValue) {
  Base b = MakeBase(4096);
  std::vector<uint64_t> all(4096);
  for (uint64_t i = 0; i < all.size(); ++i) all[i] = i;
  const uint16_t specials[] = {0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x0000, 0x8000, 0x0001, 0x807F, 0x7F7F};
  RoundTripBoth(b, {testing::Bf16Changes(b.state, "big", all, [&](uint16_t o, uint64_t i) -> uint16_t {
                  switch (i % 5) {
                    case 0: return static_cast<uint16_t>(o ^ 0x8000);
                    case 1: return specials[i % 9];
                    case 2: return static_cast<uint16_t>(o + 300);  // escaped: too far
                    case 3: return o;                               // diff byte 0
                    default: return Ulp(o, i);
                  }
                })});
}

TEST(CompactV3, EmptyOneElementAndOneClass) {
  Base b = MakeBase(100);
  RoundTripBoth(b, {});
  TensorChanges none;
  none.name = "big";
  RoundTripBoth(b, {none});
  RoundTripBoth(b, {testing::Bf16Changes(b.state, "one", {0}, Ulp)});
  // All changes in one class (every "flat" element is 0.5), all changed.
  std::vector<uint64_t> all(64);
  for (uint64_t i = 0; i < 64; ++i) all[i] = i;
  RoundTripBoth(b, {testing::Bf16Changes(b.state, "flat", all, Ulp), testing::Bf16Changes(b.state, "one", {0}, Ulp)});
}

// More than one piece: pieces cut inside classes, and a dense tensor.
TEST(CompactV3, ManyPieces) {
  const uint64_t n = 3 * compact::kV3Piece + 1234;
  Base b = MakeBase(n);
  std::vector<uint64_t> all(n);
  for (uint64_t i = 0; i < n; ++i) all[i] = i;
  RoundTripBoth(b, {testing::Bf16Changes(b.state, "big", all, Ulp)});
  std::mt19937_64 rng(9);
  RoundTripBoth(b, {testing::Bf16Changes(b.state, "big", testing::RandomIndices(rng, n, compact::kV3Piece + 7),
                            [&](uint16_t o, uint64_t i) { return i % 11 ? Ulp(o, i) : static_cast<uint16_t>(o ^ 0x8000); })});
}

// The parse reads two pieces' rANS bytes at once (DecodeRansPieces), yet
// its ranks, diffs and errors are those of reading the pieces one after the
// other (gaps, then rANS, per piece), here with the pieces' own readers
// (RankBuffer::Read, DecodeRansPiece): on a stream of 2, 3 and 4 pieces,
// intact and with one or two bit flips anywhere in the pieces' bytes (a
// flip in a piece's rANS bytes before one in the next piece's gaps too).
struct PieceReference {
  std::optional<std::string> error;
  compact::RankBuffer ranks;
  std::vector<uint8_t> diffs;
};

// `body`: the stream after version, mode and count; a valid header
// (bitmap, counts, directory). Sets *pieces_at to where the pieces start.
PieceReference OneAtATime(ByteSpan body, uint64_t count, uint64_t elements, const compact::V3Tables& tables,
                          size_t* pieces_at) {
  PieceReference ref;
  compact::Reader in(body);
  const unsigned bitmap = *in.Byte() | (*in.Byte() << 8u);
  std::array<uint64_t, compact::kClasses + 1> begin{};
  for (int cl = 0; cl < compact::kClasses; ++cl) begin[cl + 1] = begin[cl] + ((bitmap >> cl & 1) ? *in.Varint() : 0);
  const uint64_t pieces = (count + compact::kV3Piece - 1) / compact::kV3Piece;
  std::vector<std::pair<uint64_t, uint64_t>> lens(pieces);
  for (auto& [g, r] : lens) g = *in.Varint(), r = *in.Varint();
  *pieces_at = in.position();
  ref.ranks.Resize(count, elements);
  ref.diffs.resize(count);
  std::array<compact::GapRanks, compact::kClasses> ranks;
  for (compact::GapRanks& r : ranks) r.elements = elements;
  for (uint64_t p = 0; p < pieces && !ref.error; ++p) {
    const uint64_t lo = p * compact::kV3Piece, hi = std::min(count, lo + compact::kV3Piece);
    const std::string where = "piece " + std::to_string(p) + ": ";
    compact::BitReader bits(*in.Take(lens[p].first));
    for (int cl = 0; cl < compact::kClasses && !ref.error; ++cl) {
      const compact::Span part = compact::ClassPart(begin, cl, lo, hi);
      if (part.a >= part.b) continue;
      if (auto err = ref.ranks.Read(bits, part.a, part.b - part.a, ranks[cl])) {
        ref.error = where + "class " + std::to_string(cl) + " gaps: " + *err;
      }
    }
    if (!ref.error && !bits.AtPaddedEnd()) ref.error = where + "trailing bits after the gaps";
    if (ref.error) break;
    if (auto err = compact::DecodeRansPiece(*in.Take(lens[p].second), begin, lo, hi, tables, ref.diffs.data())) {
      ref.error = where + *err;
    }
  }
  return ref;
}

TEST(CompactV3, PiecesReadInPairsGiveTheRanksDiffsAndErrorsOfOneAtATime) {
  std::mt19937_64 rng(21);
  for (const uint64_t want_changes : {2 * compact::kV3Piece, 2 * compact::kV3Piece + 40, 3 * compact::kV3Piece + 1234}) {
    SCOPED_TRACE(std::to_string(want_changes) + " changes");
    const uint64_t n = want_changes + want_changes / 3;
    Base b = MakeBase(n, want_changes);
    std::vector<uint64_t> indices;  // every fourth element left alone
    for (uint64_t i = 0; i < n && indices.size() < want_changes; ++i) {
      if (i % 4 != 3) indices.push_back(i);
    }
    const std::vector<uint8_t> bytes = Encode(b, {testing::Bf16Changes(b.state, "big", indices, Ulp)}, 3);
    Result<SafetensorsFile> f = ParseBytes(bytes, "x");
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    std::optional<compact::V3Tables> tables;
    ASSERT_TRUE(compact::ParseDeltaTables(*f, tables).ok());
    ASSERT_TRUE(tables);
    const std::vector<TensorView> views = b.state.views();
    Result<std::vector<compact::Stream>> listed = compact::ListStreams(*f, views);
    ASSERT_TRUE(listed.ok()) << listed.status().ToString();
    std::vector<uint8_t> body;
    for (const compact::Stream& s : *listed) {
      if (views[s.base].name != "big") continue;
      compact::Reader in(s.stream.data);
      in.Byte();
      in.Byte();
      ASSERT_EQ(*in.Varint(), want_changes);
      body.assign(s.stream.data.begin() + in.position(), s.stream.data.end());
    }
    ASSERT_FALSE(body.empty());
    const uint64_t changes = want_changes;
    size_t pieces_at = 0;
    OneAtATime(body, changes, n, *tables, &pieces_at);
    for (int trial = 0; trial < 120; ++trial) {
      std::vector<uint8_t> c = body;
      const size_t flips = trial == 0 ? 0 : 1 + trial % 2;
      for (size_t k = 0; k < flips; ++k) c[pieces_at + rng() % (c.size() - pieces_at)] ^= static_cast<uint8_t>(1u << (rng() % 8));
      const PieceReference want = OneAtATime(c, changes, n, *tables, &pieces_at);
      compact::ParsedBf16 got;
      got.elements = n;
      compact::Reader in(c);
      const std::optional<std::string> err = compact::ParseBf16StreamV3(in, changes, &*tables, got);
      SCOPED_TRACE("trial " + std::to_string(trial));
      if (trial == 0) ASSERT_FALSE(err) << *err;
      if (want.error) {
        ASSERT_EQ(err, want.error);
        continue;
      }
      // The pieces read; only the escape block (a flip that made a diff an
      // escape) can fail after them.
      if (err) {
        ASSERT_NE(err->find("escape block"), std::string::npos) << *err;
        continue;
      }
      ASSERT_EQ(std::vector<uint8_t>(got.diffs.begin(), got.diffs.end()), want.diffs);
      ASSERT_EQ(got.ranks.size(), want.ranks.size());
      for (uint64_t j = 0; j < changes; ++j) ASSERT_EQ(got.ranks[j], want.ranks[j]) << j;
    }
  }
}

TEST(CompactV3, RandomPatternsMatchV2) {
  Base b = MakeBase(20000, 4);
  std::mt19937_64 rng(7);
  for (int round = 0; round < 12; ++round) {
    std::vector<uint64_t> idx = testing::RandomIndices(rng, 20000, rng() % 20000);
    const int kind = round % 3;
    RoundTripBoth(b, {testing::Bf16Changes(b.state, "big", idx, [&](uint16_t o, uint64_t) -> uint16_t {
                    if (kind == 0) return static_cast<uint16_t>(rng());
                    if (kind == 1) return static_cast<uint16_t>(o + (rng() % 255) - 127);
                    return static_cast<uint16_t>(o + (rng() % 7) - 3);
                  })});
  }
}

// A publish writes each tensor's stream into a buffer kept from the last
// one (codec/stream_buffers.h), whose stream was often a few bytes shorter:
// a buffer the writer had to grow has room for a slightly longer stream
// next time, so that it is not allocated (and faulted in) again.
TEST(CompactV3, GrownBufferFitsASlightlyLongerStreamNextTime) {
  const Base b = MakeBase(20000);
  const WeightState::Tensor* big = b.state.Find("big");
  ASSERT_NE(big, nullptr);
  auto every = [&](uint64_t step, uint64_t extra) {
    TensorChanges c;
    c.name = "big";
    c.dtype = DType::kBF16;
    for (uint64_t i = 0; i < 20000; ++i) {
      if (i % step != 0 && !(i % step == 1 && i / step < extra)) continue;
      uint16_t o;
      std::memcpy(&o, big->data.data() + 2 * i, 2);
      const uint16_t v = Ulp(o, i);
      c.indices.push_back(i);
      c.values.push_back(static_cast<uint8_t>(v));
      c.values.push_back(static_cast<uint8_t>(v >> 8));
    }
    return c;
  };
  const TensorChanges first = every(7, 0), second = every(7, 40);  // 40 changes more
  compact::DiffHistogram h{};
  compact::CountTensorDiffs(first, big->view(), h);
  compact::CountTensorDiffs(second, big->view(), h);
  const compact::V3Tables tables = compact::V3Tables::Build(h);
  std::vector<uint8_t> out;
  ASSERT_TRUE(compact::EncodeTensorStream(first, big->view(), out, &tables).ok());
  const size_t first_size = out.size();
  out.clear();
  const uint8_t* kept = out.data();
  ASSERT_TRUE(compact::EncodeTensorStream(second, big->view(), out, &tables).ok());
  EXPECT_GT(out.size(), first_size);
  EXPECT_EQ(out.data(), kept) << "the stream of " << out.size() << " bytes did not fit the buffer grown for "
                              << first_size;
}

TEST(CompactV3, UnknownVersionRefused) {
  Base b = MakeBase(10);
  for (int v : {-1, 1, 4}) {
    Result<EncodedPatch> e = EncodeCompactDelta(Info(), b.hash, b.state, {}, 1, v);
    ASSERT_FALSE(e.ok());
    EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
  }
}

// Rewrites the tables entry of an encoded delta's metadata (same length, or
// removed when `value` is empty) by editing the JSON header.
std::vector<uint8_t> WithTables(const std::vector<uint8_t>& bytes, const std::string& value) {
  Result<SafetensorsFile> f = ParseBytes(bytes, "x");
  EXPECT_TRUE(f.ok());
  std::vector<TensorView> views(f->tensors().begin(), f->tensors().end());
  Metadata m = f->metadata();
  if (value.empty()) {
    m.erase(std::string(compact::kTablesKey));
  } else {
    m[std::string(compact::kTablesKey)] = value;
  }
  Result<std::vector<uint8_t>> header = EncodeSafetensorsHeader(m, views);
  EXPECT_TRUE(header.ok());
  std::vector<uint8_t> out = *header;
  for (const TensorView& v : views) out.insert(out.end(), v.data.begin(), v.data.end());
  return out;
}

TEST(CompactV3, TablesMissingOrMalformedAreCorruptionNamingTheKey) {
  Base b = MakeBase(1000);
  std::vector<uint8_t> bytes = Encode(b, {testing::Bf16Changes(b.state, "big", {1, 5, 9}, Ulp)}, 3);
  auto expect = [&](const std::vector<uint8_t>& c, const std::string& want) {
    Result<CompactDelta> d = Decode(c, b);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), ErrorCode::kCorruption);
    EXPECT_NE(d.status().message().find(want), std::string::npos) << d.status().message();
  };
  expect(WithTables(bytes, ""), "tensor 'big.cmp'");
  expect(WithTables(bytes, ""), "has no table");
  expect(WithTables(bytes, "zz"), "deltasync_compact_tables' is malformed");
  expect(WithTables(bytes, "0100"), "class 0: symbol count");  // class 0 listed, no symbols
  expect(WithTables(bytes, "01000000ff1f00"), "1 trailing bytes");
  // A table whose frequencies do not sum to 4096.
  expect(WithTables(bytes, "0100000001"), "frequencies sum to 2");
}

TEST(CompactV3, CorruptedAndTruncatedNeverCrash) {
  Base b = MakeBase(3000);
  std::mt19937_64 rng(5);
  std::vector<uint8_t> bytes =
      Encode(b, {testing::Bf16Changes(b.state, "big", testing::RandomIndices(rng, 3000, 200),
                         [](uint16_t o, uint64_t i) { return static_cast<uint16_t>(i % 7 ? o + 1 : o ^ 0x8000); }),
                 testing::Bf16Changes(b.state, "one", {0}, Ulp)},
             3);
  for (size_t pos = 0; pos < bytes.size(); ++pos) {
    for (uint8_t x : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      std::vector<uint8_t> c = bytes;
      c[pos] ^= x;
      Result<CompactDelta> d = Decode(c, b);
      if (d.ok()) EXPECT_TRUE(ValidateChanges(b.state, d->changes).ok());
      if (!d.ok() && d.status().code() != ErrorCode::kCorruption) {
        EXPECT_NE(d.status().code(), ErrorCode::kInternal) << d.status().ToString();
      }
    }
  }
  for (size_t len = 0; len < bytes.size(); ++len) {
    EXPECT_FALSE(Decode(std::vector<uint8_t>(bytes.begin(), bytes.begin() + len), b).ok()) << len;
  }
}

}  // namespace
}  // namespace deltasync

namespace deltasync {
namespace {

// The default (kCompactStreamAuto): version 3, but never a larger file than
// version 2 on a tiny delta (the tables' fixed cost).
TEST(CompactV3, AutoNeverLargerThanV2) {
  Base b = MakeBase(20000);
  std::mt19937_64 rng(12);
  for (size_t count : {size_t{1}, size_t{3}, size_t{40}, size_t{3000}, size_t{6000}}) {
    SCOPED_TRACE(count);
    std::vector<TensorChanges> c{testing::Bf16Changes(b.state, "big", testing::RandomIndices(rng, 20000, count), Ulp)};
    const std::vector<uint8_t> v2 = Encode(b, c, 2), v3 = Encode(b, c, 3);
    const std::vector<uint8_t> automatic = Encode(b, c, kCompactStreamAuto);
    EXPECT_LE(automatic.size(), v2.size());
    EXPECT_EQ(automatic, count < 4096 && v2.size() < v3.size() ? v2 : v3);
    Result<CompactDelta> d = Decode(automatic, b);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->changes[0].indices, c[0].indices);
  }
}

}  // namespace
}  // namespace deltasync
