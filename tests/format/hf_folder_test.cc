// Tests for Hugging Face model folders (hf_folder.h): reading one (shards,
// index checks, side files) and writing one (layout, metadata, atomic
// placement, --force).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "deltasync/hf_folder.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

// A bf16 tensor of `n` elements whose bytes start at `seed`.
struct Owned {
  std::string name;
  std::vector<uint8_t> bytes;
  TensorView view() const { return {name, DType::kBF16, {bytes.size() / 2}, bytes}; }
};

Owned MakeTensor(std::string name, size_t n, uint8_t seed) {
  Owned t{std::move(name), std::vector<uint8_t>(2 * n)};
  for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<uint8_t>(seed + i * 3);
  return t;
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteShard(const std::string& path, const std::vector<Owned>& tensors) {
  std::vector<TensorView> views;
  for (const Owned& t : tensors) views.push_back(t.view());
  ASSERT_TRUE(WriteSafetensorsFile(path, {{"format", "pt"}}, views).ok());
}

std::string IndexJson(const std::map<std::string, std::string>& weight_map) {
  std::string s = "{\"metadata\": {\"total_size\": 1}, \"weight_map\": {";
  bool first = true;
  for (const auto& [t, f] : weight_map) {
    s += (first ? "\"" : ", \"") + t + "\": \"" + f + "\"";
    first = false;
  }
  return s + "}}";
}

// A sharded folder: a, b in shard 1; c in shard 2; config, tokenizer, and
// files that must not travel.
struct ShardedFolder {
  TempDir tmp;
  std::string dir = tmp.Sub("ckpt");
  std::vector<Owned> tensors = {MakeTensor("a", 8, 1), MakeTensor("b", 4, 2), MakeTensor("c", 6, 3)};
  std::map<std::string, std::string> weight_map = {{"a", "model-00001-of-00002.safetensors"},
                                                   {"b", "model-00001-of-00002.safetensors"},
                                                   {"c", "model-00002-of-00002.safetensors"}};
  ShardedFolder() {
    fs::create_directories(dir);
    WriteShard(dir + "/model-00001-of-00002.safetensors", {tensors[0], tensors[1]});
    WriteShard(dir + "/model-00002-of-00002.safetensors", {tensors[2]});
    WriteText(dir + "/model.safetensors.index.json", IndexJson(weight_map));
    WriteText(dir + "/config.json", "{\"hidden_size\": 64}");
    WriteText(dir + "/tokenizer.json", "{\"tok\": 1}");
    WriteText(dir + "/chat_template.jinja", "{{ messages }}");
    WriteText(dir + "/optimizer.pt", "not carried");
    WriteText(dir + "/trainer_state.json", "{}");
  }
};

std::vector<std::string> Names(const std::vector<SideFile>& files) {
  std::vector<std::string> out;
  for (const SideFile& f : files) out.push_back(f.name);
  return out;
}

TEST(HfFolderTest, ReadsEveryShardAndTheAllowListedSideFiles) {
  ShardedFolder f;
  auto folder = ReadHfFolder(f.dir);
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  EXPECT_EQ(folder->shards.size(), 2u);
  ASSERT_EQ(folder->tensors.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(folder->tensors[i].name, f.tensors[i].name);
    EXPECT_TRUE(std::equal(folder->tensors[i].data.begin(), folder->tensors[i].data.end(), f.tensors[i].bytes.begin(),
                           f.tensors[i].bytes.end()));
  }
  EXPECT_EQ(Names(folder->side_files),
            (std::vector<std::string>{"chat_template.jinja", "config.json", "model.safetensors.index.json",
                                      "tokenizer.json"}));
  EXPECT_EQ(folder->left_out, (std::vector<std::string>{"optimizer.pt", "trainer_state.json"}));
}

TEST(HfFolderTest, WithoutAnIndexEverySafetensorsFileIsRead) {
  TempDir tmp;
  WriteShard(tmp.Sub("model.safetensors"), {MakeTensor("x", 4, 1)});
  WriteShard(tmp.Sub("extra.safetensors"), {MakeTensor("y", 4, 2)});
  auto folder = ReadHfFolder(tmp.path());
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  EXPECT_EQ(folder->tensors.size(), 2u);
}

void ExpectInvalid(const std::string& dir, const std::string& phrase) {
  auto folder = ReadHfFolder(dir);
  ASSERT_FALSE(folder.ok()) << "expected an error containing: " << phrase;
  EXPECT_EQ(folder.status().code(), ErrorCode::kInvalidArgument) << folder.status().ToString();
  EXPECT_NE(folder.status().message().find(phrase), std::string::npos) << folder.status().ToString();
}

TEST(HfFolderTest, AnUnlistedShardIsAnError) {
  ShardedFolder f;
  WriteShard(f.dir + "/consolidated.safetensors", {MakeTensor("z", 2, 9)});
  ExpectInvalid(f.dir, "consolidated.safetensors is a .safetensors file that model.safetensors.index.json does not name");
}

TEST(HfFolderTest, ATensorMissingFromItsShardIsAnError) {
  ShardedFolder f;
  f.weight_map["d"] = "model-00002-of-00002.safetensors";
  WriteText(f.dir + "/model.safetensors.index.json", IndexJson(f.weight_map));
  ExpectInvalid(f.dir, "places tensor 'd' in model-00002-of-00002.safetensors, but");
}

TEST(HfFolderTest, ATensorInTwoFilesIsAnError) {
  ShardedFolder f;
  WriteShard(f.dir + "/model-00002-of-00002.safetensors", {f.tensors[2], MakeTensor("a", 8, 1)});
  ExpectInvalid(f.dir, "tensor 'a' is in both");
}

TEST(HfFolderTest, ATensorTheIndexDoesNotListIsAnError) {
  ShardedFolder f;
  WriteShard(f.dir + "/model-00002-of-00002.safetensors", {f.tensors[2], MakeTensor("e", 2, 1)});
  ExpectInvalid(f.dir, "tensor 'e' of");
}

TEST(HfFolderTest, AnOversizedSideFileIsAnError) {
  ShardedFolder f;
  fs::resize_file(f.dir + "/tokenizer.json", kMaxSideFileBytes + 1);  // sparse: no 64 MiB written
  ExpectInvalid(f.dir, "tokenizer.json is 67108865 bytes, over the 64 MiB limit for a side file");
}

TEST(HfFolderTest, ANonModelFolderIsAnError) {
  TempDir tmp;
  WriteText(tmp.Sub("config.json"), "{}");
  ExpectInvalid(tmp.path(), "is not a model folder");
}

TEST(HfFolderTest, AShardOrTheIndexGivenAsAFileSaysToPassTheFolder) {
  ShardedFolder f;
  Status shard = CheckCheckpointFile(f.dir + "/model-00001-of-00002.safetensors");
  EXPECT_EQ(shard.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(shard.message().find("is one shard of the sharded checkpoint"), std::string::npos) << shard.ToString();
  EXPECT_NE(shard.message().find("pass the folder " + f.dir), std::string::npos) << shard.ToString();
  Status index = CheckCheckpointFile(f.dir + "/model.safetensors.index.json");
  EXPECT_EQ(index.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(index.message().find("is the index of a sharded checkpoint"), std::string::npos) << index.ToString();
  TempDir lone;
  WriteShard(lone.Sub("model.safetensors"), {MakeTensor("x", 4, 1)});
  EXPECT_TRUE(CheckCheckpointFile(lone.Sub("model.safetensors")).ok());
}

TEST(HfFolderTest, SideFileNamesArePlainAndNeverWeights) {
  EXPECT_TRUE(ValidateSideFileName("config.json").ok());
  for (const char* bad : {"", ".", "..", "a/b.json", "a\\b", "model.safetensors", "pytorch_model.bin", "x.pt",
                          "w.gguf", "bad\nname"}) {
    EXPECT_EQ(ValidateSideFileName(bad).code(), ErrorCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(IsSideFileName("tokenizer.model"));
  EXPECT_TRUE(IsSideFileName("modeling_custom.py"));
  EXPECT_FALSE(IsSideFileName("optimizer.pt"));
  EXPECT_FALSE(IsSideFileName("trainer_state.json"));
}

// Writing: the index's layout, a regenerated index, format "pt".
TEST(HfFolderTest, WritesTheIndexLayoutWithPtMetadata) {
  ShardedFolder f;
  auto folder = ReadHfFolder(f.dir);
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  const std::string out = f.tmp.Sub("out");
  HfWriteOptions options;
  options.model_version = 7;
  Status s = WriteHfFolder(out, folder->tensors, folder->side_files, options);
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto back = ReadHfFolder(out);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->shards.size(), 2u);
  EXPECT_EQ(back->shards[0].label(), out + "/model-00001-of-00002.safetensors");
  EXPECT_EQ(back->shards[0].tensors().size(), 2u);
  for (const SafetensorsFile& shard : back->shards) {
    EXPECT_EQ(shard.metadata(), (Metadata{{"format", "pt"}, {"model_version", "7"}}));
  }
  EXPECT_EQ(ReadText(out + "/config.json"), "{\"hidden_size\": 64}");
  EXPECT_EQ(ReadText(out + "/chat_template.jinja"), "{{ messages }}");
  std::string index = ReadText(out + "/model.safetensors.index.json");
  EXPECT_NE(index.find("\"total_size\": 36"), std::string::npos) << index;  // (8 + 4 + 6) x 2 bytes
  EXPECT_FALSE(fs::exists(out + "/optimizer.pt"));
  // Nothing left beside it.
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(f.tmp.path())) entries += e.path().filename().string()[0] == '.';
  EXPECT_EQ(entries, 0u);
}

TEST(HfFolderTest, WithoutAnIndexOneModelSafetensors) {
  TempDir tmp;
  Owned a = MakeTensor("a", 8, 1), b = MakeTensor("b", 4, 2);
  std::vector<TensorView> views = {a.view(), b.view()};
  SideFile config{"config.json", Blob::FromVector({'{', '}'})};
  ASSERT_TRUE(WriteHfFolder(tmp.Sub("out"), views, std::span(&config, 1), {}).ok());
  EXPECT_TRUE(fs::exists(tmp.Sub("out/model.safetensors")));
  EXPECT_FALSE(fs::exists(tmp.Sub("out/model.safetensors.index.json")));
  EXPECT_EQ(ReadText(tmp.Sub("out/config.json")), "{}");
}

TEST(HfFolderTest, MaxShardBytesReshardsAsTransformersNamesIt) {
  TempDir tmp;
  Owned a = MakeTensor("a", 8, 1), b = MakeTensor("b", 4, 2), c = MakeTensor("c", 6, 3);
  std::vector<TensorView> views = {a.view(), b.view(), c.view()};
  HfWriteOptions options;
  options.max_shard_bytes = 24;  // a (16) + b (8) fit, c (12) starts the next
  ASSERT_TRUE(WriteHfFolder(tmp.Sub("out"), views, {}, options).ok());
  auto back = ReadHfFolder(tmp.Sub("out"));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->shards.size(), 2u);
  EXPECT_EQ(back->shards[0].tensors().size(), 2u);
  EXPECT_EQ(back->shards[1].label(), tmp.Sub("out") + "/model-00002-of-00002.safetensors");
}

TEST(HfFolderTest, ANonEmptyFolderIsReplacedOnlyWhenAsked) {
  TempDir tmp;
  const std::string out = tmp.Sub("out");
  fs::create_directories(out);
  WriteText(out + "/old.txt", "old");
  Owned a = MakeTensor("a", 8, 1);
  std::vector<TensorView> views = {a.view()};
  Status refused = WriteHfFolder(out, views, {}, {});
  EXPECT_EQ(refused.code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("pass --force"), std::string::npos) << refused.ToString();
  EXPECT_TRUE(fs::exists(out + "/old.txt"));
  HfWriteOptions force;
  force.replace = true;
  ASSERT_TRUE(WriteHfFolder(out, views, {}, force).ok());
  EXPECT_FALSE(fs::exists(out + "/old.txt"));
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  size_t hidden = 0;
  for (const auto& e : fs::directory_iterator(tmp.path())) hidden += e.path().filename().string()[0] == '.';
  EXPECT_EQ(hidden, 0u);
  // An empty directory is simply filled.
  fs::create_directories(tmp.Sub("empty"));
  EXPECT_TRUE(WriteHfFolder(tmp.Sub("empty"), views, {}, {}).ok());
}

TEST(HfFolderTest, AnIndexThatMissesATensorIsRefusedOnWrite) {
  TempDir tmp;
  Owned a = MakeTensor("a", 8, 1), b = MakeTensor("b", 4, 2);
  std::vector<TensorView> views = {a.view(), b.view()};
  std::string index = IndexJson({{"a", "model-00001-of-00001.safetensors"}});
  SideFile file{std::string(kHfIndexFile), Blob::FromVector({index.begin(), index.end()})};
  Status s = WriteHfFolder(tmp.Sub("out"), views, std::span(&file, 1), {});
  EXPECT_EQ(s.code(), ErrorCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("does not place tensor 'b'"), std::string::npos) << s.ToString();
  EXPECT_FALSE(fs::exists(tmp.Sub("out")));
}

}  // namespace
}  // namespace deltasync
