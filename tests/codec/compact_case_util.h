// The compact decoder's test case (compact_decode_test.cc,
// compact_apply_test.cc): tensors whose exponents span every class, a run of
// changes across many chunk borders, a tensor smaller than a chunk, one class
// holding nearly every element, and escapes (sign flips, NaN/Inf, large moves);
// base values at every class edge (MakeEdgeCase).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bf16/bf16_test_util.h"
#include "codec/compact_bf16.h"
#include "codec/compact_rice.h"
#include "codec/patch_test_util.h"
#include "deltasync/compact.h"
#include "deltasync/weight_state.h"

namespace deltasync::testing_compact {

using testing::Flatten;

struct Model {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
  void Add(std::string name, std::vector<uint16_t> bits) {
    std::vector<uint8_t> bytes(bits.size() * 2);
    std::memcpy(bytes.data(), bits.data(), bytes.size());
    storage.push_back(std::move(bytes));
    views.push_back({std::move(name), DType::kBF16, {bits.size()}, {}});
  }
  WeightState State() {
    for (size_t i = 0; i < views.size(); ++i) views[i].data = storage[i];
    return std::move(WeightState::FromViews(views)).value();
  }
};

inline uint16_t Bf16(float x) {
  uint32_t f;
  std::memcpy(&f, &x, 4);
  return Fp32ToBf16(f);
}

// Values whose exponents span every class (0 and 15 included).
inline std::vector<uint16_t> Spread(std::mt19937_64& rng, size_t n) {
  std::uniform_real_distribution<float> exp2(-24.0f, 3.0f);
  std::bernoulli_distribution neg(0.5);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) x = Bf16((neg(rng) ? -1.0f : 1.0f) * std::exp2(exp2(rng)));
  return v;
}

inline TensorChanges Change(const WeightState& s, const std::string& name, const std::vector<uint64_t>& indices,
                     std::mt19937_64& rng) {
  TensorChanges c;
  c.name = name;
  c.dtype = DType::kBF16;
  const WeightState::Tensor* t = s.Find(name);
  std::uniform_int_distribution<int> kind(0, 19);
  for (uint64_t i : indices) {
    uint16_t o;
    std::memcpy(&o, t->data.data() + 2 * i, 2);
    const int k = kind(rng);
    // Mostly +-1 ULP; some larger moves, sign flips and NaN/Inf (escapes).
    uint16_t v = k < 8 ? o + 1 : k < 16 ? o - 1 : k < 18 ? o + 300 : k == 18 ? o ^ 0x8000 : 0x7F80;
    if (v == o) v ^= 1;
    c.indices.push_back(i);
    c.values.push_back(static_cast<uint8_t>(v));
    c.values.push_back(static_cast<uint8_t>(v >> 8));
  }
  return c;
}

// An F32 tensor "a.f32" (300 elements) beside a bf16 one "b.bf16" (700):
// the F32 one's changes (3 elements negated) are coded in raw mode, the
// bf16 one's (7, at block and word edges) as usual.
struct MixedCase {
  WeightState state;
  std::vector<TensorChanges> changes;
};

inline MixedCase MakeMixedCase() {
  std::vector<float> f(300);
  for (size_t i = 0; i < f.size(); ++i) f[i] = 0.5f + static_cast<float>(i);
  std::vector<uint8_t> fbytes(f.size() * 4);
  std::memcpy(fbytes.data(), f.data(), fbytes.size());
  std::mt19937_64 rng(5);
  std::vector<uint16_t> w = Spread(rng, 700);
  std::vector<uint8_t> wbytes(w.size() * 2);
  std::memcpy(wbytes.data(), w.data(), wbytes.size());
  const std::vector<TensorView> views = {{"a.f32", DType::kF32, {f.size()}, fbytes},
                                         {"b.bf16", DType::kBF16, {w.size()}, wbytes}};
  MixedCase m{std::move(WeightState::FromViews(views)).value(), {}};
  TensorChanges fc{"a.f32", DType::kF32, {3, 4, 200}, {}};
  for (uint64_t i : fc.indices) {
    const float v = -f[i];
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&v);
    fc.values.insert(fc.values.end(), b, b + 4);
  }
  m.changes = {fc, Change(m.state, "b.bf16", {0, 1, 2, 63, 64, 500, 699}, rng)};
  return m;
}

