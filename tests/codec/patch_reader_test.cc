// DecodePatch: every rule of docs/format.md, "Patch objects" broken at least once, the
// older TRL layout, and the tolerance TRL's own reader has for missing keys.
#include <gtest/gtest.h>

#include <limits>

#include "codec/patch_test_util.h"

namespace deltasync {
namespace {

using testing::Bytes;
using testing::Crafted;
using testing::Decode;
using testing::DeltaMetadata;

constexpr const char* kLabel = "deltas/step_000012.safetensors";

std::vector<uint8_t> Bf16(size_t n) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(0x3f80 + i);
  return Bytes<uint16_t>(v);
}

// A delta with one parameter "w": `idx` (dtype, bytes, count) and n bf16 values.
std::vector<uint8_t> OnePair(const Metadata& m, DType idx_dtype, std::vector<uint8_t> idx, uint64_t n,
                             std::string idx_name = "w.idx", std::string val_name = "w.val") {
  Crafted c;
  c.Add(idx_name, idx_dtype, {n}, std::move(idx));
  c.Add(val_name, DType::kBF16, {n}, Bf16(n));
  return c.Serialize(m);
}

void ExpectError(const Result<DecodedPatch>& r, ErrorCode code, std::string_view needle) {
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << needle;
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  EXPECT_EQ(r.status().message().rfind(kLabel, 0), 0u) << "error does not name the file: " << r.status().message();
}

void ExpectCorrupt(std::vector<uint8_t> bytes, std::string_view needle) {
  ExpectError(Decode(std::move(bytes), kLabel), ErrorCode::kCorruption, needle);
}

std::vector<uint8_t> GoodGapFile(Metadata m = DeltaMetadata()) {
  return OnePair(m, DType::kU16, Bytes<uint16_t>(std::vector<int>{2, 0, 7}), 3);
}

TEST(DecodePatchTest, AcceptsAMinimalTrlDelta) {
  // Only the keys TRL's reader needs; counts are optional.
  Result<DecodedPatch> r = Decode(GoodGapFile(), kLabel);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->changes.size(), 1u);
  EXPECT_EQ(r->changes[0].name, "w");
  EXPECT_EQ(r->changes[0].indices, (std::vector<uint64_t>{2, 3, 11}));
  EXPECT_EQ(r->changes[0].values, Bf16(3));
  EXPECT_EQ(r->info.model_version, 5u);
  EXPECT_EQ(r->info.total_elements, 3u);  // unknown: the changed count
  EXPECT_FALSE(r->info.base_version.has_value());
}

TEST(DecodePatchTest, MissingEncodingMeansGapDeltaAsInTrl) {
  Metadata m = DeltaMetadata();
  m.erase("encoding");
  Result<DecodedPatch> r = Decode(GoodGapFile(m), kLabel);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->info.encoding, IndexEncoding::kGapDelta);
}

TEST(DecodePatchTest, MetadataRules) {
  auto with = [](std::string key, std::optional<std::string> value) {
    Metadata m = DeltaMetadata();
    if (value) {
      m[key] = *value;
    } else {
      m.erase(key);
    }
    return GoodGapFile(m);
  };
  // Without 'format' but with 'sparse' and 'model_version' a file is read as
  // TRL v1, whose deltas use '{name}.indices' (TrlV1Layout below).
  ExpectCorrupt(with("format", std::nullopt), "tensor 'w.idx': a TRL v1 delta (no 'format' in __metadata__)");
  ExpectCorrupt(with("format", "safetensors"), "__metadata__ 'format' is 'safetensors'");
  ExpectCorrupt(with("version", std::nullopt), "__metadata__ has no 'version'");
  ExpectError(Decode(with("version", "2"), kLabel), ErrorCode::kUnsupported,
              "patch format version '2' is not supported (deltasync reads version 1)");
  ExpectCorrupt(with("sparse", "true"), "__metadata__ 'sparse' is 'true', expected 'True' or 'False'");
  ExpectCorrupt(with("model_version", std::nullopt), "__metadata__ has no 'model_version'");
  ExpectCorrupt(with("model_version", "-1"), "__metadata__ 'model_version' is '-1', not a non-negative integer");
  ExpectCorrupt(with("model_version", "1.0"), "'model_version' is '1.0', not a non-negative integer");
  ExpectCorrupt(with("model_version", "99999999999999999999"), "not a non-negative integer");
  ExpectCorrupt(with("num_changed_params", "one"), "__metadata__ 'num_changed_params' is 'one'");
  ExpectCorrupt(with("total_elements", ""), "__metadata__ 'total_elements' is ''");
  ExpectCorrupt(with("encoding", "zstd"), "__metadata__ 'encoding' is 'zstd', expected 'raw' or 'gap_delta'");
  ExpectCorrupt(with("deltasync_base_version", "5"), "deltasync_base_version 5 is not older than model_version 5");
  ExpectCorrupt(with("deltasync_base_version", "x"), "'deltasync_base_version' is 'x'");
  ExpectCorrupt(with("deltasync_base_state_hash", "abc"), "'deltasync_base_state_hash' is 'abc', not 32 hex digits");
}

