// DetectChanges and ToPublishedState against straightforward references,
// across change rates, sizes, thread counts, chunk sizes and SIMD targets.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bf16/bf16_test_util.h"
#include "bf16/chunked.h"
#include "bf16/chunks.h"
#include "bf16/detect_apply.h"
#include "bf16/scratch.h"
#include "deltasync/changes.h"
#include "deltasync/patch.h"
#include "deltasync/state_hash.h"

namespace deltasync {
namespace {

using testing_bf16::ElementBits;
using testing_bf16::ExpectSameChanges;
using testing_bf16::ForEachTarget;
using testing_bf16::Mutate;
using testing_bf16::OwnedTensor;
using testing_bf16::RandomTensor;
using testing_bf16::ReferenceDetect;
using testing_bf16::SetElementBits;
using testing_bf16::Views;

WeightState StateOf(const std::vector<OwnedTensor>& tensors) {
  auto state = WeightState::FromViews(Views(tensors));
  EXPECT_TRUE(state.ok()) << state.status().ToString();
  return std::move(state).value();
}

// A model-like mix: bf16 weights of awkward sizes (not multiples of any
// vector width), an empty tensor, and other dtypes carried bitwise.
std::vector<OwnedTensor> MixedTensors(std::mt19937_64& rng) {
  return {
      RandomTensor(rng, "layers.0.attn.q_proj.weight", DType::kBF16, {67, 129}),
      RandomTensor(rng, "layers.0.mlp.down_proj.weight", DType::kBF16, {3001}),
      RandomTensor(rng, "layers.0.norm.weight", DType::kBF16, {7}),
      RandomTensor(rng, "layers.0.empty", DType::kBF16, {0, 5}),
      RandomTensor(rng, "layers.0.router.bias", DType::kF32, {131}),
      RandomTensor(rng, "layers.0.f16", DType::kF16, {77}),
      RandomTensor(rng, "layers.0.f64", DType::kF64, {45}),
      RandomTensor(rng, "layers.0.steps", DType::kI64, {9}),
      RandomTensor(rng, "layers.0.ids", DType::kI32, {65}),
      RandomTensor(rng, "layers.0.mask", DType::kBool, {200}),
      RandomTensor(rng, "layers.0.fp8", DType::kF8_E4M3, {333}),
      RandomTensor(rng, "a.scalar", DType::kBF16, {}),
  };
}

TEST(DetectChangesTest, MatchesReferenceAtEveryChangeRate) {
  for (double rate : {0.0, 0.001, 0.034, 0.5, 1.0}) {
    SCOPED_TRACE("rate " + std::to_string(rate));
    std::mt19937_64 rng(static_cast<uint64_t>(rate * 1000) + 1);
    std::vector<OwnedTensor> tensors = MixedTensors(rng);
    const WeightState published = StateOf(tensors);
    for (OwnedTensor& t : tensors) Mutate(rng, t, rate);
    const auto want = ReferenceDetect(published, tensors);
    if (rate == 1.0) {
      uint64_t changed = 0;
      for (const auto& tc : want) changed += tc.count();
      EXPECT_EQ(changed, published.total_elements());
    }
    ForEachTarget([&] {
      auto got = DetectChanges(published, Views(tensors), {.threads = 2});
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ExpectSameChanges(*got, want);
    });
  }
}

// The workers' scratch is kept between calls: a call after a larger one,
// with other thread counts, and calls running at the same time each find
// exactly their own changes.
TEST(DetectChangesTest, ScratchReusedAcrossCallsAndThreads) {
  std::mt19937_64 rng(17);
  std::vector<OwnedTensor> base = MixedTensors(rng);
  const WeightState published = StateOf(base);
  std::vector<std::vector<OwnedTensor>> steps;
  std::vector<std::vector<TensorChanges>> wants;
  for (double rate : {1.0, 0.01, 0.5, 0.0, 0.2}) {
    std::vector<OwnedTensor> t = base;
    for (OwnedTensor& o : t) Mutate(rng, o, rate);
    wants.push_back(ReferenceDetect(published, t));
    steps.push_back(std::move(t));
  }
  for (int threads : {3, 1, 2}) {
    for (size_t i = 0; i < steps.size(); ++i) {
      SCOPED_TRACE("threads " + std::to_string(threads) + " step " + std::to_string(i));
      auto got = bf16::DetectChangesChunked(published, Views(steps[i]), {.threads = threads}, 100);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ExpectSameChanges(*got, wants[i]);
    }
  }
  std::vector<std::thread> callers;
  std::vector<int> right(steps.size(), 0);
  for (size_t i = 0; i < steps.size(); ++i) {
    callers.emplace_back([&, i] {
      for (int r = 0; r < 20; ++r) {
        auto got = bf16::DetectChangesChunked(published, Views(steps[i]), {.threads = 2}, 64);
        bool same = got.ok() && got->size() == wants[i].size();
        for (size_t k = 0; same && k < got->size(); ++k) {
          same = (*got)[k].name == wants[i][k].name && (*got)[k].indices == wants[i][k].indices &&
                 (*got)[k].values == wants[i][k].values;
        }
        right[i] += same;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(right[i], 20) << "step " << i;
}

// DetectChanges into `out` (the training loop's call): whatever `out` held
// before (more entries, fewer, larger or smaller), it ends up holding what
// the fresh call returns, across growing and shrinking change counts, chunk
// sizes and thread counts; an error leaves it empty, and the next call
// fills it again.
TEST(DetectChangesTest, IntoReusedOutputEqualsFresh) {
  std::mt19937_64 rng(29);
  std::vector<OwnedTensor> base = MixedTensors(rng);
  const WeightState published = StateOf(base);
  for (uint64_t chunk : {uint64_t{100}, bf16::kDefaultChunkElements}) {
    for (int threads : {1, 3}) {
      std::vector<TensorChanges> out;
      // Stale entries beyond any result's count, with names and bytes.
      out.resize(20);
      for (TensorChanges& c : out) {
        c.name = "stale";
        c.indices.assign(5, 7);
        c.values.assign(3, 9);
      }
      for (double rate : {0.01, 0.5, 0.0, 0.2, 1.0, 0.001, 0.3}) {
        SCOPED_TRACE("chunk " + std::to_string(chunk) + " threads " + std::to_string(threads) + " rate " +
                     std::to_string(rate));
        std::vector<OwnedTensor> t = base;
        for (OwnedTensor& o : t) Mutate(rng, o, rate);
        const auto want = ReferenceDetect(published, t);
        const Status s = bf16::DetectChangesChunked(published, Views(t), {.threads = threads}, chunk, out);
        ASSERT_TRUE(s.ok()) << s.ToString();
        ExpectSameChanges(out, want);
        auto fresh = bf16::DetectChangesChunked(published, Views(t), {.threads = threads}, chunk);
        ASSERT_TRUE(fresh.ok());
        ExpectSameChanges(out, *fresh);
      }
      // An error (a NaN) empties `out`, with the fresh call's message.
      std::vector<OwnedTensor> bad = base;
      SetElementBits(bad[1].data.data(), 2, 100, 0x7FC1);
      const Status s = bf16::DetectChangesChunked(published, Views(bad), {.threads = threads}, chunk, out);
      auto fresh = bf16::DetectChangesChunked(published, Views(bad), {.threads = threads}, chunk);
      ASSERT_FALSE(s.ok());
      ASSERT_FALSE(fresh.ok());
      EXPECT_EQ(s.ToString(), fresh.status().ToString());
      EXPECT_TRUE(out.empty());
      // A mismatched tensor set (refused before the scan) too.
      ASSERT_TRUE(bf16::DetectChangesChunked(published, Views(base), {.threads = threads}, chunk, out).ok());
      std::vector<OwnedTensor> fewer(base.begin(), base.end() - 1);
      EXPECT_FALSE(bf16::DetectChangesChunked(published, Views(fewer), {.threads = threads}, chunk, out).ok());
      EXPECT_TRUE(out.empty());
      std::vector<OwnedTensor> again = base;
      for (OwnedTensor& o : again) Mutate(rng, o, 0.1);
      ASSERT_TRUE(DetectChanges(published, Views(again), {.threads = threads}, out).ok());
      ExpectSameChanges(out, ReferenceDetect(published, again));
    }
  }
}

TEST(DetectChangesTest, ZeroChangesGivesEmptyResult) {
  std::mt19937_64 rng(3);
  const std::vector<OwnedTensor> tensors = MixedTensors(rng);
  const WeightState published = StateOf(tensors);
  auto got = DetectChanges(published, Views(tensors));
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->empty());
}

// Chunk boundaries anywhere, and any thread count, give the same output.
TEST(DetectChangesTest, ChunkSizeAndThreadsDoNotMatter) {
  std::mt19937_64 rng(11);
  std::vector<OwnedTensor> tensors = MixedTensors(rng);
  const WeightState published = StateOf(tensors);
  for (OwnedTensor& t : tensors) Mutate(rng, t, 0.05);
  const auto want = ReferenceDetect(published, tensors);
  for (uint64_t chunk :
       {uint64_t{1}, uint64_t{3}, uint64_t{64}, uint64_t{1000}, bf16::kDefaultChunkElements}) {
    for (int threads : {1, 4}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + " threads " + std::to_string(threads));
      auto got = bf16::DetectChangesChunked(published, Views(tensors), {.threads = threads}, chunk);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ExpectSameChanges(*got, want);
    }
  }
}

// The chunks' changes land in their tensor's output in chunk order,
// whatever the chunk size and thread count: a tensor whose change rate rises
// along it (from 1 in 1000 to every element), one whose first chunks change
// nothing, one changed only at both ends (chunks without changes between),
// tensors smaller than a chunk and one without changes, with chunk borders
// inside runs of changes, on every target, fresh and into reused outputs
// that are too small (a stale change each) and then the right size.
TEST(DetectChangesTest, ChunksLandInOrderAcrossGrowthAndEmptyChunks) {
  std::mt19937_64 rng(43);
  std::vector<OwnedTensor> base = {
      RandomTensor(rng, "a.rising", DType::kBF16, {20000}), RandomTensor(rng, "b.late", DType::kBF16, {5000}),
      RandomTensor(rng, "c.ends", DType::kF32, {3000}),     RandomTensor(rng, "d.tiny", DType::kBF16, {3}),
      RandomTensor(rng, "e.none", DType::kBF16, {700}),     RandomTensor(rng, "f.one", DType::kBF16, {1}),
  };
  const WeightState published = StateOf(base);
  std::vector<OwnedTensor> current = base;
  const auto change = [](OwnedTensor& t, uint64_t i) {
    const size_t size = DTypeSize(t.dtype);
    SetElementBits(t.data.data(), size, i, ElementBits(t.data.data(), size, i) ^ 1);
  };
  std::bernoulli_distribution coin(0.5);
  for (uint64_t i = 0; i < 20000; ++i) {  // from 1 in 1000 to every element
    if (i >= 15000 || (i >= 5000 && coin(rng)) || i % 1000 == 7) change(current[0], i);
  }
  for (uint64_t i = 4500; i < 5000; ++i) change(current[1], i);
  for (uint64_t i = 0; i < 3000; ++i) {
    if (i < 100 || i >= 2900) change(current[2], i);
  }
  for (uint64_t i = 0; i < 3; ++i) change(current[3], i);
  change(current[5], 0);
  const auto want = ReferenceDetect(published, current);
  ASSERT_EQ(want.size(), 5u);
  ForEachTarget([&] {
    for (uint64_t chunk : {uint64_t{1}, uint64_t{7}, uint64_t{64}, uint64_t{333}, uint64_t{4096},
                           bf16::kDefaultChunkElements}) {
      for (int threads : {1, 2, 5}) {
        SCOPED_TRACE("chunk " + std::to_string(chunk) + " threads " + std::to_string(threads));
        auto fresh = bf16::DetectChangesChunked(published, Views(current), {.threads = threads}, chunk);
        ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
        ExpectSameChanges(*fresh, want);
        // Into reused entries: too small ones (each with a stale change), then
        // the right sizes.
        std::vector<TensorChanges> out(2);
        for (TensorChanges& c : out) {
          c.indices.assign(1, 99);
          c.values.assign(2, 9);
        }
        for (int call = 0; call < 2; ++call) {
          ASSERT_TRUE(bf16::DetectChangesChunked(published, Views(current), {.threads = threads}, chunk, out).ok());
          ExpectSameChanges(out, want);
        }
      }
    }
  });
}

// fp32 masters against a bf16 published state: rounding happens first, so
// fp32 changes below half a bf16 ulp are not changes.
TEST(DetectChangesTest, Fp32CurrentIsRoundedBeforeComparing) {
  std::mt19937_64 rng(5);
  OwnedTensor master = RandomTensor(rng, "w", DType::kF32, {4099});
  OwnedTensor bf{"w", DType::kBF16, {4099}, std::vector<uint8_t>(4099 * 2)};
  ConvertFp32ToBf16(reinterpret_cast<const float*>(master.data.data()),
                    reinterpret_cast<uint16_t*>(bf.data.data()), 4099);
  const WeightState published = StateOf({bf});
  for (uint64_t i = 0; i < 4099; ++i) {
    uint64_t bits = ElementBits(master.data.data(), 4, i);
    if (rng() % 4 == 0) bits ^= (rng() & 0x3F) << 16;  // moves the bf16 value
    bits ^= rng() & 0x7FFF;  // below the rounding bit: may or may not round differently
    SetElementBits(master.data.data(), 4, i, bits);
  }
  const auto want = ReferenceDetect(published, {master});
  ASSERT_EQ(want.size(), 1u);
  EXPECT_GT(want[0].count(), 500u);
  EXPECT_LT(want[0].count(), 4099u);
  ForEachTarget([&] {
    for (uint64_t chunk : {uint64_t{7}, bf16::kDefaultChunkElements}) {
      auto got = bf16::DetectChangesChunked(published, Views({master}), {.threads = 3}, chunk);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ExpectSameChanges(*got, want);
      EXPECT_EQ((*got)[0].dtype, DType::kBF16);
    }
  });
}

TEST(DetectChangesTest, OtherDtypesAreCarriedWithTheirDtype) {
  std::mt19937_64 rng(8);
  std::vector<OwnedTensor> tensors = {RandomTensor(rng, "router.bias", DType::kF32, {10}),
                                      RandomTensor(rng, "w", DType::kBF16, {10})};
  const WeightState published = StateOf(tensors);
  SetElementBits(tensors[0].data.data(), 4, 3, 0x3F800000);  // 1.0f
  auto got = DetectChanges(published, Views(tensors));
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 1u);
  const TensorChanges& tc = (*got)[0];
  EXPECT_EQ(tc.name, "router.bias");
  EXPECT_EQ(tc.dtype, DType::kF32);
  EXPECT_EQ(tc.indices, std::vector<uint64_t>{3});
  EXPECT_EQ(tc.values, (std::vector<uint8_t>{0x00, 0x00, 0x80, 0x3F}));
}

// Results come in published (sorted) order whatever order current is in.
TEST(DetectChangesTest, OutputFollowsPublishedOrder) {
  std::mt19937_64 rng(9);
  std::vector<OwnedTensor> tensors = {RandomTensor(rng, "c", DType::kBF16, {50}),
                                      RandomTensor(rng, "a", DType::kBF16, {50}),
                                      RandomTensor(rng, "b", DType::kBF16, {50})};
  const WeightState published = StateOf(tensors);
  for (OwnedTensor& t : tensors) Mutate(rng, t, 1.0);
  auto got = DetectChanges(published, Views(tensors));
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 3u);
  EXPECT_EQ((*got)[0].name, "a");
  EXPECT_EQ((*got)[1].name, "b");
  EXPECT_EQ((*got)[2].name, "c");
}

class NonFiniteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(21);
    tensors_ = {RandomTensor(rng, "a.ok", DType::kBF16, {300}),
                RandomTensor(rng, "b.weight", DType::kBF16, {3000}),
                RandomTensor(rng, "c.ids", DType::kI32, {20})};
    published_ = StateOf(tensors_);
  }
  std::vector<OwnedTensor> tensors_;
  WeightState published_;
};

