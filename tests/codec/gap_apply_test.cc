// Applying gap_delta deltas from their encoded bytes (ApplyGapChanges)
// against the decoded path (DecodePatch, ValidateChanges, HashChanges,
// ApplyChanges): the same state, hash change and errors, on every thread
// count; and UndoGapChanges puts every overwritten value back.
#include <gtest/gtest.h>

#include <limits>

#include "bf16/bf16_test_util.h"
#include "codec/patch_test_util.h"
#include "deltasync/state_hash.h"

namespace deltasync {
namespace {

using testing::Bytes;
using testing::RandomBytesModel;
using testing::Snapshot;
using testing::Crafted;
using testing::DeltaMetadata;

constexpr size_t kChunk = EncodedChanges::kGapChunk;

TensorChanges Changes(std::string name, DType dtype, std::vector<uint64_t> indices, std::mt19937_64& rng) {
  TensorChanges c;
  c.name = std::move(name);
  c.dtype = dtype;
  c.indices = std::move(indices);
  c.values.resize(c.indices.size() * DTypeSize(dtype));
  for (uint8_t& b : c.values) b = static_cast<uint8_t>(rng());
  return c;
}

std::vector<uint64_t> Every(uint64_t step, uint64_t first, uint64_t n) {
  std::vector<uint64_t> out;
  for (uint64_t i = first; i < n; i += step) out.push_back(i);
  return out;
}

// Decodes `bytes` both ways.
struct BothWays {
  DecodedPatch decoded, encoded;
};

BothWays DecodeBoth(const std::vector<uint8_t>& bytes) {
  Result<DecodedPatch> decoded = testing::Decode(bytes);
  EXPECT_TRUE(decoded.ok()) << decoded.status().ToString();
  Result<SafetensorsFile> file = testing::ParseBytes(bytes);
  EXPECT_TRUE(file.ok());
  Result<DecodedPatch> encoded = DecodePatch(std::move(*file), {.keep_gaps_encoded = true});
  EXPECT_TRUE(encoded.ok()) << encoded.status().ToString();
  return {std::move(decoded).value(), std::move(encoded).value()};
}

// The streamed apply equals the decoded one: state, hash change, decoded
// changes; and the undo restores the state.
void ExpectSameAsDecoded(RandomBytesModel& model, const BothWays& both) {
  ASSERT_TRUE(both.decoded.encoded.empty());
  ASSERT_EQ(both.encoded.encoded.size(), both.decoded.changes.size());
  ASSERT_TRUE(both.encoded.changes.empty());
  EXPECT_EQ(both.encoded.info.total_changed_elements, both.decoded.info.total_changed_elements);
  const std::vector<TensorChanges> redecoded = DecodeGapChanges(both.encoded.encoded);
  ASSERT_EQ(redecoded.size(), both.decoded.changes.size());
  for (size_t i = 0; i < redecoded.size(); ++i) {
    EXPECT_EQ(redecoded[i].name, both.decoded.changes[i].name);
    EXPECT_EQ(redecoded[i].indices, both.decoded.changes[i].indices);
    EXPECT_EQ(redecoded[i].values, both.decoded.changes[i].values);
  }
  WeightState want = model.State();
  ASSERT_TRUE(ValidateChanges(want, both.decoded.changes).ok());
  const StateHash want_hash = HashChanges(want, both.decoded.changes, 1);
  const auto before = Snapshot(want);
  ApplyChanges(want, both.decoded.changes, 1);
  std::vector<uint8_t> undo;
  // Every SIMD target of the hash terms (the bf16 ones read the patch's
  // values and the undo log as they lie).
  testing_bf16::ForEachTarget([&] {
    for (int threads : {1, 2, 3, 8, 0}) {
      WeightState got = model.State();
      ASSERT_TRUE(ValidateEncodedChanges(got, both.encoded.encoded).ok());
      EXPECT_EQ(ApplyGapChanges(got, both.encoded.encoded, threads, undo), want_hash) << "threads=" << threads;
      EXPECT_EQ(Snapshot(got), Snapshot(want)) << "threads=" << threads;
      UndoGapChanges(got, both.encoded.encoded, threads, undo);
      EXPECT_EQ(Snapshot(got), before) << "threads=" << threads;
    }
  });
}

TEST(GapApplyTest, EqualsTheDecodedPathOnEveryThreadCount) {
  std::mt19937_64 rng(15);
  RandomBytesModel model;
  const uint64_t big = 3 * kChunk * 4 + 123;
  model.Add("big", DType::kBF16, big, rng);                 // many chunks of one tensor
  model.Add("exact", DType::kBF16, 2 * kChunk, rng);        // every element: chunk borders in one run
  model.Add("small", DType::kBF16, 1000, rng);              // less than a chunk
  model.Add("tiny", DType::kBF16, 40, rng);                 // fewer changes than the prefetch runs ahead
  model.Add("blocks", DType::kBF16, 5000, rng);             // a few 512-change blocks, the last partial
  model.Add("sparse", DType::kBF16, 10'000'000, rng);       // U32 gaps
  model.Add("u8", DType::kU8, 5000, rng);
  model.Add("f32", DType::kF32, 3 * kChunk + 5, rng);
  model.Add("f64", DType::kF64, 70'000, rng);
  model.Add("untouched", DType::kBF16, 100, rng);
  WeightState base = model.State();
  std::vector<TensorChanges> changes = {
      Changes("big", DType::kBF16, testing::RandomIndices(rng, big, big / 4), rng),
      Changes("blocks", DType::kBF16, Every(3, 1, 5000), rng),
      Changes("exact", DType::kBF16, Every(1, 0, 2 * kChunk), rng),
      Changes("f32", DType::kF32, Every(1, 0, 3 * kChunk + 5), rng),
      Changes("f64", DType::kF64, Every(3, 2, 70'000), rng),
      Changes("small", DType::kBF16, {0, 1, 2, 999}, rng),
      Changes("sparse", DType::kBF16, {5, 100'000, 9'999'999}, rng),
      Changes("tiny", DType::kBF16, {3, 4, 39}, rng),
      Changes("u8", DType::kU8, testing::RandomIndices(rng, 5000, 4000), rng),
  };
  PatchInfo info;
  info.model_version = 5;
  info.total_elements = base.total_elements();
  info.encoding = IndexEncoding::kGapDelta;
  Result<EncodedPatch> patch = EncodeDelta(info, changes);
  ASSERT_TRUE(patch.ok()) << patch.status().ToString();
  BothWays both = DecodeBoth(testing::Flatten(*patch));
  ExpectSameAsDecoded(model, both);
  for (const EncodedChanges& c : both.encoded.encoded) {
    EXPECT_EQ(c.index_dtype, c.name == "sparse" ? DType::kU32 : DType::kU16) << c.name;
  }
}

// U64 gaps (the wide path: chunk starts checked element by element) over
// several chunks, and a delta with no changes at all.
TEST(GapApplyTest, WideGapsAndEmptyDeltas) {
  std::mt19937_64 rng(16);
  RandomBytesModel model;
  const uint64_t n = 2 * kChunk + 77;
  model.Add("w", DType::kBF16, n, rng);
  std::vector<uint64_t> gaps(n - 10, 0);
  gaps[0] = 3;
  gaps[kChunk] = 5;
  gaps.back() = 2;  // last index = 3 + (n - 11) + 5 + 2 = n - 1
  Crafted c;
  c.Add("w.idx", DType::kU64, {gaps.size()}, Bytes<uint64_t>(gaps));
  std::vector<uint8_t> values(gaps.size() * 2);
  for (uint8_t& b : values) b = static_cast<uint8_t>(rng());
  c.Add("w.val", DType::kBF16, {gaps.size()}, values);
  BothWays both = DecodeBoth(c.Serialize(DeltaMetadata()));
  ASSERT_EQ(both.encoded.encoded.size(), 1u);
  EXPECT_EQ(both.encoded.encoded[0].last, n - 1);
  EXPECT_EQ(both.encoded.encoded[0].chunk_starts.size(), 3u);
  ExpectSameAsDecoded(model, both);

  PatchInfo info;
  info.model_version = 5;
  info.total_elements = n;
  Result<EncodedPatch> empty = EncodeDelta(info, {});
  ASSERT_TRUE(empty.ok());
  BothWays none = DecodeBoth(testing::Flatten(*empty));
  WeightState s = model.State();
  std::vector<uint8_t> undo;
  EXPECT_EQ(ApplyGapChanges(s, none.encoded.encoded, 2, undo), StateHash{});
  EXPECT_EQ(Snapshot(s), Snapshot(model.State()));
}

// Every corrupt input fails the same way whether the gaps stay encoded or not.
TEST(GapApplyTest, CorruptInputFailsAsTheDecodedPathDoes) {
  auto expect_same = [](const std::vector<uint8_t>& bytes, std::string_view needle) {
    Result<DecodedPatch> decoded = testing::Decode(bytes);
    Result<SafetensorsFile> file = testing::ParseBytes(bytes);
    ASSERT_TRUE(file.ok());
    Result<DecodedPatch> encoded = DecodePatch(std::move(*file), {.keep_gaps_encoded = true});
    ASSERT_FALSE(decoded.ok()) << needle;
    ASSERT_FALSE(encoded.ok()) << needle;
    EXPECT_EQ(encoded.status().code(), decoded.status().code());
    EXPECT_EQ(encoded.status().message(), decoded.status().message());
    EXPECT_NE(encoded.status().message().find(needle), std::string::npos) << encoded.status().message();
  };
  auto pair = [](DType idx_dtype, std::vector<uint8_t> idx, uint64_t count, uint64_t values) {
    Crafted c;
    c.Add("w.idx", idx_dtype, {count}, std::move(idx));
    c.Add("w.val", DType::kBF16, {values}, std::vector<uint8_t>(values * 2, 1));
    return c.Serialize(DeltaMetadata());
  };
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  // Overflow in the first chunk, past a chunk border, and from the "+1" alone.
  std::vector<uint64_t> late(kChunk + 10, 0);
  late[kChunk + 3] = max - kChunk;
  expect_same(pair(DType::kU64, Bytes<uint64_t>(std::vector<uint64_t>{1, max - 1, 0}), 3, 3),
              "gap_delta indices overflow at position 1");
  expect_same(pair(DType::kU64, Bytes<uint64_t>(late), late.size(), late.size()),
              "gap_delta indices overflow at position " + std::to_string(kChunk + 3));
  expect_same(pair(DType::kU64, Bytes<uint64_t>(std::vector<uint64_t>{max, 0}), 2, 2),
              "gap_delta indices overflow at position 1");
  expect_same(pair(DType::kI32, Bytes<int32_t>(std::vector<int>{1, 2}), 2, 2), "is not a gap_delta index type");
  expect_same(pair(DType::kU16, Bytes<uint16_t>(std::vector<int>{1, 2}), 2, 3), "2 indices but 'w.val' holds 3");

  // Range, dtype and duplicate checks: ValidateChanges says the same.
  std::mt19937_64 rng(17);
  RandomBytesModel model;
  model.Add("w", DType::kBF16, 2 * kChunk, rng);
  model.Add("n", DType::kF32, 4, rng);
  WeightState state = model.State();
  const auto before = Snapshot(state);
  auto expect_invalid = [&](const std::vector<uint8_t>& bytes, std::string_view needle) {
    BothWays both = DecodeBoth(bytes);
    Status want = ValidateChanges(state, both.decoded.changes);
    Status got = ValidateEncodedChanges(state, both.encoded.encoded);
    ASSERT_FALSE(want.ok()) << needle;
    EXPECT_EQ(got.code(), want.code());
    EXPECT_EQ(got.message(), want.message());
    EXPECT_NE(got.message().find(needle), std::string::npos) << got.message();
    EXPECT_EQ(Snapshot(state), before);
  };
  // One past the end, only reached in the second chunk.
  std::vector<uint16_t> gaps(kChunk + 2, 0);
  gaps[kChunk] = kChunk - 1;  // index 2 * kChunk - 1, then 2 * kChunk
  expect_invalid(pair(DType::kU16, Bytes<uint16_t>(gaps), gaps.size(), gaps.size()),
                 "tensor 'w': index " + std::to_string(2 * kChunk) + " is out of range (the tensor has " +
                     std::to_string(2 * kChunk) + " elements)");
  Crafted ghost;
  ghost.Add("ghost.idx", DType::kU16, {1}, Bytes<uint16_t>(std::vector<int>{0}));
  ghost.Add("ghost.val", DType::kBF16, {1}, {0, 0});
  expect_invalid(ghost.Serialize(DeltaMetadata()), "tensor 'ghost': changed by the delta but absent from the state");
  Crafted wrong_dtype;
  wrong_dtype.Add("n.idx", DType::kU16, {1}, Bytes<uint16_t>(std::vector<int>{0}));
  wrong_dtype.Add("n.val", DType::kBF16, {1}, {0, 0});
  expect_invalid(wrong_dtype.Serialize(DeltaMetadata()), "the delta carries BF16 values but the state holds F32");
}

}  // namespace
}  // namespace deltasync