// deltasync_base_state_hash (written by `deltasync diff`): read into the
// info, and written back by the delta encoder.
TEST(DecodePatchTest, BaseStateHashIsReadAndWritten) {
  Result<DecodedPatch> none = Decode(GoodGapFile(DeltaMetadata()), kLabel);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->info.base_state_hash.has_value());
  Metadata m = DeltaMetadata();
  m["deltasync_base_state_hash"] = "0123456789abcdef0123456789abcdef";
  Result<DecodedPatch> r = Decode(GoodGapFile(m), kLabel);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->info.base_state_hash.has_value());
  EXPECT_EQ(r->info.base_state_hash->Hex(), "0123456789abcdef0123456789abcdef");

  PatchInfo info = r->info;
  info.total_elements = 1000;
  Result<EncodedPatch> encoded = EncodeDelta(info, r->changes);
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  std::vector<uint8_t> bytes;
  for (ByteSpan part : encoded->parts) bytes.insert(bytes.end(), part.begin(), part.end());
  Result<DecodedPatch> again = Decode(std::move(bytes), kLabel);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->file.metadata().at("deltasync_base_state_hash"), "0123456789abcdef0123456789abcdef");
  ASSERT_TRUE(again->info.base_state_hash.has_value());
  EXPECT_EQ(*again->info.base_state_hash, *r->info.base_state_hash);
}

TEST(DecodePatchTest, CountsMustAgreeWithTheTensors) {
  auto with = [](std::string key, std::string value) {
    Metadata m = DeltaMetadata();
    m[key] = value;
    return GoodGapFile(m);
  };
  ExpectCorrupt(with("num_changed_params", "2"), "num_changed_params is 2 but the delta holds 1 parameters");
  ExpectCorrupt(with("total_changed_elements", "4"), "total_changed_elements is 4 but the delta holds 3 indices");
  ExpectCorrupt(with("total_elements", "2"), "total_elements 2 is less than the 3 changed elements");
  Metadata ok = DeltaMetadata();
  ok["num_changed_params"] = "1";
  ok["total_changed_elements"] = "3";
  ok["total_elements"] = "1000";
  ok["deltasync_base_version"] = "4";
  Result<DecodedPatch> r = Decode(GoodGapFile(ok), kLabel);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->info.total_elements, 1000u);
  EXPECT_EQ(r->info.base_version, std::optional<uint64_t>(4));
}

TEST(DecodePatchTest, NvcompIsRefusedForDeltasOnly) {
  Result<DecodedPatch> r = Decode(GoodGapFile(DeltaMetadata("nvcomp_cascaded")), kLabel);
  ExpectError(r, ErrorCode::kUnsupported,
              "deltas/step_000012.safetensors: encoding nvcomp_cascaded needs nvCOMP (a GPU codec); "
              "re-publish with --encoding gap_delta or raw");
  // TRL stamps the configured encoding on anchors too; they hold no indices.
  Metadata m = DeltaMetadata("nvcomp_cascaded");
  m["sparse"] = "False";
  Crafted c;
  c.Add("w", DType::kBF16, {2}, Bf16(2));
  Result<DecodedPatch> anchor = Decode(c.Serialize(m), kLabel);
  ASSERT_TRUE(anchor.ok()) << anchor.status().ToString();
  EXPECT_EQ(anchor->info.kind, PatchKind::kAnchor);
}

