// StateHash: the SIMD sums against the scalar definition, incremental
// updates against full recomputation, sensitivity, hex, and a known answer
// that pins the function (it is part of the wire format).

#include "deltasync/state_hash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bf16/bf16_test_util.h"
#include "bf16/chunked.h"
#include "bf16/chunks.h"
#include "bf16/hash_term.h"

namespace deltasync {
namespace {

using testing_bf16::ElementBits;
using testing_bf16::ForEachTarget;
using testing_bf16::Mutate;
using testing_bf16::OwnedTensor;
using testing_bf16::RandomTensor;
using testing_bf16::SetElementBits;
using testing_bf16::Views;

// The definition, one element at a time.
StateHash ReferenceHash(const std::vector<TensorView>& tensors) {
  StateHash h;
  for (const TensorView& t : tensors) {
    const auto seeds = state_hash::SeedsFor(t.name, t.dtype, t.shape);
    h += StateHash{seeds.descriptor_term[0], seeds.descriptor_term[1]};
    const size_t size = DTypeSize(t.dtype);
    for (uint64_t i = 0; i < t.num_elements(); ++i) {
      const uint64_t bits = ElementBits(t.data.data(), size, i);
      h.lo += state_hash::ElementTerm(0, seeds.element_seed[0], i, bits);
      h.hi += state_hash::ElementTerm(1, seeds.element_seed[1], i, bits);
    }
  }
  return h;
}

std::vector<OwnedTensor> SomeTensors(std::mt19937_64& rng) {
  return {RandomTensor(rng, "embed", DType::kBF16, {37, 61}),
          RandomTensor(rng, "norm", DType::kBF16, {5}),
          RandomTensor(rng, "bias", DType::kF32, {130}),
          RandomTensor(rng, "f16", DType::kF16, {33}),
          RandomTensor(rng, "steps", DType::kI64, {17}),
          RandomTensor(rng, "mask", DType::kBool, {99}),
          RandomTensor(rng, "empty", DType::kBF16, {0}),
          RandomTensor(rng, "scalar", DType::kF64, {})};
}

TEST(StateHashTest, EveryTargetMatchesTheScalarDefinition) {
  std::mt19937_64 rng(1);
  const std::vector<OwnedTensor> tensors = SomeTensors(rng);
  const StateHash want = ReferenceHash(Views(tensors));
  ForEachTarget([&] {
    for (uint64_t chunk : {uint64_t{1}, uint64_t{13}, bf16::kDefaultChunkElements}) {
      for (int threads : {1, 3}) {
        EXPECT_EQ(bf16::HashTensorsChunked(Views(tensors), threads, chunk), want);
      }
    }
  });
}

// Every tail length and misaligned data, per element width.
TEST(StateHashTest, KernelTailsAndAlignment) {
  std::mt19937_64 rng(2);
  std::vector<uint8_t> bytes(8 * 80 + 1);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  ForEachTarget([&] {
    for (DType dtype : {DType::kU8, DType::kBF16, DType::kF32, DType::kI64}) {
      const size_t size = DTypeSize(dtype);
      for (uint64_t n = 0; n <= 80; ++n) {
        const TensorView t{"t", dtype, {n}, ByteSpan(bytes.data() + 1, n * size)};
        ASSERT_EQ(HashTensors(std::vector<TensorView>{t}, 1), ReferenceHash({t}))
            << DTypeName(dtype) << " n=" << n;
      }
    }
  });
}

// The flat index enters the term as a 64-bit product: check spans that
// start near and above 2^32 without allocating such tensors.
TEST(StateHashTest, KernelIndicesAboveTwoToThe32) {
  std::mt19937_64 rng(3);
  std::vector<uint16_t> data(200);
  for (uint16_t& v : data) v = static_cast<uint16_t>(rng());
  const uint64_t seed[2] = {rng(), rng()};
  for (uint64_t base : {(uint64_t{1} << 32) - 77, (uint64_t{1} << 40) + 3, UINT64_MAX - 500}) {
    uint64_t want[2] = {0, 0};
    for (size_t k = 0; k < data.size(); ++k) {
      for (int lane = 0; lane < 2; ++lane) {
        want[lane] += state_hash::ElementTerm(lane, seed[lane], base + k, data[k]);
      }
    }
    ForEachTarget([&] {
      uint64_t got[2] = {0, 0};
      kernels::HashElements16(data.data(), data.size(), base, seed, got);
      EXPECT_EQ(got[0], want[0]);
      EXPECT_EQ(got[1], want[1]);
      // The delta kernel computes the same terms from explicit indices.
      std::vector<uint64_t> idx(data.size()), bits(data.size()), zeros(data.size(), 0);
      uint64_t zero_terms[2] = {0, 0};
      for (size_t k = 0; k < data.size(); ++k) {
        idx[k] = base + k;
        bits[k] = data[k];
        for (int lane = 0; lane < 2; ++lane) {
          zero_terms[lane] += state_hash::ElementTerm(lane, seed[lane], base + k, 0);
        }
      }
      uint64_t diff[2] = {0, 0};
      kernels::HashTermDiffs(idx.data(), bits.data(), zeros.data(), idx.size(), seed, diff);
      EXPECT_EQ(diff[0], want[0] - zero_terms[0]);
      EXPECT_EQ(diff[1], want[1] - zero_terms[1]);
    });
  }
}

// HashTermDiffs16 (16-bit old and new values as bytes at any alignment)
// equals the scalar definition and HashTermDiffs on every target: every
// tail length, odd byte offsets, indices past 2^32.
TEST(StateHashTest, TermDiffs16MatchesTheDefinitionOnEveryTarget) {
  std::mt19937_64 rng(5);
  const size_t max_n = 70;
  std::vector<uint64_t> idx(max_n), new64(max_n), old64(max_n);
  std::vector<uint8_t> new_bytes(2 * max_n + 1), old_bytes(2 * max_n + 3);
  uint64_t at = (uint64_t{1} << 32) - 20;
  for (size_t k = 0; k < max_n; ++k) {
    at += 1 + rng() % 5;
    idx[k] = at;
    new64[k] = static_cast<uint16_t>(rng());
    old64[k] = static_cast<uint16_t>(rng());
    // Little-endian bytes at offsets 1 and 3: never 2-byte aligned.
    new_bytes[1 + 2 * k] = static_cast<uint8_t>(new64[k]);
    new_bytes[2 + 2 * k] = static_cast<uint8_t>(new64[k] >> 8);
    old_bytes[3 + 2 * k] = static_cast<uint8_t>(old64[k]);
    old_bytes[4 + 2 * k] = static_cast<uint8_t>(old64[k] >> 8);
  }
  const uint64_t seed[2] = {rng(), rng()};
  ForEachTarget([&] {
    for (size_t n = 0; n <= max_n; ++n) {
      uint64_t want[2] = {7, 9};
      for (size_t k = 0; k < n; ++k) {
        for (int lane = 0; lane < 2; ++lane) {
          want[lane] += state_hash::ElementTerm(lane, seed[lane], idx[k], new64[k]) -
                        state_hash::ElementTerm(lane, seed[lane], idx[k], old64[k]);
        }
      }
      uint64_t got[2] = {7, 9}, wide[2] = {7, 9};
      kernels::HashTermDiffs16(idx.data(), new_bytes.data() + 1, old_bytes.data() + 3, n, seed, got);
      kernels::HashTermDiffs(idx.data(), new64.data(), old64.data(), n, seed, wide);
      EXPECT_EQ(got[0], want[0]) << "n=" << n;
      EXPECT_EQ(got[1], want[1]) << "n=" << n;
      EXPECT_EQ(wide[0], want[0]) << "n=" << n;
      EXPECT_EQ(wide[1], want[1]) << "n=" << n;
    }
  });
}

// HashTermDiffs16At (4-byte offsets from a base, as the compact apply's undo
// log keeps them) equals HashTermDiffs16 on the indices base + offset on
// every target: every tail length, a base that carries the indices past
// 2^32, offsets near 2^32, odd byte offsets of the values.
TEST(StateHashTest, TermDiffs16AtEqualsTermDiffs16OnTheSameIndices) {
  std::mt19937_64 rng(6);
  const size_t max_n = 70;
  std::vector<uint8_t> new_bytes(2 * max_n + 1), old_bytes(2 * max_n + 3);
  for (uint8_t& b : new_bytes) b = static_cast<uint8_t>(rng());
  for (uint8_t& b : old_bytes) b = static_cast<uint8_t>(rng());
  const uint64_t seed[2] = {rng(), rng()};
  for (const auto& [base, first] : {std::pair<uint64_t, uint32_t>{(uint64_t{1} << 32) - 20, 3},
                                   std::pair<uint64_t, uint32_t>{12345, 0xFFFFFE00u},
                                   std::pair<uint64_t, uint32_t>{0, 0}}) {
    std::vector<uint32_t> off(max_n);
    std::vector<uint64_t> idx(max_n);
    uint32_t at = first;
    for (size_t k = 0; k < max_n; ++k) {
      at += 1 + static_cast<uint32_t>(rng() % 5);
      off[k] = at;
      idx[k] = base + at;
    }
    ForEachTarget([&] {
      for (size_t n = 0; n <= max_n; ++n) {
        uint64_t want[2] = {7, 9}, got[2] = {7, 9};
        kernels::HashTermDiffs16(idx.data(), new_bytes.data() + 1, old_bytes.data() + 3, n, seed, want);
        kernels::HashTermDiffs16At(base, off.data(), new_bytes.data() + 1, old_bytes.data() + 3, n, seed, got);
        EXPECT_EQ(got[0], want[0]) << "base " << base << ", n=" << n;
        EXPECT_EQ(got[1], want[1]) << "base " << base << ", n=" << n;
      }
    });
  }
}

// HashChanges16 (the compact decoder's hash kernel behind a public call,
// for `deltasync bench`'s decode floor) is HashDelta of the same changes,
// for bf16 and f16 tensors of any shape; other widths and mismatched value
// sizes are refused.
TEST(StateHashTest, HashChanges16EqualsHashDelta) {
  std::mt19937_64 rng(8);
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    const OwnedTensor t = RandomTensor(rng, "layer.w", dtype, {37, 29});
    TensorChanges c{t.name, dtype, {}, {}};
    std::vector<uint8_t> old;
    for (uint64_t i = 0; i < t.elements(); ++i) {
      if (rng() % 3 != 0) continue;
      c.indices.push_back(i);
      const uint16_t v = static_cast<uint16_t>(rng());
      c.values.push_back(static_cast<uint8_t>(v));
      c.values.push_back(static_cast<uint8_t>(v >> 8));
      old.push_back(t.data[2 * i]);
      old.push_back(t.data[2 * i + 1]);
    }
    ASSERT_GT(c.count(), 100u);
    ForEachTarget([&] {
      Result<StateHash> h = HashChanges16(t.name, dtype, t.shape, c.indices, old, c.values);
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      EXPECT_EQ(*h, HashDelta(t.view(), c));
      EXPECT_NE(*h, StateHash{});
    });
  }
  const std::vector<uint64_t> idx = {1, 2}, shape = {4};
  const std::vector<uint8_t> four(4), eight(8);
  EXPECT_EQ(HashChanges16("w", DType::kF32, shape, idx, eight, eight).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(HashChanges16("w", DType::kBF16, shape, idx, four, eight).status().code(), ErrorCode::kInvalidArgument);
}

// Applies detected changes to `state` in place.
void Apply(WeightState& state, const std::vector<TensorChanges>& changes) {
  for (const TensorChanges& tc : changes) {
    WeightState::Tensor* t = state.FindMutable(tc.name);
    const size_t size = DTypeSize(t->dtype);
    for (size_t k = 0; k < tc.count(); ++k) {
      std::memcpy(t->data.data() + tc.indices[k] * size, tc.values.data() + k * size, size);
    }
  }
}

TEST(StateHashTest, IncrementalEqualsFullOverManyRounds) {
  std::mt19937_64 rng(4);
  std::vector<OwnedTensor> current = SomeTensors(rng);
  auto state_or = WeightState::FromViews(Views(current));
  ASSERT_TRUE(state_or.ok());
  WeightState state = std::move(state_or).value();
  StateHash h = HashState(state);
  ForEachTarget([&] {
    for (int round = 0; round < 25; ++round) {
      const double rate = round % 5 == 0 ? 1.0 : 0.02 * (round % 5);
      for (OwnedTensor& t : current) Mutate(rng, t, rate);
      auto changes = DetectChanges(state, Views(current), {.threads = 2});
      ASSERT_TRUE(changes.ok()) << changes.status().ToString();
      for (const TensorChanges& tc : *changes) h += HashDelta(state.Find(tc.name)->view(), tc);
      Apply(state, *changes);
      ASSERT_EQ(h, HashState(state, 2)) << "round " << round;
    }
  });
}

TEST(StateHashTest, HashDeltaOfNoOpAndOutOfRange) {
  std::mt19937_64 rng(5);
  const OwnedTensor t = RandomTensor(rng, "w", DType::kBF16, {10});
  // Rewriting an element with its own value changes nothing.
  TensorChanges same{"w", DType::kBF16, {4}, {t.data[8], t.data[9]}};
  EXPECT_EQ(HashDelta(t.view(), same), StateHash{});
  // Indices past the end break the REQUIRES; they are skipped, not read.
  TensorChanges bad{"w", DType::kBF16, {10, 1ull << 60}, {1, 2, 3, 4}};
  EXPECT_EQ(HashDelta(t.view(), bad), StateHash{});
}

StateHash HashOne(const OwnedTensor& t) { return HashTensors(std::vector<TensorView>{t.view()}); }

TEST(StateHashTest, SensitiveToPositionNameShapeAndDtype) {
  std::mt19937_64 rng(6);
  const OwnedTensor base = RandomTensor(rng, "w", DType::kBF16, {2, 3});
  const StateHash h = HashOne(base);

  OwnedTensor swapped = base;  // swap the values of elements 1 and 4
  std::swap_ranges(swapped.data.begin() + 2, swapped.data.begin() + 4, swapped.data.begin() + 8);
  ASSERT_NE(swapped.data, base.data);
  EXPECT_NE(HashOne(swapped), h);

  OwnedTensor moved = base;  // element 0's value moved to element 5, 0 zeroed
  std::copy(base.data.begin(), base.data.begin() + 2, moved.data.begin() + 10);
  moved.data[0] = moved.data[1] = 0;
  EXPECT_NE(HashOne(moved), h);

  OwnedTensor renamed = base;
  renamed.name = "v";
  EXPECT_NE(HashOne(renamed), h);

  OwnedTensor reshaped = base;
  reshaped.shape = {3, 2};
  EXPECT_NE(HashOne(reshaped), h);

  OwnedTensor retyped = base;
  retyped.dtype = DType::kF16;  // same bytes, other dtype
  EXPECT_NE(HashOne(retyped), h);

  // Two tensors with the same bytes but different names.
  OwnedTensor a = base, b = base;
  b.name = "w2";
  EXPECT_NE(HashOne(a), HashOne(b));

  // A state is a set of tensors: their order in the list does not matter.
  const std::vector<OwnedTensor> ab = {a, b}, ba = {b, a};
  EXPECT_EQ(HashTensors(Views(ab)), HashTensors(Views(ba)));
}

// The term is a bijection of the element bits, so any single-element change
// moves both lanes.
TEST(StateHashTest, EverySingleElementChangeMovesBothLanes) {
  std::mt19937_64 rng(7);
  OwnedTensor t = RandomTensor(rng, "w", DType::kBF16, {64});
  const StateHash h = HashOne(t);
  for (int trial = 0; trial < 2000; ++trial) {
    const uint64_t i = rng() % 64;
    const uint64_t old = ElementBits(t.data.data(), 2, i);
    const uint64_t now = old ^ (1 + rng() % 0xFFFF);
    TensorChanges tc{
        "w", DType::kBF16, {i}, {static_cast<uint8_t>(now), static_cast<uint8_t>(now >> 8)}};
    const StateHash d = HashDelta(t.view(), tc);
    ASSERT_NE(d.lo, 0u);
    ASSERT_NE(d.hi, 0u);
  }
  EXPECT_EQ(HashOne(t), h);
}

TEST(StateHashTest, HexRoundTrip) {
  const StateHash h{0x0123456789ABCDEFull, 0xFEDCBA9876543210ull};
  EXPECT_EQ(h.Hex(), "fedcba98765432100123456789abcdef");
  auto parsed = StateHash::FromHex(h.Hex());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, h);
  EXPECT_EQ(StateHash{}.Hex(), std::string(32, '0'));
  std::mt19937_64 rng(8);
  for (int i = 0; i < 100; ++i) {
    const StateHash r{rng(), rng()};
    EXPECT_EQ(StateHash::FromHex(r.Hex()).value(), r);
  }
}

TEST(StateHashTest, FromHexRejectsBadInput) {
  for (const std::string& bad : std::vector<std::string>{
           "", "0", std::string(31, '0'), std::string(33, '0'),
           "FEDCBA98765432100123456789ABCDEF",  // upper case
           "fedcba98765432100123456789abcdeg", " edcba98765432100123456789abcdef",
           "0x dcba98765432100123456789abcdef", std::string(31, '0') + '\0'}) {
    auto r = StateHash::FromHex(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("state hash"), std::string::npos);
  }
}

// The state described in docs/format.md, "State hash" ("Test vector"). If this
// fails the function changed: that breaks every stored manifest.
TEST(StateHashTest, KnownAnswer) {
  const std::vector<uint8_t> a = {0x80, 0x3F, 0x80, 0xBF, 0x00, 0x00,   // 1, -1, 0
                                  0x00, 0x80, 0x7F, 0x7F, 0x01, 0x00};  // -0, max, min subnormal
  const std::vector<uint8_t> b = {0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x20, 0xC0};  // 1.0f, -2.5f
  const std::vector<uint8_t> c = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};  // -1
  const std::vector<uint8_t> d = {};
  const std::vector<TensorView> state = {
      {"model.layers.0.weight", DType::kBF16, {2, 3}, a},
      {"model.bias", DType::kF32, {2}, b},
      {"step", DType::kI64, {}, c},
      {"empty", DType::kU8, {0}, d},
  };
  const StateHash h = HashTensors(state, 1);
  EXPECT_EQ(h, ReferenceHash(state));
  EXPECT_EQ(h.Hex(), "d39810e37cd7c6ba08863f903193d45c");
}

}  // namespace
}  // namespace deltasync
