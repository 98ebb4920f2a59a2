// An adversarial review of the grouped read (compact_read.cc, ReadTensors;
// session 44 H4): the rANS pieces of many tensors decoded together
// (DecodeRansPieces) must leave each tensor exactly what a one-piece-at-a-
// time read of that stream alone gives (RefRead below: ParseBf16StreamV3Gaps,
// then DecodeRansPiece per piece, then ParseBf16StreamV3Rest), whatever the
// stream order, the grouping and the thread count; a damaged, truncated,
// lengthened or lying stream fails as it does alone and changes no other
// tensor's output; and a refused delta leaves nothing that changes the next
// good decode, parse or apply on the same thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "codec/compact_bf16.h"
#include "codec/compact_case_util.h"
#include "codec/compact_container.h"
#include "codec/compact_read.h"
#include "codec/compact_rans.h"
#include "codec/compact_rice.h"
#include "codec/compact_streams.h"
#include "codec/compact_v3.h"
#include "codec/patch_test_util.h"
#include "deltasync/compact.h"

namespace deltasync {
namespace {

using testing::ParseBytes;
using namespace testing_compact;

struct Spec {
  std::string name;
  size_t elements, changes;
  bool f32 = false;
};

struct Built {
  WeightState state;
  StateHash hash;
  std::vector<TensorChanges> changes;
  std::vector<uint8_t> bytes;
};

std::vector<uint64_t> Sample(std::mt19937_64& rng, size_t n, size_t k) {
  std::vector<uint64_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(k);
  std::sort(all.begin(), all.end());
  return all;
}

// A model of `specs` (names sorted) and a version-3 delta changing each
// tensor's `changes` elements (F32 ones raw mode).
Built Build(const std::vector<Spec>& specs, uint64_t seed, int version = 3) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
  for (const Spec& s : specs) {
    std::vector<uint8_t> bytes;
    if (s.f32) {
      std::vector<float> f(s.elements);
      for (size_t i = 0; i < f.size(); ++i) f[i] = 0.25f + static_cast<float>(i % 1000);
      bytes.resize(f.size() * 4);
      std::memcpy(bytes.data(), f.data(), bytes.size());
    } else {
      std::vector<uint16_t> w = Spread(rng, s.elements);
      bytes.resize(w.size() * 2);
      std::memcpy(bytes.data(), w.data(), bytes.size());
    }
    storage.push_back(std::move(bytes));
    views.push_back({s.name, s.f32 ? DType::kF32 : DType::kBF16, {s.elements}, {}});
  }
  for (size_t i = 0; i < views.size(); ++i) views[i].data = storage[i];
  Built b{std::move(WeightState::FromViews(views)).value(), {}, {}, {}};
  b.hash = HashState(b.state, 1);
  for (const Spec& s : specs) {
    if (s.changes == 0) continue;
    const std::vector<uint64_t> idx = Sample(rng, s.elements, s.changes);
    if (!s.f32) {
      b.changes.push_back(Change(b.state, s.name, idx, rng));
      continue;
    }
    TensorChanges fc{s.name, DType::kF32, idx, {}};
    const WeightState::Tensor* t = b.state.Find(s.name);
    for (uint64_t i : idx) {
      float v;
      std::memcpy(&v, t->data.data() + 4 * i, 4);
      v = -v;
      const uint8_t* p = reinterpret_cast<const uint8_t*>(&v);
      fc.values.insert(fc.values.end(), p, p + 4);
    }
    b.changes.push_back(fc);
  }
  b.bytes = EncodeBytes(b.state, b.hash, b.changes, version);
  return b;
}

// One ReadCompactStreams run, each tensor in its own fresh buffers.
struct Read {
  std::vector<compact::Bf16Tensor> bf;
  std::vector<TensorChanges> raw;
  std::vector<Status> errors;
};

Read ReadAll(const std::vector<const TensorView*>& streams, const std::vector<const TensorView*>& bases,
             const compact::V3Tables* tables, int threads) {
  Read r;
  r.bf.resize(streams.size());
  r.raw.resize(streams.size());
  compact::ReadCompactStreams("delta", streams, bases, tables, threads, r.raw, r.bf, r.errors);
  return r;
}

std::vector<uint8_t> Diffs(const compact::Bf16Tensor& t) {
  return std::vector<uint8_t>(t.diffs.data(), t.diffs.data() + t.count);
}
std::vector<uint64_t> Ranks(const compact::RankBuffer& r, uint64_t count) {
  std::vector<uint64_t> v(count);
  for (uint64_t j = 0; j < count; ++j) v[j] = r[j];
  return v;
}

// Tensor i of a and tensor j of b: the same outcome and outputs.
void ExpectSameTensor(const Read& a, size_t i, const Read& b, size_t j, const std::string& what) {
  ASSERT_EQ(a.errors[i].ToString(), b.errors[j].ToString()) << what;
  if (!a.errors[i].ok()) return;
  const compact::Bf16Tensor &x = a.bf[i], &y = b.bf[j];
  EXPECT_EQ(x.count, y.count) << what;
  EXPECT_EQ(x.class_begin, y.class_begin) << what;
  EXPECT_EQ(Diffs(x), Diffs(y)) << what;
  EXPECT_EQ(Ranks(x.ranks, x.count), Ranks(y.ranks, y.count)) << what;
  EXPECT_EQ(x.escapes, y.escapes) << what;
  EXPECT_EQ(x.escaped, y.escaped) << what;
  EXPECT_EQ(a.raw[i].indices, b.raw[j].indices) << what;
  EXPECT_EQ(a.raw[i].values, b.raw[j].values) << what;
}

// The reference: one v3 bf16 stream alone, every piece through the
// single-piece decoder, then the checks FinishBf16 makes.
struct Ref {
  bool bf16v3 = false;
  std::optional<std::string> err;
  compact::ParsedBf16 p;
  uint64_t count = 0;
};

void RefRead(const TensorView& stream, const TensorView& base, const compact::V3Tables* tables, Ref& ref) {
  compact::Reader in(stream.data);
  std::optional<uint8_t> version = in.Byte(), mode = in.Byte();
  std::optional<uint64_t> count = in.Varint();
  if (!version || !mode || !count || *version != compact::kStreamVersion3 || *mode != compact::kModeBf16 ||
      base.dtype != DType::kBF16 || *count > base.num_elements()) {
    return;  // header errors and raw mode: not this change's code
  }
  ref.bf16v3 = true;
  ref.count = *count;
  ref.p.elements = base.num_elements();
  std::vector<compact::RansPiece> pieces;
  ref.err = compact::ParseBf16StreamV3Gaps(in, *count, tables, ref.p, pieces);
  if (ref.err) return;
  for (compact::RansPiece& q : pieces) q.err = compact::DecodeRansPiece(q.rans, *q.begin, q.lo, q.hi, *tables, q.d);
  ref.err = compact::ParseBf16StreamV3Rest(in, pieces, ref.p.diffs, ref.p.escapes);
  if (ref.err) return;
  if (ref.p.past_class >= 0) {
    ref.err = "gaps run past the elements of exponent class " + std::to_string(ref.p.past_class);
    return;
  }
  const uint64_t escaped = static_cast<uint64_t>(std::count(ref.p.diffs.begin(), ref.p.diffs.end(), 0xFF));
  if (ref.p.escapes.size() != 2 * escaped) ref.err = "escape block does not match the escaped changes";
  else if (in.remaining() != 0) ref.err = std::to_string(in.remaining()) + " trailing bytes after the last block";
}

// Tensor i of `r` against the reference (or, for a stream the reference
// does not read, against that stream read alone).
void ExpectAsReference(const Read& r, size_t i, const TensorView& stream, const TensorView& base,
                       const compact::V3Tables* tables, const Ref& ref, const std::string& what) {
  if (!ref.bf16v3) {
    const Read alone = ReadAll({&stream}, {&base}, tables, 1);
    ExpectSameTensor(r, i, alone, 0, what + " (against the stream alone)");
    return;
  }
  if (ref.err) {
    ASSERT_FALSE(r.errors[i].ok()) << what << ": the reference fails with " << *ref.err;
    EXPECT_NE(r.errors[i].ToString().find(*ref.err), std::string::npos)
        << what << ": " << r.errors[i].ToString() << " against the reference's " << *ref.err;
    return;
  }
  ASSERT_TRUE(r.errors[i].ok()) << what << ": " << r.errors[i].ToString();
  const compact::Bf16Tensor& t = r.bf[i];
  EXPECT_EQ(t.count, ref.count) << what;
  EXPECT_EQ(t.class_begin, ref.p.class_begin) << what;
  EXPECT_EQ(Diffs(t), std::vector<uint8_t>(ref.p.diffs.begin(), ref.p.diffs.end())) << what;
  EXPECT_EQ(Ranks(t.ranks, t.count), Ranks(ref.p.ranks, ref.count)) << what;
  EXPECT_EQ(t.escapes, ref.p.escapes) << what;
}

// A delta's streams and tables, the streams' views into `file`.
struct Listed {
  SafetensorsFile file;
  std::vector<TensorView> base;
  std::vector<TensorView> streams;  // name order
  std::vector<const TensorView*> bases;
  std::optional<compact::V3Tables> tables;
};

std::unique_ptr<Listed> List(const Built& b) {
  Result<SafetensorsFile> f = ParseBytes(b.bytes);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  auto l = std::make_unique<Listed>(Listed{std::move(*f), b.state.views(), {}, {}, {}});
  Result<std::vector<compact::Stream>> s = compact::ListStreams(l->file, l->base);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  for (const compact::Stream& x : *s) {
    l->streams.push_back(x.stream);
    l->bases.push_back(&l->base[x.base]);
  }
  EXPECT_TRUE(compact::ParseDeltaTables(l->file, l->tables).ok());
  return l;
}

// Many small tensors (one-state and two-state single pieces), raw-mode ones
// among them, a few of several pieces (a last piece of one state: 65537
// changes), and hand-made streams of 0 changes; streams in name order,
// reversed, shuffled, and each one twice (the same bytes into two
// tensors' buffers); 1, 2, 3 and 8 threads; both rank routes.
void CheckLayouts(const std::vector<Spec>& specs, uint64_t seed) {
  const Built b = Build(specs, seed);
  ASSERT_FALSE(b.bytes.empty());
  const std::unique_ptr<Listed> l = List(b);
  const compact::V3Tables* t = l->tables ? &*l->tables : nullptr;
  ASSERT_NE(t, nullptr);
  // A stream of 0 changes (bitmap 0, no pieces, no escapes) against each
  // bf16 base that has one.
  static const std::vector<uint8_t> empty = {compact::kStreamVersion3, compact::kModeBf16, 0, 0, 0};
  std::vector<TensorView> zeros;
  std::vector<const TensorView*> zero_bases;
  for (size_t i = 0; i < l->streams.size(); i += 5) {
    if (l->bases[i]->dtype != DType::kBF16) continue;
    zeros.push_back({l->streams[i].name, DType::kU8, {empty.size()}, empty});
    zero_bases.push_back(l->bases[i]);
  }
  std::vector<const TensorView*> all, all_bases;
  for (size_t i = 0; i < l->streams.size(); ++i) {
    all.push_back(&l->streams[i]);
    all_bases.push_back(l->bases[i]);
  }
  for (size_t z = 0; z < zeros.size(); ++z) {
    const size_t at = (z * 7919) % (all.size() + 1);
    all.insert(all.begin() + at, &zeros[z]);
    all_bases.insert(all_bases.begin() + at, zero_bases[z]);
  }
  // Version-2 streams of the same changes (a delta may mix versions) among
  // them, every third tensor's.
  const Built b2 = Build(specs, seed, 2);
  const std::unique_ptr<Listed> l2 = List(b2);
  for (size_t i = 0; i < l2->streams.size(); i += 3) {
    const size_t at = (i * 104729) % (all.size() + 1);
    all.insert(all.begin() + at, &l2->streams[i]);
    all_bases.insert(all_bases.begin() + at, l2->bases[i]);
  }
  std::mt19937_64 rng(seed + 1);
  for (bool wide : {false, true}) {
    compact::ForceWideRanks(wide);
    std::vector<Ref> refs(all.size());
    for (size_t i = 0; i < all.size(); ++i) RefRead(*all[i], *all_bases[i], t, refs[i]);
    for (int order = 0; order < 4; ++order) {
      std::vector<size_t> perm(all.size());
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
      if (order == 1) std::reverse(perm.begin(), perm.end());
      if (order == 2) std::shuffle(perm.begin(), perm.end(), rng);
      if (order == 3) {
        std::vector<size_t> twice;
        for (size_t i : perm) twice.insert(twice.end(), {i, i});
        perm = twice;
      }
      std::vector<const TensorView*> s, bs;
      for (size_t i : perm) {
        s.push_back(all[i]);
        bs.push_back(all_bases[i]);
      }
      for (int threads : {1, 2, 3, 8}) {
        const Read r = ReadAll(s, bs, t, threads);
        for (size_t k = 0; k < s.size(); ++k) {
          ASSERT_TRUE(r.errors[k].ok()) << r.errors[k].ToString();
          ExpectAsReference(r, k, *s[k], *bs[k], t, refs[perm[k]],
                            std::string(wide ? "wide" : "narrow") + " ranks, order " + std::to_string(order) +
                                ", threads " + std::to_string(threads) + ", position " + std::to_string(k) + " (" +
                                s[k]->name + ")");
          if (::testing::Test::HasFatalFailure()) break;
        }
        if (::testing::Test::HasFatalFailure()) break;
      }
    }
  }
  compact::ForceWideRanks(false);
}

std::vector<Spec> SmallSpecs(size_t tiny) {
  std::vector<Spec> specs;
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < tiny; ++i) {
    char name[16];
    std::snprintf(name, sizeof name, "a%04zu", i);
    const size_t changes = 1 + rng() % 140;  // one state below 64 changes
    specs.push_back({name, changes + rng() % 400, changes, i % 9 == 4});
  }
  specs.push_back({"m0", 9000, 2000});
  specs.push_back({"m1", 200000, 65537});  // two pieces, the last of one change
  specs.push_back({"m2", 70000, 65536});   // one full piece
  specs.push_back({"m3", 300000, 140000});  // three pieces, the last of two states
  return specs;
}