TEST_F(NonFiniteTest, NaNIsRefusedNamingTensorAndFirstIndex) {
  SetElementBits(tensors_[1].data.data(), 2, 2500, 0xFFC1);  // NaN
  SetElementBits(tensors_[1].data.data(), 2, 1777, 0x7F80);  // +Inf, earlier
  // An integer whose bits look like Inf is not a float: never refused.
  SetElementBits(tensors_[2].data.data(), 4, 0, 0x7F800000);
  for (uint64_t chunk : {uint64_t{1}, uint64_t{100}, bf16::kDefaultChunkElements}) {
    for (int threads : {1, 4}) {
      auto got =
          bf16::DetectChangesChunked(published_, Views(tensors_), {.threads = threads}, chunk);
      ASSERT_FALSE(got.ok());
      EXPECT_EQ(got.status().code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(got.status().message().find("tensor 'b.weight': element 1777 is +Inf"),
                std::string::npos)
          << got.status().message();
    }
  }
}

TEST_F(NonFiniteTest, AllowNonfinitePassesBitsThrough) {
  SetElementBits(tensors_[1].data.data(), 2, 2500, 0xFFC1);
  auto got = DetectChanges(published_, Views(tensors_), {.allow_nonfinite = true});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameChanges(*got, ReferenceDetect(published_, tensors_));
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].indices, std::vector<uint64_t>{2500});
  EXPECT_EQ((*got)[0].values, (std::vector<uint8_t>{0xC1, 0xFF}));
}

