// ViewAsPublished and DetectChanges against views: the same tensors, changes
// and errors as ToPublishedState and DetectChanges against a WeightState,
// with the base read in place (no copy of what is already published form).

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "bf16/bf16_test_util.h"
#include "bf16/chunked.h"
#include "bf16/chunks.h"
#include "deltasync/changes.h"

namespace deltasync {
namespace {

using testing_bf16::ExpectSameChanges;
using testing_bf16::ForEachTarget;
using testing_bf16::Mutate;
using testing_bf16::OwnedTensor;
using testing_bf16::RandomTensor;
using testing_bf16::SetElementBits;
using testing_bf16::Views;

// Unsorted, with f32 that rounds, f32 kept by keep_fp32, and other dtypes.
std::vector<OwnedTensor> Checkpoint(std::mt19937_64& rng) {
  return {
      RandomTensor(rng, "z.mlp.weight", DType::kBF16, {67, 129}),
      RandomTensor(rng, "m.master", DType::kF32, {3001}),
      RandomTensor(rng, "k.router.e_score_correction_bias", DType::kF32, {131}),
      RandomTensor(rng, "a.norm", DType::kBF16, {7}),
      RandomTensor(rng, "e.empty", DType::kBF16, {0, 5}),
      RandomTensor(rng, "h.half", DType::kF16, {77}),
      RandomTensor(rng, "i.ids", DType::kI64, {9}),
      RandomTensor(rng, "s.scalar", DType::kBF16, {}),
  };
}

DetectOptions Options(int threads) {
  DetectOptions o;
  o.threads = threads;
  o.keep_fp32 = [](std::string_view name) { return name.ends_with("e_score_correction_bias"); };
  return o;
}

TEST(ViewAsPublishedTest, SameTensorsAsToPublishedStateAndOnlyRoundedOnesCopied) {
  std::mt19937_64 rng(21);
  const std::vector<OwnedTensor> current = Checkpoint(rng);
  const std::vector<TensorView> views = Views(current);
  auto want = ToPublishedState(views, Options(1));
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  for (uint64_t chunk : {uint64_t{1}, uint64_t{5}, uint64_t{1000}, bf16::kDefaultChunkElements}) {
    for (int threads : {1, 3}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + " threads " + std::to_string(threads));
      auto got = bf16::ViewAsPublishedChunked(views, Options(threads), chunk);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_EQ(got->tensors.size(), want->tensors().size());
      EXPECT_EQ(got->total_elements(), want->total_elements());
      for (size_t i = 0; i < got->tensors.size(); ++i) {
        const TensorView& g = got->tensors[i];
        const WeightState::Tensor& w = want->tensors()[i];
        EXPECT_EQ(g.name, w.name);
        EXPECT_EQ(g.dtype, w.dtype);
        EXPECT_EQ(g.shape, w.shape);
        ASSERT_EQ(g.data.size(), w.data.size()) << w.name;
        EXPECT_TRUE(std::equal(g.data.begin(), g.data.end(), w.data.begin())) << w.name;
        // Read in place unless it is an f32 tensor that rounds to bf16.
        const OwnedTensor* source = nullptr;
        for (const OwnedTensor& t : current) {
          if (t.name == g.name) source = &t;
        }
        ASSERT_NE(source, nullptr);
        const bool rounds = g.name == "m.master";
        EXPECT_EQ(g.data.data() == source->data.data(), !rounds) << g.name;
        EXPECT_EQ(got->rounded.Find(g.name) != nullptr, rounds) << g.name;
      }
    }
  }
}

TEST(ViewAsPublishedTest, DetectAgainstViewsMatchesDetectAgainstTheState) {
  for (double rate : {0.0, 0.001, 0.03, 0.5, 1.0}) {
    SCOPED_TRACE("rate " + std::to_string(rate));
    std::mt19937_64 rng(static_cast<uint64_t>(rate * 1000) + 7);
    std::vector<OwnedTensor> current = Checkpoint(rng);
    auto state = ToPublishedState(Views(current), Options(2));
    auto views = ViewAsPublished(Views(current), Options(2));
    ASSERT_TRUE(state.ok() && views.ok());
    std::vector<OwnedTensor> next = current;
    for (OwnedTensor& t : next) Mutate(rng, t, rate);
    auto want = DetectChanges(*state, Views(next), Options(2));
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    ForEachTarget([&] {
      for (uint64_t chunk : {uint64_t{3}, uint64_t{64}, bf16::kDefaultChunkElements}) {
        for (int threads : {1, 4}) {
          auto got = bf16::DetectChangesChunked(std::span<const TensorView>(views->tensors), Views(next),
                                                Options(threads), chunk);
          ASSERT_TRUE(got.ok()) << got.status().ToString();
          ExpectSameChanges(*got, *want);
        }
      }
    });
  }
}

// Every refusal is worded as the copying path words it.
TEST(ViewAsPublishedTest, SameErrorsAsTheCopyingPath) {
  std::mt19937_64 rng(23);
  const std::vector<OwnedTensor> good = Checkpoint(rng);
  auto expect_same_publish_error = [](const std::vector<OwnedTensor>& current, DetectOptions options) {
    auto want = ToPublishedState(Views(current), options);
    for (uint64_t chunk : {uint64_t{8}, bf16::kDefaultChunkElements}) {
      auto got = bf16::ViewAsPublishedChunked(Views(current), options, chunk);
      ASSERT_FALSE(want.ok());
      ASSERT_FALSE(got.ok());
      EXPECT_EQ(got.status().ToString(), want.status().ToString());
    }
  };
  {  // NaN/Inf: the first in name order, in a viewed and in a rounded tensor
    std::vector<OwnedTensor> bad = good;
    SetElementBits(bad[1].data.data(), 4, 64, 0x7FC00000);  // m.master (rounds)
    SetElementBits(bad[5].data.data(), 2, 70, 0x7C00);      // h.half (viewed)
    expect_same_publish_error(bad, Options(4));
    SetElementBits(bad[5].data.data(), 2, 70, 0);
    expect_same_publish_error(bad, Options(4));
    DetectOptions allow = Options(2);
    allow.allow_nonfinite = true;
    EXPECT_TRUE(ViewAsPublished(Views(bad), allow).ok());
  }
  {  // duplicate names
    std::vector<OwnedTensor> dup = good;
    dup.push_back(good[3]);
    expect_same_publish_error(dup, Options(1));
  }
  {  // bytes that do not match the shape
    std::vector<OwnedTensor> short_data = good;
    short_data[0].data.pop_back();
    expect_same_publish_error(short_data, Options(1));
  }
  // Detect: tensor sets, shapes and dtypes.
  auto state = ToPublishedState(Views(good), Options(1));
  auto views = ViewAsPublished(Views(good), Options(1));
  ASSERT_TRUE(state.ok() && views.ok());
  auto expect_same_detect_error = [&](const std::vector<OwnedTensor>& next) {
    auto want = DetectChanges(*state, Views(next), Options(2));
    auto got = DetectChanges(std::span<const TensorView>(views->tensors), Views(next), Options(2));
    ASSERT_FALSE(want.ok());
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().ToString(), want.status().ToString());
  };
  std::vector<OwnedTensor> missing(good.begin() + 1, good.end());
  expect_same_detect_error(missing);
  std::vector<OwnedTensor> extra = good;
  extra.push_back(RandomTensor(rng, "new.weight", DType::kBF16, {3}));
  expect_same_detect_error(extra);
  std::vector<OwnedTensor> reshaped = good;
  reshaped[0].shape = {129, 67};
  expect_same_detect_error(reshaped);
  std::vector<OwnedTensor> redtyped = good;
  redtyped[5].dtype = DType::kBF16;
  expect_same_detect_error(redtyped);
  std::vector<OwnedTensor> nonfinite = good;
  SetElementBits(nonfinite[0].data.data(), 2, 3, 0x7F80);
  expect_same_detect_error(nonfinite);
}

}  // namespace
}  // namespace deltasync
