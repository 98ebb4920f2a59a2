// ValidateChanges / ApplyChanges against a scalar reference.
#include <gtest/gtest.h>

#include "codec/patch_test_util.h"

namespace deltasync {
namespace {

using testing::Bytes;
using testing::RandomBytesModel;
using testing::Snapshot;
using testing::MakeChanges;

// The obvious element-by-element scatter.
void ReferenceApply(std::vector<std::vector<uint8_t>>& data, const WeightState& layout,
                    const std::vector<TensorChanges>& changes) {
  for (const TensorChanges& c : changes) {
    size_t t = 0;
    while (layout.tensors()[t].name != c.name) ++t;
    const size_t size = DTypeSize(c.dtype);
    for (size_t k = 0; k < c.count(); ++k) {
      for (size_t b = 0; b < size; ++b) data[t][c.indices[k] * size + b] = c.values[k * size + b];
    }
  }
}

TensorChanges RandomChanges(std::mt19937_64& rng, const std::string& name, DType dtype, uint64_t n, size_t count) {
  TensorChanges c;
  c.name = name;
  c.dtype = dtype;
  c.indices = testing::RandomIndices(rng, n, count);
  c.values.resize(c.indices.size() * DTypeSize(dtype));
  for (uint8_t& b : c.values) b = static_cast<uint8_t>(rng());
  return c;
}

// Tensors of every element width; the bf16 one large enough that its
// changes span many chunks and threads split it.
RandomBytesModel EveryWidth(std::mt19937_64& rng) {
  RandomBytesModel f;
  f.Add("big.bf16", DType::kBF16, 3'000'000, rng);
  f.Add("u8", DType::kU8, 1000, rng);
  f.Add("f32", DType::kF32, 50'000, rng);
  f.Add("f64", DType::kF64, 70'000, rng);
  return f;
}

TEST(ApplyChangesTest, MatchesScalarReference) {
  std::mt19937_64 rng(3);
  RandomBytesModel f = EveryWidth(rng);
  f.Add("untouched", DType::kBF16, 100, rng);
  WeightState state = f.State();
  std::vector<TensorChanges> changes = {
      RandomChanges(rng, "big.bf16", DType::kBF16, 3'000'000, 300'000),
      RandomChanges(rng, "u8", DType::kU8, 1000, 999),
      RandomChanges(rng, "f32", DType::kF32, 50'000, 2'000),
      RandomChanges(rng, "f64", DType::kF64, 70'000, 70'000),
  };
  changes.push_back(MakeChanges("untouched", {}));
  for (int threads : {1, 4, 0}) {
    WeightState s = f.State();
    std::vector<std::vector<uint8_t>> want = Snapshot(s);
    ReferenceApply(want, s, changes);
    ASSERT_TRUE(ValidateChanges(s, changes).ok());
    ApplyChanges(s, changes, threads);
    EXPECT_EQ(Snapshot(s), want) << "threads=" << threads;
  }
}

// ApplyChangesWithUndo equals ApplyChanges, returns HashChanges of the state
// before, keeps exactly the overwritten bytes, and UndoChanges restores the
// state; `old` reused across calls of other sizes and tensor counts.
TEST(ApplyChangesTest, WithUndoEqualsApplyHashAndOldValues) {
  std::mt19937_64 rng(7);
  RandomBytesModel f = EveryWidth(rng);
  f.Add("small.f16", DType::kF16, 300, rng);
  std::vector<std::vector<uint8_t>> old;  // reused by every call below
  for (int round = 0; round < 3; ++round) {
    const size_t big = round == 1 ? 20'000 : 400'000;  // shrink, then grow again
    std::vector<TensorChanges> changes = {RandomChanges(rng, "big.bf16", DType::kBF16, 3'000'000, big),
                                          RandomChanges(rng, "f32", DType::kF32, 50'000, 2'000),
                                          RandomChanges(rng, "small.f16", DType::kF16, 300, 299)};
    if (round != 1) {
      changes.push_back(RandomChanges(rng, "u8", DType::kU8, 1000, 999));
      changes.push_back(RandomChanges(rng, "f64", DType::kF64, 70'000, 70'000));
    } else {
      changes.push_back(MakeChanges("u8", {}));  // an entry without changes
      changes.back().dtype = DType::kU8;
    }
    for (int threads : {1, 3}) {
      WeightState s = f.State();
      const std::vector<std::vector<uint8_t>> before = Snapshot(s);
      const StateHash hash_before = HashState(s);
      const StateHash want_delta = HashChanges(s, changes);
      WeightState direct = f.State();
      ApplyChanges(direct, changes);
      ASSERT_TRUE(ValidateChanges(s, changes).ok());
      const StateHash delta = ApplyChangesWithUndo(s, changes, threads, old);
      EXPECT_EQ(Snapshot(s), Snapshot(direct)) << "round " << round << " threads " << threads;
      EXPECT_EQ(delta, want_delta);
      EXPECT_EQ(hash_before + delta, HashState(s));
      ASSERT_EQ(old.size(), changes.size());
      for (size_t i = 0; i < changes.size(); ++i) {
        const TensorChanges& c = changes[i];
        const size_t size = DTypeSize(c.dtype);
        size_t t = 0;
        while (s.tensors()[t].name != c.name) ++t;
        ASSERT_EQ(old[i].size(), c.count() * size) << c.name;
        for (size_t k = 0; k < c.count(); ++k) {
          ASSERT_EQ(std::memcmp(old[i].data() + k * size, before[t].data() + c.indices[k] * size, size), 0)
              << c.name << " change " << k;
        }
      }
      UndoChanges(s, changes, old, threads);
      EXPECT_EQ(Snapshot(s), before);
    }
  }
}

TEST(ApplyChangesTest, EncodeDecodeApplyEqualsDirectApply) {
  std::mt19937_64 rng(11);
  RandomBytesModel f;
  f.Add("a", DType::kBF16, 400'000, rng);
  f.Add("b", DType::kBF16, 1'000, rng);
  WeightState base = f.State();
  std::vector<TensorChanges> changes = {RandomChanges(rng, "a", DType::kBF16, 400'000, 13'600),
                                        RandomChanges(rng, "b", DType::kBF16, 1'000, 34)};
  PatchInfo info;
  info.model_version = 2;
  info.total_elements = base.total_elements();
  for (IndexEncoding e : {IndexEncoding::kRaw, IndexEncoding::kGapDelta}) {
    info.encoding = e;
    Result<EncodedPatch> patch = EncodeDelta(info, changes);
    ASSERT_TRUE(patch.ok());
    Result<DecodedPatch> decoded = testing::Decode(testing::Flatten(*patch));
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    WeightState via_patch = f.State();
    WeightState direct = f.State();
    ASSERT_TRUE(ValidateChanges(via_patch, decoded->changes).ok());
    ApplyChanges(via_patch, decoded->changes);
    ApplyChanges(direct, changes);
    EXPECT_EQ(Snapshot(via_patch), Snapshot(direct));
  }
}

TEST(ValidateChangesTest, RefusesWithoutTouchingTheState) {
  std::mt19937_64 rng(5);
  RandomBytesModel f;
  f.Add("w", DType::kBF16, 10, rng);
  f.Add("n", DType::kF32, 4, rng);
  WeightState state = f.State();
  const auto before = Snapshot(state);
  auto expect = [&](std::vector<TensorChanges> changes, std::string_view needle) {
    Status s = ValidateChanges(state, changes);
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_EQ(s.code(), ErrorCode::kCorruption);
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    EXPECT_EQ(Snapshot(state), before);
  };
  expect({MakeChanges("w", {0, 10})}, "tensor 'w': index 10 is out of range (the tensor has 10 elements)");
  expect({MakeChanges("ghost", {0})}, "tensor 'ghost': changed by the delta but absent from the state");
  expect({MakeChanges("n", {0})}, "tensor 'n': the delta carries BF16 values but the state holds F32");
  expect({MakeChanges("w", {1}), MakeChanges("w", {2})}, "tensor 'w': changed twice by the delta");
  TensorChanges short_values = MakeChanges("w", {1, 2});
  short_values.values.resize(3);
  expect({short_values}, "tensor 'w': 3 value bytes for 2 indices of BF16");
  // The first valid change does not make a later invalid one pass.
  expect({MakeChanges("w", {9}), MakeChanges("ghost", {0})}, "'ghost'");
  EXPECT_TRUE(ValidateChanges(state, std::vector<TensorChanges>{MakeChanges("w", {0, 9})}).ok());
  EXPECT_TRUE(ValidateChanges(state, {}).ok());
}

}  // namespace
}  // namespace deltasync