TEST_F(NonFiniteTest, UnchangedNaNIsStillRefused) {
  // The published state itself may hold a NaN (published with
  // allow_nonfinite); the current weights are what is checked.
  SetElementBits(tensors_[0].data.data(), 2, 5, 0x7FC0);
  auto nan_published = WeightState::FromViews(Views(tensors_));
  ASSERT_TRUE(nan_published.ok());
  auto got = DetectChanges(*nan_published, Views(tensors_));
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("tensor 'a.ok': element 5 is NaN"), std::string::npos)
      << got.status().message();
}

TEST(DetectNonFiniteTest, Fp32OverflowAndOtherFloatDtypes) {
  std::mt19937_64 rng(4);
  OwnedTensor master = RandomTensor(rng, "w", DType::kF32, {40});
  OwnedTensor bf{"w", DType::kBF16, {40}, std::vector<uint8_t>(80)};
  const WeightState published = StateOf({bf});
  SetElementBits(master.data.data(), 4, 33, 0x7F7FFFFF);  // finite, rounds to +Inf
  auto got = DetectChanges(published, Views({master}));
  ASSERT_FALSE(got.ok());
  EXPECT_NE(
      got.status().message().find("tensor 'w': element 33 is fp32 3.40282347e+38, which rounds "
                                  "to bf16 +Inf"),
      std::string::npos)
      << got.status().message();

  for (DType dtype : {DType::kF16, DType::kF32, DType::kF64}) {
    OwnedTensor t = RandomTensor(rng, "x", dtype, {19});
    const WeightState pub = StateOf({t});
    const size_t size = DTypeSize(dtype);
    const uint64_t neg_inf = dtype == DType::kF16   ? 0xFC00
                             : dtype == DType::kF32 ? 0xFF800000
                                                    : 0xFFF0000000000000;
    SetElementBits(t.data.data(), size, 18, neg_inf);
    auto r = DetectChanges(pub, Views({t}));
    ASSERT_FALSE(r.ok()) << DTypeName(dtype);
    EXPECT_NE(r.status().message().find("tensor 'x': element 18 is -Inf"), std::string::npos)
        << r.status().message();
    EXPECT_TRUE(DetectChanges(pub, Views({t}), {.allow_nonfinite = true}).ok());
  }
}