TEST(DecodePatchTest, PairingRules) {
  Metadata m = DeltaMetadata();
  {
    Crafted c;
    c.Add("w", DType::kBF16, {2}, Bf16(2));
    ExpectCorrupt(c.Serialize(m), "tensor 'w': a delta holds only '{name}.idx' + '{name}.val'");
  }
  {
    Crafted c;
    c.Add("w.idx", DType::kU16, {1}, Bytes<uint16_t>(std::vector<int>{0}));
    ExpectCorrupt(c.Serialize(m), "tensor 'w.idx': has no value tensor 'w.val'");
  }
  {
    Crafted c;
    c.Add("w.val", DType::kBF16, {1}, Bf16(1));
    ExpectCorrupt(c.Serialize(m), "tensor 'w.val': has no index tensor 'w.idx'");
  }
  {
    Crafted c;
    c.Add("w.values", DType::kBF16, {1}, Bf16(1));
    ExpectCorrupt(c.Serialize(m), "tensor 'w.values': has no index tensor 'w.indices'");
  }
  {
    Crafted c;
    c.Add("w.idx", DType::kU16, {1}, Bytes<uint16_t>(std::vector<int>{0}));
    c.Add("w.indices", DType::kI32, {1}, Bytes<int32_t>(std::vector<int>{0}));
    c.Add("w.val", DType::kBF16, {1}, Bf16(1));
    ExpectCorrupt(c.Serialize(m), "parameter 'w' already has indices in 'w.i");
  }
  {
    Crafted c;
    c.Add("w.idx", DType::kU16, {1}, Bytes<uint16_t>(std::vector<int>{0}));
    c.Add("w.values", DType::kBF16, {1}, Bf16(1));
    ExpectCorrupt(c.Serialize(m), "tensor 'w.idx': pairs with 'w.values' of the other layout");
  }
}

TEST(DecodePatchTest, ShapeRules) {
  Metadata m = DeltaMetadata();
  {
    Crafted c;
    c.Add("w.idx", DType::kU16, {2, 1}, Bytes<uint16_t>(std::vector<int>{0, 1}));
    c.Add("w.val", DType::kBF16, {2}, Bf16(2));
    ExpectCorrupt(c.Serialize(m), "tensor 'w.idx': shape [2, 1] is not 1-D");
  }
  {
    Crafted c;
    c.Add("w.idx", DType::kU16, {2}, Bytes<uint16_t>(std::vector<int>{0, 1}));
    c.Add("w.val", DType::kBF16, {}, Bf16(1));
    ExpectCorrupt(c.Serialize(m), "tensor 'w.val': shape [] is not 1-D");
  }
  {
    Crafted c;
    c.Add("w.idx", DType::kU16, {3}, Bytes<uint16_t>(std::vector<int>{0, 1, 2}));
    c.Add("w.val", DType::kBF16, {2}, Bf16(2));
    ExpectCorrupt(c.Serialize(m), "tensor 'w.idx': 3 indices but 'w.val' holds 2 values");
  }
}

TEST(DecodePatchTest, IndexDtypeMustMatchTheEncoding) {
  ExpectCorrupt(OnePair(DeltaMetadata("raw"), DType::kU16, Bytes<uint16_t>(std::vector<int>{1}), 1),
                "tensor 'w.idx': dtype U16 is not a raw index type (I32 or I64)");
  ExpectCorrupt(OnePair(DeltaMetadata("gap_delta"), DType::kI32, Bytes<int32_t>(std::vector<int>{1}), 1),
                "tensor 'w.idx': dtype I32 is not a gap_delta index type (U16, U32 or U64)");
  ExpectCorrupt(OnePair(DeltaMetadata("gap_delta"), DType::kF32, Bytes<float>(std::vector<float>{1}), 1),
                "dtype F32 is not a gap_delta index type");
  // The older layout is raw whatever "encoding" says.
  ExpectCorrupt(OnePair(DeltaMetadata("gap_delta"), DType::kU16, Bytes<uint16_t>(std::vector<int>{1}), 1,
                        "w.indices", "w.values"),
                "tensor 'w.indices': dtype U16 is not a raw index type");
}

