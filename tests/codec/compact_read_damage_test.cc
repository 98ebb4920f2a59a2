// An adversarial review of the grouped read (compact_read.cc, ReadTensors;
// session 44 H4), its damage and refusals: a damaged, truncated, lengthened
// or lying stream fails as it does alone (and as the one-piece-at-a-time
// reference, RefRead) and changes no other tensor's output, and a refused
// delta leaves nothing that changes the next good decode, parse or apply on
// the same thread. Layouts and buffers: compact_read_layout_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "codec/compact_read_review_util.h"

namespace deltasync {
namespace {

using namespace testing_compact;
using namespace testing_read;

// Every piece's rANS bytes in the stream (offsets).
struct PieceAt {
  size_t rans_begin, rans_end;
};
std::vector<PieceAt> Pieces(const TensorView& stream, const TensorView& base, const compact::V3Tables* t) {
  compact::Reader in(stream.data);
  (void)in.Byte();
  (void)in.Byte();
  const uint64_t count = *in.Varint();
  compact::ParsedBf16 p;
  p.elements = base.num_elements();
  std::vector<compact::RansPiece> pieces;
  EXPECT_FALSE(compact::ParseBf16StreamV3Gaps(in, count, t, p, pieces));
  std::vector<PieceAt> at;
  for (const compact::RansPiece& q : pieces) {
    const size_t b = static_cast<size_t>(q.rans.data() - stream.data.data());
    at.push_back({b, b + q.rans.size()});
  }
  return at;
}

// The delta of the damage tests: small and multi-piece tensors, raw mode.
std::vector<Spec> DamageSpecs() {
  return {{"d0", 3000, 100},   {"d1", 500, 63},          {"d2", 900, 64},      {"d3", 150000, 140000},
          {"d4", 300, 40, true}, {"d5", 100, 1},         {"d6", 20000, 5000},  {"d7", 200000, 70000},
          {"d8", 5000, 300},   {"d9", 800, 200, true}};
}

// Stream k replaced by `damaged`: tensor k fails (or not) exactly as the
// damaged stream read alone and as the reference; every other tensor's
// outcome and outputs are the clean read's; on 1, 3 and 8 threads.
void CheckDamage(const Listed& l, const Read& clean, size_t k, const std::vector<uint8_t>& damaged,
                 const std::string& what, bool must_fail) {
  const compact::V3Tables* t = &*l.tables;
  TensorView view{l.streams[k].name, DType::kU8, {damaged.size()}, damaged};
  std::vector<const TensorView*> s = StreamsOf(l);
  s[k] = &view;
  Ref ref;
  RefRead(view, *l.bases[k], t, ref);
  const Read alone = ReadAll({&view}, {l.bases[k]}, t, 1);
  if (must_fail) EXPECT_FALSE(alone.errors[0].ok()) << what;
  for (int threads : {1, 3, 8}) {
    const Read r = ReadAll(s, l.bases, t, threads);
    const std::string w = what + ", threads " + std::to_string(threads);
    ExpectSameTensor(r, k, alone, 0, w + ", the damaged tensor against its stream alone");
    ExpectAsReference(r, k, view, *l.bases[k], t, ref, w + ", the damaged tensor against the reference");
    for (size_t j = 0; j < s.size(); ++j) {
      if (j != k) ExpectSameTensor(r, j, clean, j, w + ", undamaged tensor " + std::to_string(j));
    }
  }
}

TEST(CompactReadReview, DamageStaysInItsTensor) {
  CleanRead x;
  ASSERT_NO_FATAL_FAILURE(ReadClean(DamageSpecs(), 21, x));
  const std::unique_ptr<Listed>& l = x.l;
  const compact::V3Tables* t = x.t;
  const Read& clean = x.clean;
  std::mt19937_64 rng(22);
  int failed = 0;
  for (size_t k = 0; k < l->streams.size(); ++k) {
    if (l->bases[k]->dtype != DType::kBF16) continue;
    const ByteSpan bytes = l->streams[k].data;
    const std::vector<PieceAt> at = Pieces(l->streams[k], *l->bases[k], t);
    for (size_t q = 0; q < at.size(); ++q) {
      // A piece's first state below kRansLow: a sure error in that piece.
      std::vector<uint8_t> d(bytes.begin(), bytes.end());
      d[at[q].rans_begin + 2] = 0;
      d[at[q].rans_begin + 3] = 0;
      const std::string what = "tensor " + std::to_string(k) + " piece " + std::to_string(q);
      CheckDamage(*l, clean, k, d, what + " state killed", true);
      {
        TensorView v{l->streams[k].name, DType::kU8, {d.size()}, d};
        const Read r = ReadAll({&v}, {l->bases[k]}, t, 1);
        EXPECT_NE(r.errors[0].ToString().find("piece " + std::to_string(q) + ": rANS state out of range"),
                  std::string::npos)
            << r.errors[0].ToString();
      }
      // Random flips in the piece's rANS bytes.
      for (int trial = 0; trial < 3; ++trial) {
        std::vector<uint8_t> f(bytes.begin(), bytes.end());
        const size_t n = at[q].rans_end - at[q].rans_begin;
        f[at[q].rans_begin + rng() % n] ^= static_cast<uint8_t>(1u << (rng() % 8));
        CheckDamage(*l, clean, k, f, what + " flip " + std::to_string(trial), false);
        TensorView v{l->streams[k].name, DType::kU8, {f.size()}, f};
        failed += !ReadAll({&v}, {l->bases[k]}, t, 1).errors[0].ok();
      }
    }
  }
  EXPECT_GT(failed, 20);
}

// Within one tensor of three pieces: a gap error in piece g and a rANS
// error in piece q give piece min(g, q)'s error (a piece's gaps before its
// rANS bytes), as the one-piece-at-a-time parse reads them.
TEST(CompactReadReview, GapAndPieceErrorsInTheDocumentedOrder) {
  CleanRead x;
  ASSERT_NO_FATAL_FAILURE(ReadClean(DamageSpecs(), 23, x));
  const std::unique_ptr<Listed>& l = x.l;
  const compact::V3Tables* t = x.t;
  const size_t k = 3;  // d3: 140000 changes, three pieces
  ASSERT_EQ(l->streams[k].name.substr(0, 2), "d3");
  const ByteSpan bytes = l->streams[k].data;
  const std::vector<PieceAt> at = Pieces(l->streams[k], *l->bases[k], t);
  ASSERT_EQ(at.size(), 3u);
  std::mt19937_64 rng(24);
  auto error_of = [&](const std::vector<uint8_t>& d) {
    TensorView v{l->streams[k].name, DType::kU8, {d.size()}, d};
    return ReadAll({&v}, {l->bases[k]}, t, 1).errors[0];
  };
  int pairs = 0;
  for (int trial = 0; trial < 200 && pairs < 24; ++trial) {
    // A flip in piece g's gaps (between piece g-1's rANS end and g's start).
    const size_t g = rng() % 3;
    const size_t from = g == 0 ? at[0].rans_begin - 8 : at[g - 1].rans_end;
    std::vector<uint8_t> gap(bytes.begin(), bytes.end());
    gap[from + rng() % (at[g].rans_begin - from)] ^= static_cast<uint8_t>(1u << (rng() % 8));
    const Status gap_err = error_of(gap);
    if (gap_err.ok() || gap_err.ToString().find("piece " + std::to_string(g) + ": class") == std::string::npos) {
      continue;  // not a gap error of piece g
    }
    for (size_t q = 0; q < 3; ++q) {
      std::vector<uint8_t> both = gap;
      both[at[q].rans_begin + 2] = 0;
      both[at[q].rans_begin + 3] = 0;
      const Status got = error_of(both);
      if (g <= q) {
        EXPECT_EQ(got.ToString(), gap_err.ToString()) << "gap error in piece " << g << ", rANS error in " << q;
      } else {
        EXPECT_NE(got.ToString().find("piece " + std::to_string(q) + ": rANS state out of range"), std::string::npos)
            << got.ToString() << ": gap error in piece " << g << ", rANS error in " << q;
      }
      CheckDamage(*l, x.clean, k, both, "gap " + std::to_string(g) + " rANS " + std::to_string(q), true);
      ++pairs;
    }
  }
  EXPECT_GE(pairs, 12);
}

// Every prefix of each stream of a small delta, a few bytes appended, and
// each count in the header (the change count, the class counts, the piece
// directory) one more or one less: refused, in that tensor only.
TEST(CompactReadReview, TruncatedLengthenedAndLyingStreams) {
  CleanRead x;
  ASSERT_NO_FATAL_FAILURE(ReadClean({{"e0", 3000, 100}, {"e1", 500, 63}, {"e2", 900, 64}, {"e3", 300, 40, true},
                                     {"e4", 100, 1}, {"e5", 90000, 66000}, {"e6", 400, 20}},
                                    31, x));
  const std::unique_ptr<Listed>& l = x.l;
  const Read& clean = x.clean;
  for (size_t k = 0; k < l->streams.size(); ++k) {
    const ByteSpan bytes = l->streams[k].data;
    const std::string name = "stream " + std::to_string(k);
    // e5's prefixes every 97th byte (its decode is the longest).
    const size_t step = bytes.size() > 4000 ? 97 : 1;
    for (size_t n = 0; n < bytes.size(); n += step) {
      CheckDamage(*l, clean, k, std::vector<uint8_t>(bytes.begin(), bytes.begin() + n),
                  name + " cut to " + std::to_string(n), true);
      if (::testing::Test::HasFatalFailure()) return;
    }
    for (const std::vector<uint8_t>& tail : std::vector<std::vector<uint8_t>>{{0}, {0xFF, 0}, {1, 2, 3, 4, 5, 6, 7}}) {
      std::vector<uint8_t> d(bytes.begin(), bytes.end());
      d.insert(d.end(), tail.begin(), tail.end());
      CheckDamage(*l, clean, k, d, name + " + " + std::to_string(tail.size()) + " bytes", true);
    }
    if (l->bases[k]->dtype != DType::kBF16) continue;
    // The header's varints: the count, then (v3) the bitmap's class counts
    // and the piece directory's lengths, each rewritten one more, one less.
    compact::Reader in(bytes);
    (void)in.Byte();
    (void)in.Byte();
    std::vector<std::pair<size_t, size_t>> fields;  // [begin, end) of a varint
    size_t p = in.position();
    const uint64_t count = *in.Varint();
    fields.push_back({p, in.position()});
    const uint16_t bitmap = static_cast<uint16_t>(*in.Byte() | *in.Byte() << 8);
    for (int cl = 0; cl < 16; ++cl) {
      if (!(bitmap >> cl & 1)) continue;
      p = in.position();
      (void)in.Varint();
      fields.push_back({p, in.position()});
    }
    for (uint64_t q = 0; q < 2 * ((count + compact::kV3Piece - 1) / compact::kV3Piece); ++q) {
      p = in.position();
      (void)in.Varint();
      fields.push_back({p, in.position()});
    }
    for (const auto& [fb, fe] : fields) {
      compact::Reader v(bytes.subspan(fb, fe - fb));
      const uint64_t value = *v.Varint();
      for (int delta : {-1, 1}) {
        if (value == 0 && delta < 0) continue;
        std::vector<uint8_t> d(bytes.begin(), bytes.begin() + fb);
        compact::PutVarint(d, value + delta);
        d.insert(d.end(), bytes.begin() + fe, bytes.end());
        CheckDamage(*l, clean, k, d, name + " field at " + std::to_string(fb) + " " + (delta > 0 ? "+1" : "-1"),
                    true);
      }
    }
  }
}

// The whole small delta cut at every byte: refused by the parse and by the
// decode on 1 and 3 threads (no read past the end: ASan, valgrind).
TEST(CompactReadReview, DeltaCutAtEveryByteIsRefused) {
  const Built b = Build({{"e0", 3000, 100}, {"e1", 500, 63}, {"e3", 300, 40, true}, {"e4", 100, 1}}, 41);
  const std::vector<TensorView> views = b.state.views();
  CompactParse parsed;
  int parsed_files = 0;
  for (size_t n = 0; n < b.bytes.size(); ++n) {
    const std::vector<uint8_t> cut(b.bytes.begin(), b.bytes.begin() + n);
    Result<SafetensorsFile> f = ParseBytes(cut);
    if (!f.ok()) continue;
    ++parsed_files;
    EXPECT_FALSE(ParseCompactDelta(*f, views, 2, parsed).ok()) << "cut to " << n;
    for (int threads : {1, 3}) EXPECT_FALSE(DecodeCompactDelta(*f, b.state, b.hash, threads).ok()) << "cut to " << n;
  }
  std::printf("prefixes that parse as a container: %d of %zu\n", parsed_files, b.bytes.size());
}

// A refused delta leaves nothing behind in the per-thread buffers: after
// refusals (damaged streams, a cut one) on this thread, a good decode,
// parse and apply equal those of a thread that never saw one.
TEST(CompactReadReview, RefusalsLeaveNothingForTheNextDelta) {
  const Built a = Build(DamageSpecs(), 51);
  const Built b = Build(DamageSpecs(), 52);  // the same names and shapes, other values
  const std::unique_ptr<Listed> lb = List(b);
  auto parse = [](const std::vector<uint8_t>& bytes) { return std::move(ParseBytes(bytes)).value(); };
  struct Outcome {
    std::vector<TensorChanges> changes;
    CompactParse parsed;
    std::vector<uint8_t> applied;  // the state's bytes after the apply
    std::string status;
  };
  auto good = [&](const Built& x, CompactParse& reuse, Outcome& o) {
    const SafetensorsFile f = parse(x.bytes);
    Result<CompactDelta> d = DecodeCompactDelta(f, x.state, x.hash, 3);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    o.changes = d->changes;
    ASSERT_TRUE(ParseCompactDelta(f, x.state.views(), 3, reuse).ok());
    o.parsed = reuse;
    WeightState s = std::move(WeightState::FromViews(x.state.views())).value();
    CompactUndo undo;
    Result<CompactDelta> ap = ApplyCompactDelta(f, s, x.hash, 3, undo);
    ASSERT_TRUE(ap.ok()) << ap.status().ToString();
    for (const TensorView& v : s.views()) o.applied.insert(o.applied.end(), v.data.begin(), v.data.end());
  };
  Outcome fresh;
  std::thread([&] {
    CompactParse p;
    good(b, p, fresh);
  }).join();
  Outcome used;
  CompactParse reuse;
  {
    Outcome first;
    good(a, reuse, first);
  }
  // Refusals: each bf16 stream of b with a killed state in its last piece,
  // then b cut in its last stream.
  for (size_t k = 0; k < lb->streams.size(); ++k) {
    if (lb->bases[k]->dtype != DType::kBF16) continue;
    const std::vector<PieceAt> at = Pieces(lb->streams[k], *lb->bases[k], &*lb->tables);
    // The stream's offset in the flat bytes (as compact_read_groups_test).
    const size_t in_bytes = static_cast<size_t>(lb->streams[k].data.data() - lb->file.blob().bytes().data());
    std::vector<uint8_t> broken = b.bytes;
    broken[in_bytes + at.back().rans_begin + 2] = 0;
    broken[in_bytes + at.back().rans_begin + 3] = 0;
    Result<SafetensorsFile> f = ParseBytes(broken);
    ASSERT_TRUE(f.ok());
    EXPECT_FALSE(DecodeCompactDelta(*f, b.state, b.hash, 3).ok()) << k;
    EXPECT_FALSE(ParseCompactDelta(*f, b.state.views(), 3, reuse).ok()) << k;
    WeightState s = std::move(WeightState::FromViews(b.state.views())).value();
    CompactUndo undo;
    EXPECT_FALSE(ApplyCompactDelta(*f, s, b.hash, 3, undo).ok()) << k;
    std::vector<uint8_t> after, before;
    for (const TensorView& v : s.views()) after.insert(after.end(), v.data.begin(), v.data.end());
    for (const TensorView& v : b.state.views()) before.insert(before.end(), v.data.begin(), v.data.end());
    EXPECT_EQ(after, before) << "a refused apply changed the state, stream " << k;
  }
  good(b, reuse, used);
  ASSERT_EQ(used.changes.size(), fresh.changes.size());
  for (size_t i = 0; i < used.changes.size(); ++i) {
    EXPECT_EQ(used.changes[i].indices, fresh.changes[i].indices) << i;
    EXPECT_EQ(used.changes[i].values, fresh.changes[i].values) << i;
  }
  ASSERT_EQ(used.parsed.tensors.size(), fresh.parsed.tensors.size());
  for (size_t i = 0; i < used.parsed.tensors.size(); ++i) {
    const CompactParse::Tensor &x = used.parsed.tensors[i], &y = fresh.parsed.tensors[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.bf16, y.bf16);
    EXPECT_EQ(x.class_begin, y.class_begin);
    EXPECT_EQ(std::vector<uint32_t>(x.ranks32.begin(), x.ranks32.end()),
              std::vector<uint32_t>(y.ranks32.begin(), y.ranks32.end()));
    EXPECT_EQ(std::vector<uint64_t>(x.ranks.begin(), x.ranks.end()),
              std::vector<uint64_t>(y.ranks.begin(), y.ranks.end()));
    EXPECT_EQ(std::vector<uint8_t>(x.diffs.begin(), x.diffs.end()), std::vector<uint8_t>(y.diffs.begin(), y.diffs.end()));
    EXPECT_EQ(x.escaped, y.escaped);
    EXPECT_EQ(x.escapes, y.escapes);
    EXPECT_EQ(x.raw.indices, y.raw.indices);
    EXPECT_EQ(x.raw.values, y.raw.values);
  }
  EXPECT_EQ(used.applied, fresh.applied);
}

}  // namespace
}  // namespace deltasync
