// Writes the patch fuzzer's seed corpus (tests/fuzz/corpus/patch/). Disabled:
// run once after a format change with
//   codec_tests --gtest_also_run_disabled_tests --gtest_filter='*SeedCorpus*'
// and check the files in. The enabled test checks that the checked-in seeds
// still decode (ok_*) or fail (bad_*) as their names say.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "codec/patch_test_util.h"

namespace deltasync {
namespace {

using testing::Bytes;
using testing::Crafted;
using testing::DeltaMetadata;
using testing::Flatten;
using testing::MakeChanges;

const std::filesystem::path kCorpus = std::filesystem::path(DS_SOURCE_DIR) / "tests/fuzz/corpus/patch";

std::vector<std::pair<std::string, std::vector<uint8_t>>> Seeds() {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> seeds;
  auto add_encoded = [&](std::string name, Result<EncodedPatch> patch) {
    EXPECT_TRUE(patch.ok()) << name;
    if (patch.ok()) seeds.emplace_back(std::move(name), Flatten(*patch));
  };
  std::vector<uint8_t> w = Bytes<uint16_t>(std::vector<int>{0x3f80, 0x4000, 0xbf80, 0x0000, 0x7fc0, 0x1234});
  std::vector<uint8_t> b = Bytes<float>(std::vector<float>{0.5f, -1.0f});
  std::vector<TensorView> anchor = {{"model.w", DType::kBF16, {2, 3}, w}, {"model.b", DType::kF32, {2}, b}};
  add_encoded("ok_anchor", EncodeAnchor(3, anchor));
  add_encoded("ok_anchor_empty", EncodeAnchor(1, {}));

  PatchInfo info;
  info.model_version = 4;
  info.total_elements = 1 << 20;
  for (IndexEncoding e : {IndexEncoding::kGapDelta, IndexEncoding::kRaw}) {
    info.encoding = e;
    const std::string enc(EncodingName(e));
    add_encoded("ok_delta_" + enc, EncodeDelta(info, std::vector<TensorChanges>{MakeChanges("a", {0, 1, 7, 300}),
                                                                                  MakeChanges("b.c", {65535})}));
    add_encoded("ok_delta_" + enc + "_wide",
                EncodeDelta(info, std::vector<TensorChanges>{MakeChanges("wide", {2, 70'000, 3'000'000'000ull,
                                                                                  (uint64_t{1} << 40)}),
                                                            MakeChanges("narrow", {1, 2})}));
    add_encoded("ok_delta_" + enc + "_empty",
                EncodeDelta(info, std::vector<TensorChanges>{MakeChanges("none", {})}));
  }
  info.base_version = 3;
  info.encoding = IndexEncoding::kGapDelta;
  add_encoded("ok_delta_base_version", EncodeDelta(info, std::vector<TensorChanges>{MakeChanges("x", {9})}));

  Metadata old = {{"format", "sparse_weight_patch"}, {"version", "1"}, {"model_version", "2"},
                  {"prev_model_version", "1"}, {"num_changed_params", "1"}, {"total_changed_elements", "2"},
                  {"total_elements", "10"}, {"sparsity", "0.8"}, {"changed_params", "[\"w\"]"}};
  Crafted v1;
  v1.Add("w.indices", DType::kI32, {2}, Bytes<int32_t>(std::vector<int>{3, 8}));
  v1.Add("w.values", DType::kBF16, {2}, Bytes<uint16_t>(std::vector<int>{0x3f80, 0x4000}));
  seeds.emplace_back("ok_old_delta", v1.Serialize(old));
  old["changed_params"] = "[]";
  old["num_changed_params"] = "0";
  old["total_changed_elements"] = "0";
  Crafted v1_empty;
  v1_empty.Add("__empty_delta__", DType::kI32, {1}, Bytes<int32_t>(std::vector<int>{0}));
  seeds.emplace_back("ok_old_delta_empty", v1_empty.Serialize(old));
  Crafted v1_anchor;
  v1_anchor.Add("w", DType::kBF16, {2}, Bytes<uint16_t>(std::vector<int>{1, 2}));
  seeds.emplace_back("ok_old_anchor", v1_anchor.Serialize({{"format", "anchor_checkpoint"}, {"version", "1"},
                                                              {"model_version", "10"}, {"checksum_sha256", "00"}}));

  // TRL v1 as the blog describes it: no 'format', no 'version'.
  Crafted trl_v1;
  trl_v1.Add("w.indices", DType::kI32, {2}, Bytes<int32_t>(std::vector<int>{3, 8}));
  trl_v1.Add("w.values", DType::kBF16, {2}, Bytes<uint16_t>(std::vector<int>{0x3f80, 0x4000}));
  seeds.emplace_back("ok_trl_v1_delta", trl_v1.Serialize({{"sparse", "True"}, {"model_version", "11"},
                                                          {"sparsity", "0.8"}, {"changed_params", "[\"w\"]"}}));
  seeds.emplace_back("ok_trl_v1_anchor",
                     v1_anchor.Serialize({{"sparse", "False"}, {"model_version", "10"}, {"sparsity", "0.0"}}));

  auto pair = [](Metadata m, DType dtype, std::vector<uint8_t> idx, uint64_t n, std::string idx_name = "w.idx") {
    Crafted c;
    c.Add(idx_name, dtype, {n}, std::move(idx));
    c.Add("w.val", DType::kBF16, {n}, std::vector<uint8_t>(2 * n, 0x11));
    return c.Serialize(m);
  };
  seeds.emplace_back("bad_nvcomp", pair(DeltaMetadata("nvcomp_cascaded"), DType::kU8, {1, 2}, 2));
  seeds.emplace_back("bad_gap_overflow",
                     pair(DeltaMetadata(), DType::kU64,
                          Bytes<uint64_t>(std::vector<uint64_t>{1, std::numeric_limits<uint64_t>::max() - 1}), 2));
  seeds.emplace_back("bad_raw_descending",
                     pair(DeltaMetadata("raw"), DType::kI32, Bytes<int32_t>(std::vector<int>{5, 2}), 2));
  seeds.emplace_back("bad_unpaired", pair(DeltaMetadata(), DType::kU16, {0, 0}, 1, "w.idz"));
  Metadata no_format = DeltaMetadata();
  no_format.erase("format");
  seeds.emplace_back("bad_missing_format", pair(no_format, DType::kU16, {0, 0}, 1));
  return seeds;
}

TEST(SeedCorpusTest, DISABLED_WriteSeedCorpus) {
  std::filesystem::create_directories(kCorpus);
  for (const auto& [name, bytes] : Seeds()) {
    std::ofstream out(kCorpus / (name + ".safetensors"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good()) << name;
  }
}

TEST(SeedCorpusTest, CheckedInSeedsMatchTheirNames) {
  for (const auto& [name, unused] : Seeds()) {
    const std::filesystem::path path = kCorpus / (name + ".safetensors");
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(in.good()) << path << " missing; regenerate with DISABLED_WriteSeedCorpus";
    std::vector<uint8_t> stored((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Result<DecodedPatch> decoded = testing::Decode(stored, name);
    EXPECT_EQ(decoded.ok(), name.rfind("ok_", 0) == 0) << name << ": " << decoded.status().ToString();
  }
}

}  // namespace
}  // namespace deltasync