struct Case {
  WeightState state;
  StateHash hash;
  std::vector<TensorChanges> changes;  // sorted by name
  std::vector<uint8_t> bytes;
};

// Encodes c.changes on c.state as a compact delta 2 -> 3 into c.bytes.
inline void EncodeCase(Case& c) {
  PatchInfo info;
  info.model_version = 3;
  info.base_version = 2;
  Result<EncodedPatch> e = EncodeCompactDelta(info, c.hash, c.state, c.changes);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  if (e.ok()) c.bytes = Flatten(*e);
}

inline Case MakeCase() {
  std::mt19937_64 rng(11);
  Model m;
  m.Add("big", Spread(rng, 5000));
  // Every element of class 8 (exponent 120) but a few of class 3.
  std::vector<uint16_t> one_class(3000, Bf16(0.01f));
  for (size_t i = 0; i < one_class.size(); i += 97) one_class[i] = Bf16(std::exp2(-12.0f));
  m.Add("one_class", one_class);
  m.Add("small", Spread(rng, 10));
  m.Add("dense", Spread(rng, 2000));
  Case c{m.State(), {}, {}, {}};
  c.hash = HashState(c.state, 1);
  std::vector<uint64_t> big;
  std::bernoulli_distribution p(0.3);
  for (uint64_t i = 0; i < 5000; ++i) {
    // A run of 300 changes across many chunk borders, sparse elsewhere.
    if ((i >= 1000 && i < 1300) || p(rng)) big.push_back(i);
  }
  std::vector<uint64_t> one, small{0, 3, 9}, dense(2000);
  for (uint64_t i = 0; i < 3000; ++i) {
    if (i % 97 != 0 && i % 5 != 1) one.push_back(i);  // class 8 only, most of it
  }
  for (uint64_t i = 0; i < 2000; ++i) dense[i] = i;
  c.changes = {Change(c.state, "big", big, rng), Change(c.state, "dense", dense, rng),
               Change(c.state, "one_class", one, rng), Change(c.state, "small", small, rng)};
  EncodeCase(c);
  return c;
}

// A sparse case for the walk's skipping (compact_walk.cc builds masks only
// for the classes with a change in a 1024-element block): one 20000-element
// tensor (its last block partial) whose exponents span every class, with
// a few changes in classes 0..7 (most blocks hold none, many hold one
// class's), class 12's only change in the last word of block 5, class 14's
// only changes in the last (partial) block and its last element, class 13
// none.
inline Case MakeSparseCase() {
  std::mt19937_64 rng(5);
  Model m;
  m.Add("sparse", Spread(rng, 20000));
  Case c{m.State(), {}, {}, {}};
  c.hash = HashState(c.state, 1);
  const WeightState::Tensor* t = c.state.Find("sparse");
  auto class_of = [&](uint64_t i) {
    uint16_t v;
    std::memcpy(&v, t->data.data() + 2 * i, 2);
    return compact::ClassOf(v);
  };
  std::bernoulli_distribution p(0.004);
  std::vector<uint64_t> idx;
  uint64_t last12 = 0;
  for (uint64_t i = 5 * 1024 + 960; i < 6 * 1024; ++i) {
    if (class_of(i) == 12) last12 = i;
  }
  EXPECT_NE(last12, 0u) << "no class-12 element in the last word of block 5";
  for (uint64_t i = 0; i < 20000; ++i) {
    const int cl = class_of(i);
    if ((cl < 8 && p(rng)) || i == last12 || (cl == 14 && i >= 19 * 1024 && i % 3 == 0) || i == 19999) {
      idx.push_back(i);
    }
  }
  c.changes = {Change(c.state, "sparse", idx, rng)};
  EncodeCase(c);
  return c;
}