TEST(TensorSetDiffTest, NamesAPrefixThatExplainsTheDifference) {
  const std::vector<std::string> plain = {"lm_head.weight", "model.embed.weight", "model.norm.weight"};
  std::vector<std::string> wrapped, compiled;
  for (const std::string& n : plain) {
    wrapped.push_back("module." + n);
    compiled.push_back("_orig_mod." + n);
  }
  EXPECT_EQ(DescribeTensorSetDiff(plain, wrapped), "all 3 tensors missing, 3 new; they differ by the prefix 'module.'");
  EXPECT_EQ(DescribeTensorSetDiff(wrapped, plain), "all 3 tensors missing, 3 new; they differ by the prefix 'module.'");
  EXPECT_EQ(DescribeTensorSetDiff(plain, compiled),
            "all 3 tensors missing, 3 new; they differ by the prefix '_orig_mod.'");
  EXPECT_EQ(DescribeTensorSetDiff(plain, plain), "");
  EXPECT_EQ(DescribeTensorSetDiff(plain, std::vector<std::string>{"model.norm.weight", "x", "y"}),
            "2 tensors missing (first: 'lm_head.weight'), 2 new (first: 'x')");
}

TEST(DetectErrorsTest, RenamedCheckpointSaysWhichPrefix) {
  std::mt19937_64 rng(8);
  const std::vector<OwnedTensor> tensors = {RandomTensor(rng, "a", DType::kBF16, {2, 3}),
                                            RandomTensor(rng, "b", DType::kBF16, {4})};
  std::vector<OwnedTensor> renamed = tensors;
  for (OwnedTensor& t : renamed) t.name = "module." + t.name;
  auto got = DetectChanges(StateOf(tensors), Views(renamed));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().message(),
            "the tensors differ from the base's: all 2 tensors missing, 2 new; they differ by the prefix 'module.'");
}

TEST(DetectErrorsTest, MismatchesNameTheTensor) {
  std::mt19937_64 rng(6);
  const std::vector<OwnedTensor> tensors = {RandomTensor(rng, "a", DType::kBF16, {2, 3}),
                                            RandomTensor(rng, "b", DType::kF32, {4})};
  const WeightState published = StateOf(tensors);
  auto expect_error = [&](std::vector<OwnedTensor> current, const std::string& text) {
    auto got = DetectChanges(published, Views(current));
    ASSERT_FALSE(got.ok()) << text;
    EXPECT_EQ(got.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(text), std::string::npos) << got.status().message();
  };
  expect_error({tensors[0]}, "the tensors differ from the base's: 1 tensor missing (first: 'b')");
  expect_error({tensors[0], tensors[1], RandomTensor(rng, "z", DType::kBF16, {1})},
               "the tensors differ from the base's: 1 new tensor (first: 'z')");
  expect_error({tensors[0], tensors[1], tensors[1]}, "tensor 'b' appears twice");
  OwnedTensor reshaped = tensors[0];
  reshaped.shape = {3, 2};
  expect_error({reshaped, tensors[1]},
               "tensor 'a': shape [3, 2] does not match the base's [2, 3]");
  OwnedTensor f16 = tensors[0];
  f16.dtype = DType::kF16;
  expect_error({f16, tensors[1]},
               "tensor 'a': dtype F16 cannot be compared with the base's BF16");
  // F32 -> BF16 rounding applies only to a bf16 published tensor.
  OwnedTensor b16{"b", DType::kBF16, {4}, std::vector<uint8_t>(8)};
  expect_error({tensors[0], b16},
               "tensor 'b': dtype BF16 cannot be compared with the base's F32");
  OwnedTensor short_data = tensors[0];
  short_data.data.pop_back();
  expect_error({short_data, tensors[1]}, "tensor 'a': 11 bytes do not match shape [2, 3] x BF16");
}

TEST(ToPublishedStateTest, RoundsF32AndCopiesTheRest) {
  std::mt19937_64 rng(12);
  const std::vector<OwnedTensor> current = {RandomTensor(rng, "z.master", DType::kF32, {1000, 3}),
                                            RandomTensor(rng, "a.bf16", DType::kBF16, {33}),
                                            RandomTensor(rng, "m.ids", DType::kI64, {5}),
                                            RandomTensor(rng, "f.half", DType::kF16, {9})};
  for (uint64_t chunk : {uint64_t{5}, bf16::kDefaultChunkElements}) {
    for (int threads : {1, 3}) {
      auto state = bf16::ToPublishedStateChunked(Views(current), {.threads = threads}, chunk);
      ASSERT_TRUE(state.ok()) << state.status().ToString();
      ASSERT_EQ(state->tensors().size(), 4u);
      EXPECT_EQ(state->tensors()[0].name, "a.bf16");  // sorted by name
      const WeightState::Tensor* master = state->Find("z.master");
      ASSERT_NE(master, nullptr);
      EXPECT_EQ(master->dtype, DType::kBF16);
      EXPECT_EQ(master->shape, (std::vector<uint64_t>{1000, 3}));
      for (uint64_t i = 0; i < 3000; ++i) {
        ASSERT_EQ(ElementBits(master->data.data(), 2, i),
                  testing_bf16::ReferenceFp32ToBf16(
                      static_cast<uint32_t>(ElementBits(current[0].data.data(), 4, i))));
      }
      EXPECT_EQ(state->Find("a.bf16")->data, current[1].data);
      EXPECT_EQ(state->Find("m.ids")->data, current[2].data);
      EXPECT_EQ(state->Find("f.half")->dtype, DType::kF16);
      // Nothing changed since: detection against itself finds nothing.
      auto changes = DetectChanges(*state, Views(current));
      ASSERT_TRUE(changes.ok());
      EXPECT_TRUE(changes->empty());
    }
  }
}

