// EncodeAnchor / EncodeDelta: TRL metadata spellings, index widths, round
// trips through DecodePatch, determinism.
#include <gtest/gtest.h>

#include <limits>

#include "codec/patch_metadata.h"
#include "codec/patch_test_util.h"

namespace deltasync {
namespace {

using testing::Bytes;
using testing::Decode;
using testing::Flatten;
using testing::MakeChanges;
using testing::ParseBytes;

PatchInfo DeltaInfo(IndexEncoding encoding, uint64_t total = 1'000'000) {
  PatchInfo info;
  info.kind = PatchKind::kDelta;
  info.model_version = 12;
  info.encoding = encoding;
  info.total_elements = total;
  return info;
}

// The dtype EncodeDelta chose for `{name}.idx`.
DType IndexDType(const EncodedPatch& patch, const std::string& name) {
  Result<SafetensorsFile> file = ParseBytes(Flatten(patch));
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  const TensorView* t = file->Find(name + ".idx");
  EXPECT_NE(t, nullptr) << name;
  return t ? t->dtype : DType::kU8;
}

void ExpectSameChanges(const std::vector<TensorChanges>& got, std::vector<TensorChanges> want) {
  std::sort(want.begin(), want.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].name, want[i].name);
    EXPECT_EQ(got[i].dtype, want[i].dtype);
    EXPECT_EQ(got[i].indices, want[i].indices) << got[i].name;
    EXPECT_EQ(got[i].values, want[i].values) << got[i].name;
  }
}

TEST(PythonFloatReprTest, MatchesCPythonRepr) {
  // Expected strings are CPython 3 repr() of the same doubles.
  using patchmeta::PythonFloatRepr;
  EXPECT_EQ(PythonFloatRepr(0.0), "0.0");
  EXPECT_EQ(PythonFloatRepr(1.0), "1.0");
  EXPECT_EQ(PythonFloatRepr(1.0 - 3.0 / 100), "0.97");
  EXPECT_EQ(PythonFloatRepr(1.0 - 1.0 / 3), "0.6666666666666667");
  EXPECT_EQ(PythonFloatRepr(1.0 - 12345.0 / 7654321), "0.9983871854864723");
  EXPECT_EQ(PythonFloatRepr(1e-05), "1e-05");
  EXPECT_EQ(PythonFloatRepr(1.5e-05), "1.5e-05");
  EXPECT_EQ(PythonFloatRepr(0.0001), "0.0001");
  EXPECT_EQ(PythonFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PythonFloatRepr(1e15), "1000000000000000.0");
  EXPECT_EQ(PythonFloatRepr(123.456), "123.456");
  EXPECT_EQ(PythonFloatRepr(5e-324), "5e-324");
  EXPECT_EQ(PythonFloatRepr(1.7976931348623157e308), "1.7976931348623157e+308");
  EXPECT_EQ(PythonFloatRepr(-2.5), "-2.5");
  EXPECT_EQ(PythonFloatRepr(1.0 - 1.0 / 1099511627776.0), "0.9999999999990905");
}

TEST(EncodingNameTest, RoundTripsAndRefusesNvcomp) {
  for (IndexEncoding e : {IndexEncoding::kRaw, IndexEncoding::kGapDelta}) {
    Result<IndexEncoding> parsed = ParseEncoding(EncodingName(e));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, e);
  }
  EXPECT_EQ(EncodingName(IndexEncoding::kRaw), "raw");
  EXPECT_EQ(EncodingName(IndexEncoding::kGapDelta), "gap_delta");
  Result<IndexEncoding> nv = ParseEncoding("nvcomp_cascaded");
  EXPECT_EQ(nv.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(nv.status().message().find("needs nvCOMP (a GPU codec)"), std::string::npos);
  EXPECT_EQ(ParseEncoding("zstd").status().code(), ErrorCode::kInvalidArgument);
}