// Base values at every class edge (compact::ClassOf): exponents 0 (zeros
// and subnormals), 1, 111, 112, 113, 126, 127, 128, 254 and 255 (Inf, NaN),
// both signs, random mantissas. Tensor "edges" (3000 elements): block 0 of
// those, block 1 all exponent 120 (every other class absent), the partial
// block 2 of those again; "tiny" (17 elements, shorter than a vector) of
// those. A change at about one element in five, and at both tensors' last
// elements.
inline Case MakeEdgeCase() {
  std::mt19937_64 rng(7);
  static constexpr uint16_t kExps[] = {0, 1, 111, 112, 113, 126, 127, 128, 254, 255};
  std::uniform_int_distribution<size_t> pick(0, std::size(kExps) - 1);
  std::uniform_int_distribution<uint32_t> mant(0, 0x7F), sign(0, 1);
  auto edge = [&] { return static_cast<uint16_t>(sign(rng) << 15 | kExps[pick(rng)] << 7 | mant(rng)); };
  std::vector<uint16_t> edges(3000), tiny(17);
  for (size_t i = 0; i < edges.size(); ++i) {
    edges[i] = i >= 1024 && i < 2048 ? static_cast<uint16_t>(sign(rng) << 15 | 120 << 7 | mant(rng)) : edge();
  }
  for (uint16_t& x : tiny) x = edge();
  Model m;
  m.Add("edges", edges);
  m.Add("tiny", tiny);
  Case c{m.State(), {}, {}, {}};
  c.hash = HashState(c.state, 1);
  std::bernoulli_distribution p(0.2);
  std::vector<uint64_t> e_idx, t_idx;
  for (uint64_t i = 0; i < edges.size(); ++i) {
    if (p(rng) || i + 1 == edges.size()) e_idx.push_back(i);
  }
  for (uint64_t i = 0; i < tiny.size(); ++i) {
    if (p(rng) || i + 1 == tiny.size()) t_idx.push_back(i);
  }
  c.changes = {Change(c.state, "edges", e_idx, rng), Change(c.state, "tiny", t_idx, rng)};
  EncodeCase(c);
  return c;
}

// A case large enough (2^20 + 1 elements and more) that the decoder walks
// its chunks on every thread it is given (compact_decode.cc walks fewer
// elements on one thread): "large" (1,050,000 elements spanning every
// class, about 3% changed, runs of 1,100 changes across the borders of the
// decoder's 64 Ki and 128 Ki chunks, none from element 900,000 on: its last chunks
// hold no change) and "after" (40,000 elements, changes only among its
// first 500).
inline Case MakeLargeCase() {
  std::mt19937_64 rng(36);
  Model m;
  m.Add("large", Spread(rng, 1050000));
  m.Add("after", Spread(rng, 40000));
  Case c{m.State(), {}, {}, {}};
  c.hash = HashState(c.state, 1);
  std::bernoulli_distribution p(0.03);
  std::vector<uint64_t> large, after;
  for (uint64_t i = 0; i < 900000; ++i) {
    if ((i >= 65000 && i < 66100) || (i >= 130500 && i < 131600) || p(rng)) large.push_back(i);
  }
  for (uint64_t i = 0; i < 500; ++i) {
    if (p(rng) || i == 499) after.push_back(i);
  }
  c.changes = {Change(c.state, "after", after, rng), Change(c.state, "large", large, rng)};
  EncodeCase(c);
  return c;
}