TEST(DecodePatchTest, RawIndicesNonNegativeAndStrictlyAscending) {
  const Metadata raw = DeltaMetadata("raw");
  ExpectCorrupt(OnePair(raw, DType::kI32, Bytes<int32_t>(std::vector<int>{0, -3}), 2),
                "tensor 'w.idx': raw index -3 at position 1 is negative");
  ExpectCorrupt(OnePair(raw, DType::kI32, Bytes<int32_t>(std::vector<int>{-1}), 1),
                "raw index -1 at position 0 is negative");
  ExpectCorrupt(OnePair(raw, DType::kI32, Bytes<int32_t>(std::vector<int>{1, 7, 5}), 3),
                "tensor 'w.idx': raw indices are not strictly ascending at position 2 (5 after 7)");
  ExpectCorrupt(OnePair(raw, DType::kI64, Bytes<int64_t>(std::vector<int64_t>{4, 4}), 2),
                "raw indices are not strictly ascending at position 1 (4 after 4)");
  ExpectCorrupt(OnePair(raw, DType::kI64, Bytes<int64_t>(std::vector<int64_t>{std::numeric_limits<int64_t>::min()}), 1),
                "is negative");
  Result<DecodedPatch> ok = Decode(OnePair(raw, DType::kI64, Bytes<int64_t>(std::vector<int64_t>{1, 1ll << 40}), 2));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->changes[0].indices, (std::vector<uint64_t>{1, uint64_t{1} << 40}));
}

TEST(DecodePatchTest, GapOverflowNamesFileTensorAndPosition) {
  std::vector<uint64_t> gaps(20, 0);
  gaps[16] = std::numeric_limits<uint64_t>::max() - 20;
  gaps[17] = 5;
  Crafted c;
  c.Add("model.layers.0.mlp.up_proj.weight.idx", DType::kU64, {20}, Bytes<uint64_t>(gaps));
  c.Add("model.layers.0.mlp.up_proj.weight.val", DType::kBF16, {20}, Bf16(20));
  Result<DecodedPatch> r = Decode(c.Serialize(DeltaMetadata()), kLabel);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCorruption);
  EXPECT_EQ(r.status().message(),
            "deltas/step_000012.safetensors: tensor 'model.layers.0.mlp.up_proj.weight.idx': gap_delta indices "
            "overflow at position 17");
  // The "+1" alone can overflow too.
  ExpectCorrupt(OnePair(DeltaMetadata(), DType::kU64,
                        Bytes<uint64_t>(std::vector<uint64_t>{0, std::numeric_limits<uint64_t>::max()}), 2),
                "gap_delta indices overflow at position 1");
  // The largest representable position is fine.
  Result<DecodedPatch> ok = Decode(OnePair(
      DeltaMetadata(), DType::kU64, Bytes<uint64_t>(std::vector<uint64_t>{0, std::numeric_limits<uint64_t>::max() - 1}), 2));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->changes[0].indices[1], std::numeric_limits<uint64_t>::max());
}

TEST(DecodePatchTest, AnchorRules) {
  Metadata m = DeltaMetadata();
  m["sparse"] = "False";
  auto anchor = [](const Metadata& md) {
    Crafted c;
    c.Add("b", DType::kBF16, {2, 2}, Bf16(4));
    c.Add("a", DType::kF32, {1}, Bytes<float>(std::vector<float>{1}));
    return c.Serialize(md);
  };
  Result<DecodedPatch> r = Decode(anchor(m), kLabel);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->dense.size(), 2u);
  EXPECT_EQ(r->dense[0].name, "a");
  EXPECT_EQ(r->info.total_elements, 5u);
  EXPECT_EQ(r->info.num_changed_params, 2u);
  Metadata bad = m;
  bad["num_changed_params"] = "3";
  ExpectCorrupt(anchor(bad), "num_changed_params is 3 but the anchor holds 2 tensors");
  bad = m;
  bad["total_elements"] = "4";
  ExpectCorrupt(anchor(bad), "total_elements is 4 but the anchor holds 5 elements");
  bad = m;
  bad["total_changed_elements"] = "0";
  ExpectCorrupt(anchor(bad), "total_changed_elements is 0 but the anchor holds 5 elements");
}

