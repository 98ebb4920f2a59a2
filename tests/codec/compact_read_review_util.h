// The grouped read's review tests (compact_read_layout_test.cc,
// compact_read_damage_test.cc; session 44 H4): a delta of many tensors
// built from specs (Build), its streams listed (List) and read by the
// decoder's own read (ReadAll: compact::ReadCompactStreams, each tensor in
// fresh buffers), and the one-piece-at-a-time reference read of a single
// version-3 bf16 stream (RefRead) to compare each tensor against.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "codec/compact_bf16.h"
#include "codec/compact_case_util.h"
#include "codec/compact_container.h"
#include "codec/compact_rans.h"
#include "codec/compact_read.h"
#include "codec/compact_streams.h"
#include "codec/compact_v3.h"
#include "codec/patch_test_util.h"
#include "deltasync/compact.h"

namespace deltasync::testing_read {

using namespace testing_compact;
using testing::ParseBytes;

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

inline std::vector<uint64_t> Sample(std::mt19937_64& rng, size_t n, size_t k) {
  std::vector<uint64_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(k);
  std::sort(all.begin(), all.end());
  return all;
}

// A model of `specs` (names sorted) and a version-3 delta changing each
// tensor's `changes` elements (F32 ones raw mode).
inline Built Build(const std::vector<Spec>& specs, uint64_t seed, int version = 3) {
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

inline Read ReadAll(const std::vector<const TensorView*>& streams, const std::vector<const TensorView*>& bases,
             const compact::V3Tables* tables, int threads) {
  Read r;
  r.bf.resize(streams.size());
  r.raw.resize(streams.size());
  compact::ReadCompactStreams("delta", streams, bases, tables, threads, r.raw, r.bf, r.errors);
  return r;
}

inline std::vector<uint8_t> Diffs(const compact::Bf16Tensor& t) {
  return std::vector<uint8_t>(t.diffs.data(), t.diffs.data() + t.count);
}
inline std::vector<uint64_t> Ranks(const compact::RankBuffer& r, uint64_t count) {
  std::vector<uint64_t> v(count);
  for (uint64_t j = 0; j < count; ++j) v[j] = r[j];
  return v;
}

// Tensor i of a and tensor j of b: the same outcome and outputs.
inline void ExpectSameTensor(const Read& a, size_t i, const Read& b, size_t j, const std::string& what) {
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

inline void RefRead(const TensorView& stream, const TensorView& base, const compact::V3Tables* tables, Ref& ref) {
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
inline void ExpectAsReference(const Read& r, size_t i, const TensorView& stream, const TensorView& base,
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

inline std::unique_ptr<Listed> List(const Built& b) {
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

// The pointers to l's streams, in name order.
inline std::vector<const TensorView*> StreamsOf(const Listed& l) {
  std::vector<const TensorView*> s;
  for (const TensorView& x : l.streams) s.push_back(&x);
  return s;
}

// A delta of `specs` (Build with `seed`), its streams listed, and all of
// them read together on one thread (`clean`). Filled in place (l views b).
struct CleanRead {
  Built b;
  std::unique_ptr<Listed> l;
  const compact::V3Tables* t = nullptr;
  std::vector<const TensorView*> s;  // l's streams
  Read clean;
};

// Fills x; a fatal failure (the caller: ASSERT_NO_FATAL_FAILURE) where a
// stream of the clean read fails.
inline void ReadClean(const std::vector<Spec>& specs, uint64_t seed, CleanRead& x) {
  x.b = Build(specs, seed);
  x.l = List(x.b);
  x.t = &*x.l->tables;
  x.s = StreamsOf(*x.l);
  x.clean = ReadAll(x.s, x.l->bases, x.t, 1);
  for (const Status& e : x.clean.errors) ASSERT_TRUE(e.ok()) << e.ToString();
}

}  // namespace deltasync::testing_read