// fn(threads, chunk) for every SIMD target, 1 to 3 threads and a few chunk
// sizes (a large case: fewer than ForEachRouteTargetThreadCountAndChunk),
// traced; stops at a fatal failure.
inline void ForEachTargetThreadCountAndLargeChunk(const std::function<void(int, uint64_t)>& fn) {
  testing_bf16::ForEachTarget([&] {
    for (int threads : {1, 2, 3}) {
      for (uint64_t chunk : {uint64_t{1000}, uint64_t{4096}, compact::kDecodeChunkSmall, compact::kDecodeChunkLarge}) {
        SCOPED_TRACE("threads " + std::to_string(threads) + ", chunk " + std::to_string(chunk));
        fn(threads, chunk);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  });
}

// The case's tensors, but "one_class" holds half as many class-8 elements
// (from element 1500 on, 2^-12, of another class): the delta's class-8 gaps
// run past them, and only the last chunk of the walk can tell.
inline WeightState ShortOfClass8(const Case& c) {
  Model m;
  for (const WeightState::Tensor& t : c.state.tensors()) {
    std::vector<uint16_t> bits(t.num_elements());
    std::memcpy(bits.data(), t.data.data(), t.data.size());
    if (t.name == "one_class") {
      for (size_t i = 1500; i < bits.size(); ++i) bits[i] = Bf16(std::exp2(-12.0f));
    }
    m.Add(t.name, bits);
  }
  return m.State();
}

// A copy of `s` that owns its bytes (a replica's state to apply onto).
inline WeightState Copy(const WeightState& s) { return std::move(WeightState::FromViews(s.views())).value(); }

// The same tensors (names, order) holding the same bytes.
inline bool SameBytes(const WeightState& a, const WeightState& b) {
  if (a.tensors().size() != b.tensors().size()) return false;
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    if (a.tensors()[i].name != b.tensors()[i].name || a.tensors()[i].data != b.tensors()[i].data) return false;
  }
  return true;
}

// The flat bytes of a compact delta (model version 3 on base version 2) in
// stream `version` and `container`; empty, with a test failure, on an error.
inline std::vector<uint8_t> EncodeBytes(const WeightState& state, const StateHash& hash,
                                        const std::vector<TensorChanges>& changes, int version,
                                        int container = kDefaultCompactContainer) {
  PatchInfo info;
  info.model_version = 3;
  info.base_version = 2;
  Result<EncodedPatch> e = EncodeCompactDelta(info, hash, state, changes, 1, version, container);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? Flatten(*e) : std::vector<uint8_t>{};
}

// Runs fn once per route of the decoder's ranks (compact::RankBuffer): the
// narrow (u32) one these small tensors take, then the wide (u64) one, which
// compact::ForceWideRanks forces; each time it checks first that the parse
// of c's bytes takes that route in every bf16 tensor with changes.
inline void ForEachRankRoute(const Case& c, const std::function<void()>& fn) {
  for (bool wide : {false, true}) {
    SCOPED_TRACE(wide ? "wide (u64) ranks" : "narrow (u32) ranks");
    compact::ForceWideRanks(wide);
    struct Reset {
      ~Reset() { compact::ForceWideRanks(false); }
    } reset;
    Result<SafetensorsFile> f = testing::ParseBytes(c.bytes, "route.safetensors");
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    CompactParse p;
    ASSERT_TRUE(ParseCompactDelta(*f, c.state.views(), 1, p).ok());
    size_t bf16_changed = 0;
    for (const CompactParse::Tensor& t : p.tensors) {
      if (!t.bf16 || t.class_begin[compact::kClasses] == 0) continue;
      ++bf16_changed;
      EXPECT_EQ(t.ranks32.empty(), wide) << t.name;
      EXPECT_EQ(t.ranks.empty(), !wide) << t.name;
    }
    EXPECT_GT(bf16_changed, 0u);
    fn();
  }
}

// fn(threads, chunk) for every rank route (ForEachRankRoute), SIMD target,
// 1 to 3 threads and chunk size from 1 element (borders inside every run of
// changes) to the decoder's own (both sizes, DecodeChunkElements), traced; stops at a fatal failure.
inline void ForEachRouteTargetThreadCountAndChunk(const Case& c, const std::function<void(int, uint64_t)>& fn) {
  ForEachRankRoute(c, [&] {
    testing_bf16::ForEachTarget([&] {
      for (int threads : {1, 2, 3}) {
        for (uint64_t chunk : {uint64_t{1}, uint64_t{7}, uint64_t{63}, uint64_t{64}, uint64_t{100}, uint64_t{1023},
                               uint64_t{1024}, uint64_t{1025}, uint64_t{4096}, compact::kDecodeChunkSmall,
                               compact::kDecodeChunkLarge}) {
          SCOPED_TRACE("threads " + std::to_string(threads) + ", chunk " + std::to_string(chunk));
          fn(threads, chunk);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    });
  });
}

}  // namespace deltasync::testing_compact
