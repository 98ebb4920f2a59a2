// EncodeCompactDelta against a base given as views (deltasync diff's mapped
// checkpoint) writes the same bytes as against a WeightState holding it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/patch_test_util.h"
#include "deltasync/compact.h"
#include "deltasync/state_hash.h"

namespace deltasync {
namespace {

using testing::Flatten;

TEST(CompactViewsTest, SameBytesAsAgainstTheState) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
  auto add = [&](std::string name, DType dtype, uint64_t n) {
    std::vector<uint8_t> bytes(n * DTypeSize(dtype));
    for (uint64_t k = 0; k < n; ++k) {
      float x = normal(rng);
      uint32_t f;
      std::memcpy(&f, &x, 4);
      if (dtype == DType::kBF16) {
        const uint16_t b = Fp32ToBf16(f);
        std::memcpy(bytes.data() + 2 * k, &b, 2);
      } else {
        std::memcpy(bytes.data() + 4 * k, &f, 4);
      }
    }
    storage.push_back(std::move(bytes));
    views.push_back({std::move(name), dtype, {n}, {}});
  };
  // Not in name order: views may come in any order.
  add("z", DType::kBF16, 20000);
  add("f", DType::kF32, 300);
  add("a", DType::kBF16, 5000);
  add("u", DType::kBF16, 64);  // unchanged
  for (size_t i = 0; i < views.size(); ++i) views[i].data = storage[i];
  auto state = WeightState::FromViews(views);
  ASSERT_TRUE(state.ok());
  std::vector<TensorChanges> changes;
  for (const TensorView& v : views) {
    if (v.name == "u") continue;
    TensorChanges c{v.name, v.dtype, {}, {}};
    const size_t size = DTypeSize(v.dtype);
    for (uint64_t i = rng() % 5; i < v.num_elements(); i += 1 + rng() % 40) {
      c.indices.push_back(i);
      for (size_t b = 0; b < size; ++b) c.values.push_back(v.data[i * size + b] ^ (b == 0 ? 1 + rng() % 3 : 0));
    }
    changes.push_back(std::move(c));
  }
  PatchInfo info;
  info.model_version = 9;
  info.base_version = 8;
  const StateHash hash = HashState(*state, 1);
  EXPECT_EQ(HashTensors(views, 2), hash);
  for (int version : {2, 3, kCompactStreamAuto}) {
    SCOPED_TRACE("stream version " + std::to_string(version));
    auto want = EncodeCompactDelta(info, hash, *state, changes, 2, version);
    auto got = EncodeCompactDelta(info, hash, std::span<const TensorView>(views), changes, 2, version);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(Flatten(*got), Flatten(*want));
  }
  // A change to a tensor the base lacks: the same refusal.
  std::vector<TensorView> fewer(views.begin() + 1, views.end());
  auto partial = WeightState::FromViews(fewer);
  ASSERT_TRUE(partial.ok());
  auto want = EncodeCompactDelta(info, hash, *partial, changes);
  auto got = EncodeCompactDelta(info, hash, std::span<const TensorView>(fewer), changes);
  ASSERT_FALSE(want.ok());
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().ToString(), want.status().ToString());
}

}  // namespace
}  // namespace deltasync
