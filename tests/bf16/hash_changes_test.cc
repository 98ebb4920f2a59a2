// HashChanges: the parallel sum of HashDelta that replicas and the publisher
// use must equal the serial sum and a full recomputation.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "deltasync/state_hash.h"

namespace deltasync {
namespace {

TEST(HashChangesTest, ParallelSumEqualsSerialSumAndFullRecompute) {
  std::mt19937_64 rng(11);
  // One tensor large enough that its changes split into several work items
  // (1 Mi changes each), plus a small one.
  const uint64_t big = 3'000'000, small = 1000;
  std::vector<uint16_t> a(big), b(small);
  for (auto& x : a) x = static_cast<uint16_t>(rng() & 0x3FFF);
  for (auto& x : b) x = static_cast<uint16_t>(rng() & 0x3FFF);
  std::vector<TensorView> views = {
      {"big", DType::kBF16, {big}, ByteSpan(reinterpret_cast<const uint8_t*>(a.data()), big * 2)},
      {"small", DType::kBF16, {small}, ByteSpan(reinterpret_cast<const uint8_t*>(b.data()), small * 2)}};
  auto state = WeightState::FromViews(views);
  ASSERT_TRUE(state.ok());
  const StateHash before = HashState(*state, 2);

  std::vector<TensorChanges> changes;
  for (const auto& [name, n, stride] : {std::tuple{"big", big, 1u}, std::tuple{"small", small, 7u}}) {
    TensorChanges c{name, DType::kBF16, {}, {}};
    for (uint64_t i = 0; i < n; i += stride) {
      c.indices.push_back(i);
      uint16_t v = static_cast<uint16_t>(rng() & 0x3FFF);
      c.values.insert(c.values.end(), reinterpret_cast<uint8_t*>(&v), reinterpret_cast<uint8_t*>(&v) + 2);
    }
    changes.push_back(std::move(c));
  }
  StateHash serial;
  for (const TensorChanges& c : changes) serial += HashDelta(state->Find(c.name)->view(), c);
  EXPECT_EQ(HashChanges(*state, changes, 1), serial);
  EXPECT_EQ(HashChanges(*state, changes, 4), serial);

  // Apply by hand and compare with a full recomputation.
  for (const TensorChanges& c : changes) {
    WeightState::Tensor* t = state->FindMutable(c.name);
    for (size_t k = 0; k < c.count(); ++k) std::memcpy(&t->data[c.indices[k] * 2], &c.values[k * 2], 2);
  }
  EXPECT_EQ(before + serial, HashState(*state, 2));
}

}  // namespace
}  // namespace deltasync