// The older TRL writer: "{name}.indices" (int32) + "{name}.values", a JSON
// "changed_params" list, no "sparse"/"encoding"; anchors with format
// "anchor_checkpoint"; "__empty_delta__" when nothing changed.
Metadata OldDeltaMetadata(std::string changed_params) {
  return {{"format", "sparse_weight_patch"}, {"version", "1"}, {"model_version", "3"}, {"prev_model_version", "2"},
          {"anchor_step", "1"}, {"base_model_id", "Qwen/Qwen3-0.6B"}, {"num_changed_params", "2"},
          {"total_changed_elements", "3"}, {"total_elements", "100"}, {"sparsity", "0.97"},
          {"checksum_sha256", "00ff"}, {"changed_params", changed_params}};
}

std::vector<uint8_t> OldDelta(const Metadata& m) {
  Crafted c;
  c.Add("x.indices", DType::kI32, {2}, Bytes<int32_t>(std::vector<int>{4, 9}));
  c.Add("x.values", DType::kBF16, {2}, Bf16(2));
  c.Add("a.b.indices", DType::kI32, {1}, Bytes<int32_t>(std::vector<int>{0}));
  c.Add("a.b.values", DType::kBF16, {1}, Bf16(1));
  return c.Serialize(m);
}

TEST(DecodePatchTest, OlderLayout) {
  Result<DecodedPatch> r = Decode(OldDelta(OldDeltaMetadata("[\"x\", \"a.b\"]")), kLabel);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->info.kind, PatchKind::kDelta);
  EXPECT_EQ(r->info.encoding, IndexEncoding::kRaw);
  EXPECT_EQ(r->info.model_version, 3u);
  ASSERT_EQ(r->changes.size(), 2u);
  EXPECT_EQ(r->changes[0].name, "a.b");
  EXPECT_EQ(r->changes[1].name, "x");
  EXPECT_EQ(r->changes[1].indices, (std::vector<uint64_t>{4, 9}));

  ExpectCorrupt(OldDelta(OldDeltaMetadata("[\"x\"]")),
                "__metadata__ 'changed_params' lists 1 parameters, which are not the 2 in the file");
  ExpectCorrupt(OldDelta(OldDeltaMetadata("[\"x\", \"a.b\", \"x\"]")), "lists 3 parameters");
  ExpectCorrupt(OldDelta(OldDeltaMetadata("x, a.b")), "'changed_params' is not a JSON list of names");
  ExpectCorrupt(OldDelta(OldDeltaMetadata("[1, 2]")), "'changed_params' is not a JSON list of names");

  // Empty older delta: a placeholder tensor and an empty list.
  Metadata empty = OldDeltaMetadata("[]");
  empty["num_changed_params"] = "0";
  empty["total_changed_elements"] = "0";
  Crafted c;
  c.Add("__empty_delta__", DType::kI32, {1}, Bytes<int32_t>(std::vector<int>{0}));
  Result<DecodedPatch> e = Decode(c.Serialize(empty), kLabel);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_TRUE(e->changes.empty());

  // Older anchors.
  Crafted a;
  a.Add("w", DType::kBF16, {3}, Bf16(3));
  Metadata anchor = {{"format", "anchor_checkpoint"}, {"version", "1"}, {"model_version", "10"},
                     {"base_model_id", ""}, {"checksum_sha256", "ab"}};
  Result<DecodedPatch> ar = Decode(a.Serialize(anchor), kLabel);
  ASSERT_TRUE(ar.ok()) << ar.status().ToString();
  EXPECT_EQ(ar->info.kind, PatchKind::kAnchor);
  EXPECT_EQ(ar->info.model_version, 10u);
  EXPECT_EQ(ar->info.total_elements, 3u);
  anchor["sparse"] = "True";
  ExpectCorrupt(a.Serialize(anchor), "format 'anchor_checkpoint' but sparse 'True'");
}