TEST(EncodeAnchorTest, WritesTrlMetadataAndTensorsInNameOrder) {
  std::vector<uint8_t> a = Bytes<uint16_t>(std::vector<int>{1, 2, 3, 4, 5, 6});
  std::vector<uint8_t> b = Bytes<float>(std::vector<float>{1.5f, -2.0f});
  std::vector<TensorView> tensors = {{"z.weight", DType::kBF16, {2, 3}, a}, {"a.bias", DType::kF32, {2}, b}};
  Result<EncodedPatch> patch = EncodeAnchor(7, tensors);
  ASSERT_TRUE(patch.ok()) << patch.status().ToString();
  // Zero copy: the parts after the header are the caller's own bytes.
  ASSERT_EQ(patch->parts.size(), 3u);
  EXPECT_EQ(patch->parts[1].data(), b.data());
  EXPECT_EQ(patch->parts[2].data(), a.data());

  Result<SafetensorsFile> file = ParseBytes(Flatten(*patch));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const Metadata want = {{"format", "sparse_weight_patch"},
                         {"version", "1"},
                         {"sparse", "False"},
                         {"model_version", "7"},
                         {"num_changed_params", "2"},
                         {"total_changed_elements", "8"},
                         {"total_elements", "8"},
                         {"sparsity", "0.0"},
                         {"encoding", "gap_delta"}};
  EXPECT_EQ(file->metadata(), want);

  Result<DecodedPatch> decoded = DecodePatch(std::move(*file));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->info.kind, PatchKind::kAnchor);
  EXPECT_EQ(decoded->info.model_version, 7u);
  EXPECT_EQ(decoded->info.total_elements, 8u);
  EXPECT_FALSE(decoded->info.base_version.has_value());
  ASSERT_EQ(decoded->dense.size(), 2u);
  EXPECT_EQ(decoded->dense[0].name, "a.bias");
  EXPECT_EQ(decoded->dense[1].name, "z.weight");
  EXPECT_EQ(decoded->dense[1].shape, (std::vector<uint64_t>{2, 3}));
  EXPECT_TRUE(std::equal(a.begin(), a.end(), decoded->dense[1].data.begin(), decoded->dense[1].data.end()));
}

TEST(EncodeAnchorTest, EmptyAnchorAndBadSizes) {
  Result<EncodedPatch> empty = EncodeAnchor(1, {});
  ASSERT_TRUE(empty.ok());
  Result<DecodedPatch> decoded = Decode(Flatten(*empty));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_TRUE(decoded->dense.empty());

  std::vector<uint8_t> three(3);
  std::vector<TensorView> bad = {{"x", DType::kBF16, {2}, three}};
  EXPECT_EQ(EncodeAnchor(1, bad).status().code(), ErrorCode::kInvalidArgument);
}

TEST(EncodeDeltaTest, WritesTrlMetadataExactly) {
  std::vector<TensorChanges> changes = {MakeChanges("b", {1, 5}), MakeChanges("a", {0})};
  PatchInfo info = DeltaInfo(IndexEncoding::kGapDelta, 100);
  Result<EncodedPatch> patch = EncodeDelta(info, changes);
  ASSERT_TRUE(patch.ok()) << patch.status().ToString();
  Result<SafetensorsFile> file = ParseBytes(Flatten(*patch));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const Metadata want = {{"format", "sparse_weight_patch"},
                         {"version", "1"},
                         {"sparse", "True"},
                         {"model_version", "12"},
                         {"num_changed_params", "2"},
                         {"total_changed_elements", "3"},
                         {"total_elements", "100"},
                         {"sparsity", "0.97"},
                         {"encoding", "gap_delta"}};
  EXPECT_EQ(file->metadata(), want);
  // Tensor order: by parameter name, idx then val.
  std::vector<std::string> names;
  for (const TensorView& t : file->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"a.idx", "a.val", "b.idx", "b.val"}));
  EXPECT_EQ(file->Find("b.val")->dtype, DType::kBF16);
  EXPECT_EQ(file->Find("b.val")->shape, (std::vector<uint64_t>{2}));
  // gap_delta of {1, 5}: 1, 5-1-1 = 3.
  const TensorView* idx = file->Find("b.idx");
  EXPECT_EQ(idx->dtype, DType::kU16);
  EXPECT_TRUE(std::ranges::equal(idx->data, Bytes<uint16_t>(std::vector<int>{1, 3})));

  info.base_version = 11;
  info.encoding = IndexEncoding::kRaw;
  Result<EncodedPatch> raw = EncodeDelta(info, changes);
  ASSERT_TRUE(raw.ok());
  Result<SafetensorsFile> raw_file = ParseBytes(Flatten(*raw));
  ASSERT_TRUE(raw_file.ok());
  EXPECT_EQ(raw_file->metadata().at("encoding"), "raw");
  EXPECT_EQ(raw_file->metadata().at("deltasync_base_version"), "11");
  EXPECT_EQ(raw_file->Find("b.idx")->dtype, DType::kI32);
  EXPECT_TRUE(std::ranges::equal(raw_file->Find("b.idx")->data, Bytes<int32_t>(std::vector<int>{1, 5})));
}