TEST(CompactReadReview, ManyTensorsMatchTheOnePieceReferenceInAnyOrder) { CheckLayouts(SmallSpecs(300), 11); }

// One tensor of more changes than a group (8 pieces) among small ones: its
// pieces all in its own group, the small ones before and after in others.
TEST(CompactReadReview, TensorLargerThanAGroup) {
  std::vector<Spec> specs = SmallSpecs(20);
  specs.push_back({"z_big", 1200000, 600000});
  specs.push_back({"z_small", 400, 70});
  CheckLayouts(specs, 12);
}

// A caller's buffers reused from a read where slot 0 held a version-3
// bf16 stream (its rANS pieces left to the group: deferred) for a raw-mode
// stream and a version-2 one: each read as into fresh buffers.
TEST(CompactReadReview, ReusedBuffersCarryNoDeferredRead) {
  const Built b = Build({{"r0", 3000, 100}, {"r1", 300, 40, true}}, 61);
  const Built b2 = Build({{"r0", 3000, 100}, {"r1", 300, 40, true}}, 61, 2);
  const std::unique_ptr<Listed> l = List(b);
  const std::unique_ptr<Listed> l2 = List(b2);
  const compact::V3Tables* t = &*l->tables;
  for (const TensorView* next : {&l->streams[1], &l2->streams[0]}) {
    const TensorView* next_base = next == &l->streams[1] ? l->bases[1] : l2->bases[0];
    Read r;
    r.bf.resize(1);
    r.raw.resize(1);
    compact::ReadCompactStreams("delta", {&l->streams[0]}, {l->bases[0]}, t, 1, r.raw, r.bf, r.errors);
    ASSERT_TRUE(r.errors[0].ok()) << r.errors[0].ToString();
    r.bf[0].escaped.clear();  // the contract: empty
    r.bf[0].count = 0;
    r.raw[0] = TensorChanges{};
    compact::ReadCompactStreams("delta", {next}, {next_base}, t, 1, r.raw, r.bf, r.errors);
    const Read fresh = ReadAll({next}, {next_base}, t, 1);
    if (next_base->dtype == DType::kBF16) {
      ExpectSameTensor(r, 0, fresh, 0, "after a deferred read, " + next->name);
      continue;
    }
    // A raw-mode stream: its outcome and changes (bf is not its output).
    EXPECT_EQ(r.errors[0].ToString(), fresh.errors[0].ToString());
    EXPECT_EQ(r.raw[0].indices, fresh.raw[0].indices);
    EXPECT_EQ(r.raw[0].values, fresh.raw[0].values);
  }
}

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
  std::vector<const TensorView*> s;
  for (const TensorView& x : l.streams) s.push_back(&x);
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
  const Built b = Build(DamageSpecs(), 21);
  const std::unique_ptr<Listed> l = List(b);
  const compact::V3Tables* t = &*l->tables;
  std::vector<const TensorView*> s;
  for (const TensorView& x : l->streams) s.push_back(&x);
  const Read clean = ReadAll(s, l->bases, t, 1);
  for (const Status& e : clean.errors) ASSERT_TRUE(e.ok()) << e.ToString();
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
  const Built b = Build(DamageSpecs(), 23);
  const std::unique_ptr<Listed> l = List(b);
  const compact::V3Tables* t = &*l->tables;
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
      CheckDamage(*l, ReadAll([&] {
                                std::vector<const TensorView*> s;
                                for (const TensorView& x : l->streams) s.push_back(&x);
                                return s;
                              }(),
                              l->bases, t, 1),
                  k, both, "gap " + std::to_string(g) + " rANS " + std::to_string(q), true);
      ++pairs;
    }
  }
  EXPECT_GE(pairs, 12);
}

// Every prefix of each stream of a small delta, a few bytes appended, and
// each count in the header (the change count, the class counts, the piece
// directory) one more or one less: refused, in that tensor only.
TEST(CompactReadReview, TruncatedLengthenedAndLyingStreams) {
  const Built b = Build({{"e0", 3000, 100}, {"e1", 500, 63}, {"e2", 900, 64}, {"e3", 300, 40, true},
                         {"e4", 100, 1}, {"e5", 90000, 66000}, {"e6", 400, 20}},
                        31);
  const std::unique_ptr<Listed> l = List(b);
  const compact::V3Tables* t = &*l->tables;
  std::vector<const TensorView*> s;
  for (const TensorView& x : l->streams) s.push_back(&x);
  const Read clean = ReadAll(s, l->bases, t, 1);
  for (const Status& e : clean.errors) ASSERT_TRUE(e.ok()) << e.ToString();
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