TEST(ToPublishedStateTest, RefusesNonFiniteUnlessAllowed) {
  std::mt19937_64 rng(13);
  std::vector<OwnedTensor> current = {RandomTensor(rng, "b", DType::kF32, {100}),
                                      RandomTensor(rng, "a", DType::kF16, {100})};
  SetElementBits(current[0].data.data(), 4, 64, 0x7FC00000);
  SetElementBits(current[1].data.data(), 2, 99, 0x7C00);
  for (uint64_t chunk : {uint64_t{8}, bf16::kDefaultChunkElements}) {
    auto state = bf16::ToPublishedStateChunked(Views(current), {.threads = 4}, chunk);
    ASSERT_FALSE(state.ok());
    // "a" sorts first, so it is the one reported.
    EXPECT_NE(state.status().message().find("tensor 'a': element 99 is +Inf"), std::string::npos)
        << state.status().message();
  }
  auto allowed = ToPublishedState(Views(current), {.allow_nonfinite = true});
  ASSERT_TRUE(allowed.ok());
  EXPECT_EQ(ElementBits(allowed->Find("b")->data.data(), 2, 64), 0x7FC0u);
  auto dup = ToPublishedState(Views({current[0], current[0]}));
  EXPECT_FALSE(dup.ok());
}

// Enough changes that the per-worker scratch grows past 2 MiB, where it
// switches from mremap to fresh huge-page-aligned mappings plus a copy.
TEST(DetectChangesTest, LargeOutputsSurviveScratchGrowth) {
  std::mt19937_64 rng(14);
  std::vector<OwnedTensor> tensors = {RandomTensor(rng, "big", DType::kBF16, {700001}),
                                      RandomTensor(rng, "f64", DType::kF64, {3})};
  const WeightState published = StateOf(tensors);
  for (OwnedTensor& t : tensors) Mutate(rng, t, 1.0);
  auto got = DetectChanges(published, Views(tensors), {.threads = 1});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectSameChanges(*got, ReferenceDetect(published, tensors));
}

TEST(ScratchBufferTest, GrowthKeepsContents) {
  bf16::ScratchBuffer buffer;
  size_t filled = 0;
  for (size_t size : {size_t{100}, size_t{70000}, size_t{3} << 20, size_t{9} << 20}) {
    ASSERT_TRUE(buffer.Reserve(size));
    for (size_t i = 0; i < filled; ++i) ASSERT_EQ(buffer.data()[i], static_cast<uint8_t>(i * 7));
    for (size_t i = filled; i < size; ++i) buffer.data()[i] = static_cast<uint8_t>(i * 7);
    filled = size;
  }
  EXPECT_TRUE(buffer.Reserve(10));  // shrinking requests keep what is there
  EXPECT_EQ(buffer.data()[(size_t{9} << 20) - 1],
            static_cast<uint8_t>(((size_t{9} << 20) - 1) * 7));
}

// ---- kernels and chunking: 64-bit index math without 2^32-element tensors

TEST(ChunksTest, SplitsWithSixtyFourBitCounts) {
  const std::vector<uint64_t> counts = {0, 5, uint64_t{1} << 40, 0, UINT64_MAX};
  const auto chunks = bf16::SplitIntoChunks(counts, uint64_t{1} << 63);
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[0].tensor, 1u);
  EXPECT_EQ(chunks[0].end, 5u);
  EXPECT_EQ(chunks[1].tensor, 2u);
  EXPECT_EQ(chunks[1].end, uint64_t{1} << 40);
  EXPECT_EQ(chunks[2].tensor, 4u);
  EXPECT_EQ(chunks[2].end, uint64_t{1} << 63);
  EXPECT_EQ(chunks[3].begin, uint64_t{1} << 63);
  EXPECT_EQ(chunks[3].end, UINT64_MAX);
  const auto small = bf16::SplitIntoChunks(std::vector<uint64_t>{10}, 4);
  ASSERT_EQ(small.size(), 3u);
  EXPECT_EQ(small[2].begin, 8u);
  EXPECT_EQ(small[2].end, 10u);
}

TEST(CompareKernelTest, IndicesAboveTwoToThe32) {
  const uint64_t base = (uint64_t{1} << 32) - 40;
  std::vector<uint16_t> pub(100, 0x3F80), cur = pub;
  for (size_t k : {0u, 39u, 40u, 41u, 99u}) cur[k] = 0x4000;
  ForEachTarget([&] {
    std::vector<uint64_t> idx(100 + kernels::kCompareOutputSlack);
    std::vector<uint16_t> val(100 + kernels::kCompareOutputSlack);
    size_t bad = 0;
    const size_t n =
        kernels::Compare16(pub.data(), cur.data(), 100, base, 0x7F80, idx.data(), val.data(), &bad);
    EXPECT_EQ(bad, 100u);
    ASSERT_EQ(n, 5u);
    EXPECT_EQ(idx[0], base);
    EXPECT_EQ(idx[1], (uint64_t{1} << 32) - 1);
    EXPECT_EQ(idx[2], uint64_t{1} << 32);
    EXPECT_EQ(idx[3], (uint64_t{1} << 32) + 1);
    EXPECT_EQ(idx[4], base + 99);
  });
}

// Every element width, every target, unaligned inputs, all tail lengths.
TEST(CompareKernelTest, AllWidthsMatchScalar) {
  std::mt19937_64 rng(31);
  std::vector<uint64_t> raw_pub(300), raw_cur(300);
  for (size_t i = 0; i < raw_pub.size(); ++i) {
    raw_pub[i] = rng();
    raw_cur[i] = rng() % 3 == 0 ? rng() : raw_pub[i];
  }
  auto check = [&](auto zero, auto compare) {
    using T = decltype(zero);
    // Byte offset 1: misaligned for every width > 1.
    const auto* pub = reinterpret_cast<const uint8_t*>(raw_pub.data()) + 1;
    const auto* cur = reinterpret_cast<const uint8_t*>(raw_cur.data()) + 1;
    for (size_t n = 0; n <= 130; ++n) {
      std::vector<uint64_t> idx(n + kernels::kCompareOutputSlack);
      std::vector<T> val(n + kernels::kCompareOutputSlack);
      const size_t got = compare(reinterpret_cast<const T*>(pub), reinterpret_cast<const T*>(cur),
                                 n, idx.data(), val.data());
      size_t want = 0;
      for (size_t k = 0; k < n; ++k) {
        T p, c;
        std::memcpy(&p, pub + k * sizeof(T), sizeof(T));
        std::memcpy(&c, cur + k * sizeof(T), sizeof(T));
        if (p == c) continue;
        ASSERT_LT(want, got);
        EXPECT_EQ(idx[want], 1000 + k);
        EXPECT_EQ(val[want], c);
        ++want;
      }
      ASSERT_EQ(got, want) << "n=" << n;
    }
  };
  ForEachTarget([&] {
    size_t bad;
    check(uint8_t{}, [](const uint8_t* p, const uint8_t* c, size_t n, uint64_t* i, uint8_t* v) {
      return kernels::Compare8(p, c, n, 1000, i, v);
    });
    check(uint16_t{},
          [&](const uint16_t* p, const uint16_t* c, size_t n, uint64_t* i, uint16_t* v) {
            return kernels::Compare16(p, c, n, 1000, 0, i, v, &bad);
          });
    check(uint32_t{},
          [&](const uint32_t* p, const uint32_t* c, size_t n, uint64_t* i, uint32_t* v) {
            return kernels::Compare32(p, c, n, 1000, 0, i, v, &bad);
          });
    check(uint64_t{},
          [&](const uint64_t* p, const uint64_t* c, size_t n, uint64_t* i, uint64_t* v) {
            return kernels::Compare64(p, c, n, 1000, 0, i, v, &bad);
          });
  });
}