TEST(EncodeDeltaTest, OwnsItsBytes) {
  // Unlike an anchor, a delta may outlive the changes it was made from.
  Result<EncodedPatch> patch =
      EncodeDelta(DeltaInfo(IndexEncoding::kGapDelta), std::vector<TensorChanges>{MakeChanges("a", {0, 9})});
  ASSERT_TRUE(patch.ok());
  Result<DecodedPatch> decoded = Decode(Flatten(*patch));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ExpectSameChanges(decoded->changes, {MakeChanges("a", {0, 9})});
}

class RoundTripTest : public ::testing::TestWithParam<IndexEncoding> {};

TEST_P(RoundTripTest, RandomSparseChanges) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<TensorChanges> changes;
    uint64_t total = 0;
    const int tensors = 1 + static_cast<int>(rng() % 6);
    for (int t = 0; t < tensors; ++t) {
      const uint64_t n = 1 + rng() % 300'000;
      total += n;
      const size_t count = rng() % 4 == 0 ? 0 : static_cast<size_t>(rng() % (n / 10 + 2));
      changes.push_back(MakeChanges("layer." + std::to_string(t) + ".w", testing::RandomIndices(rng, n, count)));
    }
    PatchInfo info = DeltaInfo(GetParam(), total);
    if (trial % 2) info.base_version = info.model_version - 1;
    Result<EncodedPatch> patch = EncodeDelta(info, changes);
    ASSERT_TRUE(patch.ok()) << patch.status().ToString();
    Result<DecodedPatch> decoded = Decode(Flatten(*patch));
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(decoded->info.kind, PatchKind::kDelta);
    EXPECT_EQ(decoded->info.encoding, GetParam());
    EXPECT_EQ(decoded->info.model_version, info.model_version);
    EXPECT_EQ(decoded->info.base_version, info.base_version);
    EXPECT_EQ(decoded->info.total_elements, total);
    EXPECT_EQ(decoded->info.num_changed_params, changes.size());
    ExpectSameChanges(decoded->changes, changes);
  }
}

TEST_P(RoundTripTest, EdgePositions) {
  const uint64_t n = 200'000;
  std::vector<TensorChanges> changes = {
      MakeChanges("first", {0}),
      MakeChanges("last", {n - 1}),
      MakeChanges("both", {0, n - 1}),
      MakeChanges("dense", {0, 1, 2, 3, 4, 5}),
      MakeChanges("empty", {}),
  };
  Result<EncodedPatch> patch = EncodeDelta(DeltaInfo(GetParam(), 5 * n), changes);
  ASSERT_TRUE(patch.ok()) << patch.status().ToString();
  Result<DecodedPatch> decoded = Decode(Flatten(*patch));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ExpectSameChanges(decoded->changes, changes);
}

TEST_P(RoundTripTest, NoChangesAtAll) {
  Result<EncodedPatch> patch = EncodeDelta(DeltaInfo(GetParam(), 10), {});
  ASSERT_TRUE(patch.ok());
  Result<DecodedPatch> decoded = Decode(Flatten(*patch));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_TRUE(decoded->changes.empty());
  EXPECT_EQ(decoded->info.total_changed_elements, 0u);
}

TEST_P(RoundTripTest, DeterministicBytes) {
  std::mt19937_64 rng(7);
  std::vector<TensorChanges> changes;
  for (int t = 0; t < 40; ++t) changes.push_back(MakeChanges("t" + std::to_string(t), testing::RandomIndices(rng, 100'000, 20'000)));
  std::vector<TensorChanges> reversed(changes.rbegin(), changes.rend());
  Result<EncodedPatch> a = EncodeDelta(DeltaInfo(GetParam(), 4'000'000), changes);
  Result<EncodedPatch> b = EncodeDelta(DeltaInfo(GetParam(), 4'000'000), reversed);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(Flatten(*a), Flatten(*b));
}

