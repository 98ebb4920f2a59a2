// Adversarial review of reading Hugging Face model folders (session 48, H2):
// index files whose weight_map disagrees with the folder in the ways the
// existing tests did not cover (a named shard missing or not a file, names
// that leave the folder or are not safetensors files, duplicate keys, values
// of the wrong type), each refused naming the file; and the tensors with no
// elements or no dimensions that a valid sharded folder may hold.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "deltasync/hf_folder.h"
#include "deltasync/safetensors.h"
#include "testing/temp_dir.h"
#include "testing/test_bytes.h"

namespace deltasync {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

using Owned = testing::OwnedBf16;

Owned MakeTensor(std::string name, std::vector<uint64_t> shape, uint8_t seed) {
  return testing::MakeBf16(std::move(name), std::move(shape), [&](size_t i) { return static_cast<uint8_t>(seed + i * 5); });
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

void WriteShard(const std::string& path, const std::vector<Owned>& tensors) {
  std::vector<TensorView> views;
  for (const Owned& t : tensors) views.push_back(t.view());
  ASSERT_TRUE(WriteSafetensorsFile(path, {{"format", "pt"}}, views).ok());
}

constexpr const char* kShard1 = "model-00001-of-00002.safetensors";
constexpr const char* kShard2 = "model-00002-of-00002.safetensors";

// A valid two-shard folder: a, b in shard 1, c in shard 2.
struct Folder {
  TempDir tmp;
  std::string dir = tmp.Sub("ckpt");
  Folder() {
    fs::create_directories(dir);
    WriteShard(dir + "/" + kShard1, {MakeTensor("a", {4, 2}, 1), MakeTensor("b", {3}, 2)});
    WriteShard(dir + "/" + kShard2, {MakeTensor("c", {5}, 3)});
    Index(std::string("\"a\": \"") + kShard1 + "\", \"b\": \"" + kShard1 + "\", \"c\": \"" + kShard2 + "\"");
  }
  // The index with `entries` as the body of its weight_map.
  void Index(const std::string& entries) const {
    WriteText(dir + "/model.safetensors.index.json", "{\"metadata\": {}, \"weight_map\": {" + entries + "}}");
  }
};

void ExpectRefused(const std::string& dir, ErrorCode code, const std::string& phrase) {
  auto folder = ReadHfFolder(dir);
  ASSERT_FALSE(folder.ok()) << "expected an error containing: " << phrase;
  EXPECT_EQ(folder.status().code(), code) << folder.status().ToString();
  EXPECT_NE(folder.status().message().find(phrase), std::string::npos) << folder.status().ToString();
}

TEST(HfFolderReview, TheValidFolderReads) {
  Folder f;
  auto folder = ReadHfFolder(f.dir);
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  EXPECT_EQ(folder->tensors.size(), 3u);
}

TEST(HfFolderReview, AShardTheIndexNamesThatIsMissingOrNotAFileIsRefused) {
  Folder f;
  fs::remove(f.dir + "/" + kShard2);
  ExpectRefused(f.dir, ErrorCode::kInvalidArgument,
                std::string("names ") + kShard2 + ", which is not a file in");
  fs::create_directories(f.dir + "/" + kShard2);  // a directory of that name
  ExpectRefused(f.dir, ErrorCode::kInvalidArgument,
                std::string("names ") + kShard2 + ", which is not a file in");
}

TEST(HfFolderReview, AWeightMapNameThatLeavesTheFolderOrIsNotSafetensorsIsRefused) {
  Folder f;
  // The file exists where the name points: the name alone is refused.
  fs::create_directories(f.tmp.Sub("other"));
  WriteShard(f.tmp.Sub("other/x.safetensors"), {MakeTensor("c", {5}, 3)});
  WriteShard(f.dir + "/c.bin.safetensors.bak", {MakeTensor("c", {5}, 3)});
  for (const std::string& name : {std::string("../other/x.safetensors"), f.tmp.Sub("other/x.safetensors"),
                                  std::string("sub/x.safetensors"), std::string("."), std::string(".."),
                                  std::string(""), std::string("c.bin.safetensors.bak"),
                                  std::string("model.safetensors.index.json")}) {
    f.Index(std::string("\"a\": \"") + kShard1 + "\", \"b\": \"" + kShard1 + "\", \"c\": \"" + name + "\"");
    ExpectRefused(f.dir, ErrorCode::kCorruption, "not a .safetensors file of this folder");
  }
}

TEST(HfFolderReview, AMalformedIndexIsRefusedNamingIt) {
  Folder f;
  f.Index(std::string("\"a\": \"") + kShard1 + "\", \"b\": 7, \"c\": \"" + kShard2 + "\"");
  ExpectRefused(f.dir, ErrorCode::kCorruption, "weight_map[\"b\"] is not a file name");
  WriteText(f.dir + "/model.safetensors.index.json", "{\"metadata\": {}}");
  ExpectRefused(f.dir, ErrorCode::kCorruption, "no \"weight_map\" object");
  WriteText(f.dir + "/model.safetensors.index.json", "{\"weight_map\": [\"a\"]}");
  ExpectRefused(f.dir, ErrorCode::kCorruption, "no \"weight_map\" object");
  WriteText(f.dir + "/model.safetensors.index.json", "{\"weight_map\": {\"a\": ");
  ExpectRefused(f.dir, ErrorCode::kCorruption, "not valid JSON");
}

TEST(HfFolderReview, ADuplicateWeightMapKeyCannotHideATensor) {
  // JSON readers keep one of the two values for a key given twice; either
  // way the folder disagrees with the index and is refused.
  Folder f;
  f.Index(std::string("\"a\": \"") + kShard1 + "\", \"b\": \"" + kShard1 + "\", \"c\": \"" + kShard2 + "\", \"a\": \"" +
          kShard2 + "\"");
  ExpectRefused(f.dir, ErrorCode::kInvalidArgument, "tensor 'a' is in ");
  f.Index(std::string("\"a\": \"") + kShard2 + "\", \"b\": \"" + kShard1 + "\", \"c\": \"" + kShard2 + "\", \"a\": \"" +
          kShard1 + "\"");
  auto folder = ReadHfFolder(f.dir);
  if (!folder.ok()) {
    EXPECT_EQ(folder.status().code(), ErrorCode::kInvalidArgument) << folder.status().ToString();
  } else {
    // The value kept is the right one: every tensor of every shard is read.
    EXPECT_EQ(folder->tensors.size(), 3u);
  }
}

TEST(HfFolderReview, WithoutAnIndexATensorInTwoFilesIsRefused) {
  Folder f;
  fs::remove(f.dir + "/model.safetensors.index.json");
  WriteShard(f.dir + "/" + kShard2, {MakeTensor("c", {5}, 3), MakeTensor("b", {3}, 2)});
  ExpectRefused(f.dir, ErrorCode::kInvalidArgument, "tensor 'b' is in both");
}

TEST(HfFolderReview, EmptyAndScalarTensorsOfAShardedFolderAreRead) {
  Folder f;
  WriteShard(f.dir + "/" + kShard2, {MakeTensor("c", {5}, 3), MakeTensor("e", {0, 4}, 0), MakeTensor("s", {}, 9)});
  f.Index(std::string("\"a\": \"") + kShard1 + "\", \"b\": \"" + kShard1 + "\", \"c\": \"" + kShard2 +
          "\", \"e\": \"" + kShard2 + "\", \"s\": \"" + kShard2 + "\"");
  auto folder = ReadHfFolder(f.dir);
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  ASSERT_EQ(folder->tensors.size(), 5u);
  // An index entry for a tensor no shard holds is refused, even one with no elements.
  f.Index(std::string("\"a\": \"") + kShard1 + "\", \"b\": \"" + kShard1 + "\", \"c\": \"" + kShard2 +
          "\", \"e\": \"" + kShard2 + "\", \"s\": \"" + kShard2 + "\", \"f\": \"" + kShard2 + "\"");
  ExpectRefused(f.dir, ErrorCode::kInvalidArgument, "places tensor 'f' in");
}

TEST(HfFolderReview, AWeightFileReplacedOrRewrittenAfterTheReadIsSeen) {
  // A trainer saving into the folder being published: the shards read
  // before its save and those read after would make one version that is
  // neither checkpoint. CheckHfFolderUnchanged is what a publisher asks
  // before it commits.
  Folder f;
  auto folder = ReadHfFolder(f.dir);
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  EXPECT_TRUE(CheckHfFolderUnchanged(*folder).ok());
  // Replaced (a new file renamed over it, as safetensors writers and
  // save_pretrained into a fresh temporary do).
  WriteShard(f.dir + "/" + kShard2, {MakeTensor("c", {5}, 4)});
  Status changed = CheckHfFolderUnchanged(*folder);
  EXPECT_EQ(changed.code(), ErrorCode::kFailedPrecondition) << changed.ToString();
  EXPECT_NE(changed.message().find(std::string(kShard2) + " changed while"), std::string::npos) << changed.ToString();
  // Rewritten in place (same inode, same size: only its times say so).
  auto again = ReadHfFolder(f.dir);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(CheckHfFolderUnchanged(*again).ok());
  {
    std::fstream io(f.dir + "/" + kShard1, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(-1, std::ios::end);
    io.put('\x11');
  }
  // The same second on a coarse clock: a later time is set explicitly too.
  fs::last_write_time(f.dir + "/" + kShard1, fs::last_write_time(f.dir + "/" + kShard1) + std::chrono::seconds(2));
  changed = CheckHfFolderUnchanged(*again);
  EXPECT_EQ(changed.code(), ErrorCode::kFailedPrecondition) << changed.ToString();
  EXPECT_NE(changed.message().find(std::string(kShard1) + " changed while"), std::string::npos) << changed.ToString();
  // The index rewritten (a save in progress writes it last) and a shard removed.
  auto third = ReadHfFolder(f.dir);
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  f.Index(std::string("\"a\": \"") + kShard1 + "\", \"b\": \"" + kShard1 + "\", \"c\": \"" + kShard2 + "\" ");
  fs::last_write_time(f.dir + "/model.safetensors.index.json",
                      fs::last_write_time(f.dir + "/model.safetensors.index.json") + std::chrono::seconds(2));
  EXPECT_EQ(CheckHfFolderUnchanged(*third).code(), ErrorCode::kFailedPrecondition);
  auto fourth = ReadHfFolder(f.dir);
  ASSERT_TRUE(fourth.ok()) << fourth.status().ToString();
  fs::remove(f.dir + "/" + kShard2);
  changed = CheckHfFolderUnchanged(*fourth);
  EXPECT_EQ(changed.code(), ErrorCode::kFailedPrecondition) << changed.ToString();
}

TEST(HfFolderReview, ASideFileRewrittenWhileTheFolderIsReadIsSeen) {
  // Session 50, H4: a save writes config.json and the tokenizer files too
  // (open, truncate, write): one read while it was written is published torn
  // (empty or cut JSON) unless it is stamped like the weight files.
  Folder f;
  WriteText(f.dir + "/config.json", "{\"model_type\": \"llama\"}");
  auto folder = ReadHfFolder(f.dir);
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  ASSERT_EQ(folder->side_files.size(), 2u);  // config.json and the index
  EXPECT_TRUE(CheckHfFolderUnchanged(*folder).ok());
  WriteText(f.dir + "/config.json", "{\"model_type\": \"qwen2\"}");  // same size, same inode
  fs::last_write_time(f.dir + "/config.json", fs::last_write_time(f.dir + "/config.json") + std::chrono::seconds(2));
  Status changed = CheckHfFolderUnchanged(*folder);
  EXPECT_EQ(changed.code(), ErrorCode::kFailedPrecondition) << changed.ToString();
  EXPECT_NE(changed.message().find("config.json changed while"), std::string::npos) << changed.ToString();
}

}  // namespace
}  // namespace deltasync