// The fp32 compare rounds 16 or 32 elements a step on some targets (u16
// lanes on AVX2): every rounding edge against the reference, on every
// target, NaN/Inf passed through (no check). The low halves hit the tie
// (0x8000) and its neighbours with odd and even high halves, the largest
// finite values round up to Inf, and NaN, Inf and ordinary lanes share a
// step (which then goes the exact way) or not.
TEST(CompareKernelTest, Fp32RoundingEdgesMatchTheReference) {
  std::mt19937_64 rng(77);
  const uint32_t lows[] = {0, 1, 0x7FFE, 0x7FFF, 0x8000, 0x8001, 0xFFFE, 0xFFFF};
  const uint32_t highs[] = {0x0000, 0x0001, 0x3F80, 0x3F81, 0x7F7E, 0x7F7F, 0x7F80, 0x7F81, 0x7FBF,
                            0x7FC0, 0x7FFF, 0x8000, 0x8001, 0xBF80, 0xFF7F, 0xFF80, 0xFFC1, 0xFFFF};
  const size_t n = 4 * 1024 + 37;
  for (int round = 0; round < 4; ++round) {
    std::vector<uint32_t> cur(n);
    std::vector<uint16_t> pub(n);
    for (size_t i = 0; i < n; ++i) {
      uint32_t hi;
      if (round == 0) {
        hi = highs[rng() % std::size(highs)];  // specials in most steps
      } else {
        // Specials in one step of 64 at most: most steps take the fast way.
        hi = (i / 64) % 7 == 3 && i % 64 == 5 ? highs[rng() % std::size(highs)] : static_cast<uint32_t>(rng()) & 0xFFFF;
        if ((hi & 0x7F80) == 0x7F80 && !((i / 64) % 7 == 3)) hi ^= 0x0100;
      }
      const uint32_t lo = rng() % 2 ? lows[rng() % std::size(lows)] : static_cast<uint32_t>(rng()) & 0xFFFF;
      cur[i] = hi << 16 | lo;
      const uint16_t want = testing_bf16::ReferenceFp32ToBf16(cur[i]);
      pub[i] = rng() % 3 == 0 ? static_cast<uint16_t>(rng()) : want;  // changed or not
    }
    ForEachTarget([&] {
      std::vector<uint64_t> idx(n + kernels::kCompareOutputSlack);
      std::vector<uint16_t> val(n + kernels::kCompareOutputSlack);
      size_t bad = 0;
      const size_t got = kernels::CompareF32ToBf16(pub.data(), cur.data(), n, 0, false, idx.data(), val.data(), &bad);
      size_t k = 0;
      for (size_t i = 0; i < n; ++i) {
        const uint16_t want = testing_bf16::ReferenceFp32ToBf16(cur[i]);
        if (want == pub[i]) continue;
        ASSERT_LT(k, got);
        ASSERT_EQ(idx[k], i);
        ASSERT_EQ(val[k], want) << "element " << i << std::hex << " fp32 0x" << cur[i];
        ++k;
      }
      EXPECT_EQ(got, k);
    });
  }
}

// The emit writes a fixed number of unconditional slots a word, then
// takes an exact loop for a word's further changes (and an exact loop for
// a partial last word): blocks of every density, sparse blocks holding a
// few dense words, words of exactly three, four, five, eight, nine and
// forty changes, an empty block and a partial last block, on every target,
// in bf16 and fp32 (rounded) against the elements that differ.
TEST(CompareKernelTest, SparseAndDenseWordsMatchScalar) {
  std::mt19937_64 rng(5);
  constexpr size_t kBlock = 1024, kWord = 64;
  // Changes per word, word by word, for each block; the last block is partial.
  auto words_of = [&](size_t block) -> std::vector<size_t> {
    std::vector<size_t> w(16, 0);
    switch (block) {
      case 0: for (size_t k = 0; k < 16; ++k) w[k] = 2; w[3] = 9; w[7] = 5; break;    // sparse, two dense words
      case 1: for (size_t k = 0; k < 16; ++k) w[k] = 4; break;                      // dense: 64 a block
      case 2: for (size_t k = 0; k < 16; ++k) w[k] = 3; break;                      // threes
      case 3: break;                                                               // nothing
      case 4: w[5] = 40; break;                                                    // one dense word, sparse block
      case 5: for (size_t k = 0; k < 12; ++k) w[k] = 4; break;                      // fours, sparse block
      case 6: for (size_t k = 0; k < 16; ++k) w[k] = k % 2 ? 8 : 1; break;           // eights and ones, dense
      case 7: for (size_t k = 0; k < 16; ++k) w[k] = rng() % 64; break;              // random, dense
      default: w.resize(2); w[0] = 5; w[1] = 1; break;                             // partial (100 elements), sparse
    }
    return w;
  };
  const size_t n = 8 * kBlock + 100;
  std::vector<uint16_t> pub(n), cur(n);
  std::vector<uint32_t> cur32(n);
  for (size_t i = 0; i < n; ++i) pub[i] = cur[i] = static_cast<uint16_t>(0x3C00 | (rng() & 0x3FF));
  for (size_t b = 0; b * kBlock < n; ++b) {
    const std::vector<size_t> w = words_of(b);
    for (size_t k = 0; k < w.size(); ++k) {
      const size_t first = b * kBlock + k * kWord, len = std::min(kWord, n - first);
      std::vector<size_t> at(len);
      for (size_t j = 0; j < len; ++j) at[j] = j;
      std::shuffle(at.begin(), at.end(), rng);
      for (size_t j = 0; j < std::min(w[k], len); ++j) cur[first + at[j]] ^= 1 + (rng() & 0x7E);
    }
  }
  // fp32 masters that round to cur (low halves below the tie).
  for (size_t i = 0; i < n; ++i) cur32[i] = uint32_t{cur[i]} << 16 | static_cast<uint32_t>(rng() & 0x7FFF);
  std::vector<uint64_t> want_idx;
  for (size_t i = 0; i < n; ++i) {
    if (cur[i] != pub[i]) want_idx.push_back(7 + i);
  }
  ForEachTarget([&] {
    for (bool f32 : {false, true}) {
      std::vector<uint64_t> idx(n + kernels::kCompareOutputSlack);
      std::vector<uint16_t> val(n + kernels::kCompareOutputSlack);
      size_t bad = 0;
      const size_t got =
          f32 ? kernels::CompareF32ToBf16(pub.data(), cur32.data(), n, 7, true, idx.data(), val.data(), &bad)
              : kernels::Compare16(pub.data(), cur.data(), n, 7, 0x7F80, idx.data(), val.data(), &bad);
      EXPECT_EQ(bad, n);
      ASSERT_EQ(got, want_idx.size()) << (f32 ? "fp32" : "bf16");
      for (size_t k = 0; k < got; ++k) {
        ASSERT_EQ(idx[k], want_idx[k]) << (f32 ? "fp32" : "bf16") << " change " << k;
        ASSERT_EQ(val[k], cur[idx[k] - 7]) << (f32 ? "fp32" : "bf16") << " change " << k;
      }
    }
  });
}