// EncodeDelta into `out` (the training loop's call) writes exactly the
// fresh call's bytes whatever `out` held: more tensors or fewer, wider gaps
// (U32) or narrower, more changes or fewer; an error leaves no patch.
TEST_P(RoundTripTest, IntoReusedPatchEqualsFresh) {
  std::mt19937_64 rng(31);
  EncodedPatch out;
  for (int trial = 0; trial < 16; ++trial) {
    SCOPED_TRACE("trial " + std::to_string(trial));
    std::vector<TensorChanges> changes;
    uint64_t total = 0;
    const int tensors = trial % 5 == 3 ? 0 : 1 + static_cast<int>(rng() % 7);
    for (int t = 0; t < tensors; ++t) {
      // Every third trial spreads a tensor's few changes over 2^20 elements
      // (gaps past U16); the others are dense or sparse within 2^17.
      const uint64_t n = trial % 3 == 1 ? (uint64_t{1} << 20) : 1 + rng() % (uint64_t{1} << 17);
      total += n;
      const size_t count = trial % 3 == 1 ? 4 : static_cast<size_t>(rng() % (n / (1 + trial % 4 * 20) + 2));
      changes.push_back(MakeChanges("layer." + std::to_string(t) + ".w", testing::RandomIndices(rng, n, count)));
    }
    PatchInfo info = DeltaInfo(GetParam(), total);
    if (trial % 2) info.base_version = info.model_version - 1;
    Result<EncodedPatch> fresh = EncodeDelta(info, changes);
    ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
    const Status s = EncodeDelta(info, changes, out);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(out.size, fresh->size);
    EXPECT_EQ(Flatten(out), Flatten(*fresh));
    if (trial % 4 == 2) {
      // A refused call in between: no patch, and the next call is whole again.
      std::vector<TensorChanges> bad = changes;
      bad.push_back(MakeChanges("z.bad", {3, 2}));
      EXPECT_FALSE(EncodeDelta(info, bad, out).ok());
      EXPECT_TRUE(out.parts.empty());
      EXPECT_EQ(out.size, 0u);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Encodings, RoundTripTest, ::testing::Values(IndexEncoding::kRaw, IndexEncoding::kGapDelta),
                         [](const auto& info) { return std::string(EncodingName(info.param)); });

TEST(GapWidthTest, U16UntilAGapExceeds65535PerTensor) {
  std::vector<TensorChanges> changes = {
      MakeChanges("gap65535", {0, 65536}),        // gap 65535: fits U16
      MakeChanges("gap65536", {0, 65537}),        // gap 65536: U32
      MakeChanges("first65535", {65535, 65536}),  // first gap is idx[0] = 65535
      MakeChanges("first65536", {65536}),         // idx[0] = 65536: U32
      MakeChanges("small", {3, 4, 100}),
      MakeChanges("empty", {}),
  };
  Result<EncodedPatch> patch = EncodeDelta(DeltaInfo(IndexEncoding::kGapDelta), changes);
  ASSERT_TRUE(patch.ok()) << patch.status().ToString();
  EXPECT_EQ(IndexDType(*patch, "gap65535"), DType::kU16);
  EXPECT_EQ(IndexDType(*patch, "gap65536"), DType::kU32);
  EXPECT_EQ(IndexDType(*patch, "first65535"), DType::kU16);
  EXPECT_EQ(IndexDType(*patch, "first65536"), DType::kU32);
  EXPECT_EQ(IndexDType(*patch, "small"), DType::kU16);
  EXPECT_EQ(IndexDType(*patch, "empty"), DType::kU16);
  Result<DecodedPatch> decoded = Decode(Flatten(*patch));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ExpectSameChanges(decoded->changes, changes);
}

TEST(IndexWidthTest, SixtyFourBitPositions) {
  // Tensors past 2^31 (raw) and gaps past 2^32 (gap_delta) need the 64-bit
  // extensions; the index math is checked without allocating such tensors.
  const uint64_t big = uint64_t{1} << 40;
  const uint64_t i32max = std::numeric_limits<int32_t>::max();
  std::vector<TensorChanges> changes = {
      MakeChanges("at_i32_max", {0, i32max}),
      MakeChanges("past_i32_max", {0, i32max + 1}),
      MakeChanges("huge", {5, 3'000'000'000ull, big}),
  };
  PatchInfo info = DeltaInfo(IndexEncoding::kRaw, big * 4);
  Result<EncodedPatch> raw = EncodeDelta(info, changes);
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  EXPECT_EQ(IndexDType(*raw, "at_i32_max"), DType::kI32);
  EXPECT_EQ(IndexDType(*raw, "past_i32_max"), DType::kI64);
  EXPECT_EQ(IndexDType(*raw, "huge"), DType::kI64);
  Result<DecodedPatch> raw_decoded = Decode(Flatten(*raw));
  ASSERT_TRUE(raw_decoded.ok()) << raw_decoded.status().ToString();
  ExpectSameChanges(raw_decoded->changes, changes);

  info.encoding = IndexEncoding::kGapDelta;
  Result<EncodedPatch> gap = EncodeDelta(info, changes);
  ASSERT_TRUE(gap.ok());
  EXPECT_EQ(IndexDType(*gap, "at_i32_max"), DType::kU32);
  EXPECT_EQ(IndexDType(*gap, "past_i32_max"), DType::kU32);
  EXPECT_EQ(IndexDType(*gap, "huge"), DType::kU64);  // gap 2^40 - 3e9 - 1
  Result<DecodedPatch> gap_decoded = Decode(Flatten(*gap));
  ASSERT_TRUE(gap_decoded.ok()) << gap_decoded.status().ToString();
  ExpectSameChanges(gap_decoded->changes, changes);
}

TEST(IndexWidthTest, PositionsPast2To63) {
  // Beyond any real tensor, but the arithmetic must stay exact: ascending
  // detection takes its slow path here.
  const uint64_t top = uint64_t{1} << 63;
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  std::vector<TensorChanges> changes = {MakeChanges("a", {1, top, max})};
  PatchInfo info = DeltaInfo(IndexEncoding::kGapDelta, max);
  Result<EncodedPatch> gap = EncodeDelta(info, changes);
  ASSERT_TRUE(gap.ok()) << gap.status().ToString();
  EXPECT_EQ(IndexDType(*gap, "a"), DType::kU64);
  Result<DecodedPatch> decoded = Decode(Flatten(*gap));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ExpectSameChanges(decoded->changes, changes);

  Result<EncodedPatch> down = EncodeDelta(info, std::vector<TensorChanges>{MakeChanges("a", {top + 5, 3})});
  EXPECT_NE(down.status().message().find("not strictly ascending at position 1 (3 after 9223372036854775813)"),
            std::string::npos)
      << down.status().ToString();
  info.encoding = IndexEncoding::kRaw;
  EXPECT_NE(EncodeDelta(info, changes).status().message().find("does not fit a raw (I64) index"), std::string::npos);
}

TEST(EncodeDeltaTest, RefusesBadInput) {
  PatchInfo info = DeltaInfo(IndexEncoding::kGapDelta, 100);
  auto expect = [&](std::vector<TensorChanges> changes, std::string_view needle, const PatchInfo& i) {
    Result<EncodedPatch> r = EncodeDelta(i, changes);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  expect({MakeChanges("a", {1, 1})}, "tensor 'a': indices are not strictly ascending at position 1 (1 after 1)", info);
  expect({MakeChanges("a", {5, 2})}, "not strictly ascending at position 1 (2 after 5)", info);
  expect({MakeChanges("a", {1}), MakeChanges("a", {2})}, "tensor 'a' appears twice", info);
  TensorChanges short_values = MakeChanges("a", {1, 2});
  short_values.values.pop_back();
  expect({short_values}, "tensor 'a': 3 value bytes for 2 BF16 values", info);
  PatchInfo tiny = DeltaInfo(IndexEncoding::kRaw, 1);
  expect({MakeChanges("a", {0, 1})}, "total_elements 1 is less than the 2 changed elements", tiny);
  PatchInfo bad_base = info;
  bad_base.base_version = info.model_version;
  expect({}, "base version 12 is not older than model_version 12", bad_base);
}

TEST(EncodeDeltaTest, OtherValueDtypesCarriedAsTheirOwn) {
  TensorChanges f32;
  f32.name = "norm";
  f32.dtype = DType::kF32;
  f32.indices = {1, 3};
  f32.values = Bytes<float>(std::vector<float>{0.5f, -1.0f});
  Result<EncodedPatch> patch = EncodeDelta(DeltaInfo(IndexEncoding::kGapDelta), std::vector<TensorChanges>{f32});
  ASSERT_TRUE(patch.ok());
  Result<DecodedPatch> decoded = Decode(Flatten(*patch));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ExpectSameChanges(decoded->changes, {f32});
}

}  // namespace
}  // namespace deltasync