// TRL's v1 writer, as the blog describes it: deltas with '{name}.indices'
// (I32) + '{name}.values' and metadata sparse, model_version, sparsity,
// changed_params; anchors with sparse 'False'. No 'format', no 'version'.
TEST(DecodePatchTest, TrlV1Layout) {
  Metadata m = {{"sparse", "True"}, {"model_version", "11"}, {"sparsity", "0.97"},
                {"changed_params", "[\"x\", \"a.b\"]"}};
  EXPECT_TRUE(LooksLikeTrlPatch(m));
  Result<DecodedPatch> r = Decode(OldDelta(m), kLabel);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->info.kind, PatchKind::kDelta);
  EXPECT_EQ(r->info.encoding, IndexEncoding::kRaw);
  EXPECT_EQ(r->info.model_version, 11u);
  ASSERT_EQ(r->changes.size(), 2u);
  EXPECT_EQ(r->changes[1].name, "x");
  EXPECT_EQ(r->changes[1].indices, (std::vector<uint64_t>{4, 9}));
  EXPECT_EQ(r->changes[1].values, Bf16(2));
  Metadata with_version = m;
  with_version["version"] = "1";
  EXPECT_TRUE(Decode(OldDelta(with_version), kLabel).ok());

  // Recognised by its keys: the v1 layout throughout, and its list of names.
  Metadata no_list = m;
  no_list.erase("changed_params");
  ExpectCorrupt(OldDelta(no_list), "a TRL v1 delta (no 'format' in __metadata__) must list its parameters in "
                                   "'changed_params'");
  ExpectCorrupt(GoodGapFile(m), "tensor 'w.idx': a TRL v1 delta");

  // A v1 anchor: a full checkpoint whose metadata says sparse 'False' and
  // model_version.
  Crafted a;
  a.Add("w", DType::kBF16, {3}, Bf16(3));
  Metadata anchor = {{"sparse", "False"}, {"model_version", "10"}, {"sparsity", "0.0"}};
  EXPECT_TRUE(LooksLikeTrlPatch(anchor));
  Result<DecodedPatch> ar = Decode(a.Serialize(anchor), kLabel);
  ASSERT_TRUE(ar.ok()) << ar.status().ToString();
  EXPECT_EQ(ar->info.kind, PatchKind::kAnchor);
  EXPECT_EQ(ar->info.model_version, 10u);
  ASSERT_EQ(ar->dense.size(), 1u);

  // A plain checkpoint carries neither: it is no patch.
  for (const Metadata& plain : {Metadata{}, Metadata{{"format", "pt"}}, Metadata{{"model_version", "3"}},
                                Metadata{{"sparse", "False"}}}) {
    EXPECT_FALSE(LooksLikeTrlPatch(plain));
    ExpectCorrupt(a.Serialize(plain), "not a sparse_weight_patch");
  }
}

TEST(DecodePatchTest, BothLayoutsInOneFile) {
  Crafted c;
  c.Add("new.idx", DType::kU16, {2}, Bytes<uint16_t>(std::vector<int>{1, 1}));
  c.Add("new.val", DType::kBF16, {2}, Bf16(2));
  c.Add("old.indices", DType::kI32, {2}, Bytes<int32_t>(std::vector<int>{1, 3}));
  c.Add("old.values", DType::kBF16, {2}, Bf16(2));
  Result<DecodedPatch> r = Decode(c.Serialize(DeltaMetadata()), kLabel);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->changes.size(), 2u);
  EXPECT_EQ(r->changes[0].indices, (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(r->changes[1].indices, (std::vector<uint64_t>{1, 3}));
}

}  // namespace
}  // namespace deltasync