TEST(CompareKernelTest, FindsFirstNonFiniteAtEveryOffset) {
  ForEachTarget([] {
    for (size_t n : {1u, 31u, 64u, 70u}) {
      for (size_t at = 0; at < n; ++at) {
        std::vector<uint16_t> pub(n, 0x3F80), cur(n, 0x3F80);
        std::vector<uint64_t> idx(n + kernels::kCompareOutputSlack);
        std::vector<uint16_t> val(n + kernels::kCompareOutputSlack);
        cur[at] = 0xFF80;
        if (at + 1 < n) cur[n - 1] = 0x7FC0;
        size_t bad = 0;
        kernels::Compare16(pub.data(), cur.data(), n, 0, 0x7F80, idx.data(), val.data(), &bad);
        ASSERT_EQ(bad, at) << "n=" << n;
        std::vector<uint32_t> cur32(n, 0x3F800000);
        cur32[at] = 0x7F800001;
        kernels::CompareF32ToBf16(pub.data(), cur32.data(), n, 0, true, idx.data(), val.data(),
                                  &bad);
        ASSERT_EQ(bad, at) << "n=" << n;
      }
    }
  });
}

// CompareF32ToBf16Gaps (the gap_delta detect's kernel) against the rounding
// reference, on every target (AVX3 runs the raw AVX-512 kernel and
// AVX3-no-raw the Highway one): lengths around its 32-element steps up to
// the largest call, unaligned inputs, rounding edges and NaN/denormal steps,
// dense, sparse and empty stretches (so the last change must outlast steps
// and blocks without one), every element changed, one change in the last
// element (the widest gap), nothing written past n + kCompareGapsSlack, and
// the first element that rounds to Inf or NaN when checking.
TEST(CompareKernelTest, GapsMatchTheReference) {
  std::mt19937_64 rng(43);
  const uint32_t highs[] = {0x0000, 0x0001, 0x3F80, 0x7F7F, 0x7F80, 0x7F81, 0x7FC0, 0x8000, 0x8001, 0xFF80, 0xFFC1};
  constexpr uint16_t kGuard = 0xA5A5;
  const size_t slack = kernels::kCompareGapsSlack;
  for (const size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{1000}, size_t{4133},
                         kernels::kCompareGapsMaxElements}) {
    for (int pattern = 0; pattern < 5; ++pattern) {
      SCOPED_TRACE("n " + std::to_string(n) + ", pattern " + std::to_string(pattern));
      // One element more than n: the kernel reads from element 1 (unaligned).
      std::vector<uint32_t> cur(n + 1);
      std::vector<uint16_t> pub(n + 1);
      for (size_t i = 0; i <= n; ++i) {
        const bool special = pattern == 0 ? rng() % 4 == 0 : (i / 32) % 9 == 4 && i % 32 == 7;
        const uint32_t hi = special ? highs[rng() % std::size(highs)] : 0x3C00 | static_cast<uint32_t>(rng() & 0x3FF);
        cur[i] = hi << 16 | static_cast<uint32_t>(rng() & 0xFFFF);
        const uint16_t want = testing_bf16::ReferenceFp32ToBf16(cur[i]);
        // 0: a third changed; 1: ~3% changed; 2: changes only in the first
        // 40 elements and in one step in the middle, none after it; 3: all
        // changed (every lane of every vector); 4: only the last element
        // (its gap n - 1, up to 65,535: the 16-bit edge).
        const size_t j = i - 1;
        const bool change = pattern == 0   ? rng() % 3 == 0
                            : pattern == 1 ? rng() % 32 == 0
                            : pattern == 2 ? j < 40 || (j >= n / 2 && j < n / 2 + 5)
                            : pattern == 3 ? true
                                           : j == n - 1;
        pub[i] = change ? static_cast<uint16_t>(want ^ (1 + (rng() & 0xFF))) : want;
      }
      ForEachTarget([&] {
        std::vector<uint16_t> gaps(n + slack + 16, kGuard), vals(n + slack + 16, kGuard);
        size_t last = 0, bad = 0;
        const size_t got = kernels::CompareF32ToBf16Gaps(pub.data() + 1, cur.data() + 1, n, false, gaps.data(),
                                                         vals.data(), &last, &bad);
        EXPECT_EQ(bad, n);
        size_t k = 0;
        uint64_t prev = ~uint64_t{0};
        for (size_t i = 0; i < n; ++i) {
          const uint16_t want = testing_bf16::ReferenceFp32ToBf16(cur[i + 1]);
          if (want == pub[i + 1]) continue;
          ASSERT_LT(k, got);
          ASSERT_EQ(gaps[k], i - prev - 1) << "change " << k << " at " << i;
          ASSERT_EQ(vals[k], want) << "element " << i << std::hex << " fp32 0x" << cur[i + 1];
          prev = i;
          ++k;
        }
        ASSERT_EQ(got, k);
        if (k > 0) EXPECT_EQ(last, prev);
        for (size_t i = n + slack; i < gaps.size(); ++i) {
          ASSERT_EQ(gaps[i], kGuard) << "gap slot " << i;
          ASSERT_EQ(vals[i], kGuard) << "value slot " << i;
        }
      });
    }
  }
  // Checking: the first element that rounds to Inf or NaN, after changes
  // and in any lane of a step; an fp32 that only rounds to Inf counts.
  ForEachTarget([&] {
    const size_t n = 4133;
    for (const size_t at : {size_t{0}, size_t{31}, size_t{32}, size_t{1000}, size_t{4132}}) {
      for (const uint32_t bad_bits : {0x7FC00000u, 0xFF800000u, 0x7F7FFFFFu}) {
        std::vector<uint32_t> cur(n, 0x3F800000);
        std::vector<uint16_t> pub(n, 0x3F80);
        pub[0] = pub[at / 2] = 0x4000;  // changes before it
        cur[at] = bad_bits;
        cur[std::min(n - 1, at + 3)] = 0x7FC00000;  // a later one does not count
        std::vector<uint16_t> gaps(n + slack), vals(n + slack);
        size_t last = 0, bad = 0;
        kernels::CompareF32ToBf16Gaps(pub.data(), cur.data(), n, true, gaps.data(), vals.data(), &last, &bad);
        EXPECT_EQ(bad, at) << std::hex << bad_bits;
      }
    }
  });
}

}  // namespace
}  // namespace deltasync

namespace deltasync {
namespace {

// DetectAndApply (bf16/detect_apply.h) equals DetectChanges then an apply:
// the same changes, the state afterwards, HashChanges of the state before,
// and the old values; at every chunk size (borders inside blocks and
// tensors), thread count and change rate, with `out` and `old` reused; an
// error midway (a NaN in a later tensor, after other chunks applied) leaves
// the state as it was.
TEST(DetectAndApplyTest, EqualsDetectThenApplyAndUndoesOnError) {
  std::mt19937_64 rng(41);
  std::vector<OwnedTensor> base = MixedTensors(rng);
  // A bf16 state followed by fp32 masters (the trainer's case: rounded).
  // Over one 64 Ki block of the scan, so that a chunk can fail after its
  // first block applied.
  constexpr uint64_t kMasters = 70'000;
  base.push_back(RandomTensor(rng, "layers.1.masters", DType::kBF16, {kMasters}));
  std::vector<OwnedTensor> current_base = base;
  {
    OwnedTensor& m = current_base.back();
    m.dtype = DType::kF32;
    m.data.resize(4 * kMasters);
    for (uint64_t i = 0; i < kMasters; ++i) {
      const uint64_t bf = ElementBits(base.back().data.data(), 2, i);
      SetElementBits(m.data.data(), 4, i, bf << 16);  // exactly the bf16 value
    }
  }
  std::vector<TensorChanges> out;
  std::vector<std::vector<uint8_t>> old;
  for (uint64_t chunk : {uint64_t{1}, uint64_t{100}, bf16::kDefaultChunkElements}) {
    for (int threads : {1, 3}) {
      for (double rate : {0.01, 0.5, 0.0, 1.0, 0.05}) {
        SCOPED_TRACE("chunk " + std::to_string(chunk) + " threads " + std::to_string(threads) + " rate " +
                     std::to_string(rate));
        std::vector<OwnedTensor> current = current_base;
        for (size_t i = 0; i + 1 < current.size(); ++i) Mutate(rng, current[i], rate);
        // Masters moved by up to a few fp32 ULPs: some round to another bf16.
        std::bernoulli_distribution pick(rate);
        for (uint64_t i = 0; i < kMasters; ++i) {
          const uint64_t bits = ElementBits(current.back().data.data(), 4, i);
          // Not near the largest exponent, where a step could round to Inf.
          if (pick(rng) && ((bits >> 23) & 0xFF) < 0xFD) {
            SetElementBits(current.back().data.data(), 4, i, bits + (rng() % 3 == 0 ? 0x8000 : 0x7FFF));
          }
        }
        WeightState state = StateOf(base);
        const StateHash before = HashState(state);
        const std::vector<TensorChanges> want = ReferenceDetect(state, current);
        const StateHash want_delta = HashChanges(state, want);
        StateHash delta;
        const Status s =
            bf16::DetectAndApply(state, Views(current), {.threads = threads}, chunk, out, old, &delta);
        ASSERT_TRUE(s.ok()) << s.ToString();
        ExpectSameChanges(out, want);
        EXPECT_EQ(delta, want_delta);
        EXPECT_EQ(HashState(state), before + delta);
        WeightState applied = StateOf(base);
        ApplyChanges(applied, want);
        for (size_t t = 0; t < state.tensors().size(); ++t) {
          EXPECT_EQ(state.tensors()[t].data, applied.tensors()[t].data) << state.tensors()[t].name;
        }
        ASSERT_EQ(old.size(), out.size());
        const WeightState original = StateOf(base);
        for (size_t k = 0; k < out.size(); ++k) {
          const WeightState::Tensor* t = original.Find(out[k].name);
          const size_t size = DTypeSize(t->dtype);
          ASSERT_EQ(old[k].size(), out[k].count() * size) << out[k].name;
          for (size_t j = 0; j < out[k].count(); ++j) {
            ASSERT_EQ(ElementBits(old[k].data(), size, j), ElementBits(t->data.data(), size, out[k].indices[j]))
                << out[k].name << " change " << j;
          }
        }
      }
      // A NaN in the last tensor: every chunk before it applied its changes
      // and must have put them back.
      std::vector<OwnedTensor> bad = current_base;
      for (size_t i = 0; i + 1 < bad.size(); ++i) Mutate(rng, bad[i], 0.3);
      for (uint64_t i = 0; i < kMasters; i += 7) {  // changes in the block before the NaN
        SetElementBits(bad.back().data.data(), 4, i, ElementBits(bad.back().data.data(), 4, i) ^ 0x10000);
      }
      SetElementBits(bad.back().data.data(), 4, kMasters - 2, 0x7FC00001);
      WeightState state = StateOf(base);
      StateHash delta{1, 2};
      const Status s = bf16::DetectAndApply(state, Views(bad), {.threads = threads}, chunk, out, old, &delta);
      ASSERT_FALSE(s.ok());
      EXPECT_EQ(s.ToString(), DetectChanges(StateOf(base), Views(bad)).status().ToString());
      EXPECT_TRUE(out.empty());
      EXPECT_TRUE(old.empty());
      EXPECT_EQ(delta, StateHash{});
      const WeightState original = StateOf(base);
      for (size_t t = 0; t < state.tensors().size(); ++t) {
        EXPECT_EQ(state.tensors()[t].data, original.tensors()[t].data) << state.tensors()[t].name;
      }
    }
  }
}

}  // namespace
}  // namespace deltasync
