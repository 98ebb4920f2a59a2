// Side files in a bucket: the manifest's per-version `files` (listed when the
// set changes, inherited otherwise), content-addressed objects verified on
// fetch, and retention keeping what kept versions reference.
#include "deltasync/side_files.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/retention.h"
#include "testing/bucket_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::OpenDirStore;
using testing::RandomModel;
using testing::ReadManifest;
using testing::TempDir;

SideFile File(std::string name, std::string text) {
  return SideFile{std::move(name), Blob::FromVector(std::vector<uint8_t>(text.begin(), text.end()))};
}

std::string Text(const SideFile& f) { return std::string(f.bytes.bytes().begin(), f.bytes.bytes().end()); }

std::unique_ptr<Publisher> OpenPublisher(std::shared_ptr<Store> store, PublisherOptions options = {}) {
  auto p = Publisher::Open(std::move(store), std::move(options));
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(*p) : nullptr;
}

// The side files of `version`, fetched and verified.
std::vector<std::pair<std::string, std::string>> Fetched(Store& store, uint64_t version) {
  Manifest m = ReadManifest(store);
  auto files = FetchSideFiles(store, m.FilesAt(version), "version " + std::to_string(version));
  EXPECT_TRUE(files.ok()) << files.status().ToString();
  std::vector<std::pair<std::string, std::string>> out;
  if (files.ok()) {
    for (const SideFile& f : *files) out.emplace_back(f.name, Text(f));
  }
  return out;
}

using Pairs = std::vector<std::pair<std::string, std::string>>;

TEST(SideFilesTest, ListedOnlyWhenTheSetChangesAndInheritedOtherwise) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  auto pub = OpenPublisher(store);
  RandomModel model(3);
  std::vector<SideFile> v1 = {File("config.json", "{\"a\": 1}"), File("tokenizer.json", "tok")};
  ASSERT_TRUE(pub->Publish(1, model.Views(), std::span<const SideFile>(v1)).ok());
  model.Step(0.01);
  ASSERT_TRUE(pub->Publish(2, model.Views(), std::span<const SideFile>(v1)).ok());  // same set
  model.Step(0.01);
  ASSERT_TRUE(pub->Publish(3, model.Views()).ok());  // no files given: unchanged
  model.Step(0.01);
  std::vector<SideFile> v4 = {File("config.json", "{\"a\": 2}"), File("tokenizer.json", "tok")};
  ASSERT_TRUE(pub->Publish(4, model.Views(), std::span<const SideFile>(v4)).ok());

  Manifest m = ReadManifest(*store);
  ASSERT_TRUE(m.Find(1)->files.has_value());
  EXPECT_FALSE(m.Find(2)->files.has_value());
  EXPECT_FALSE(m.Find(3)->files.has_value());
  ASSERT_TRUE(m.Find(4)->files.has_value());
  EXPECT_EQ(m.Find(4)->files->size(), 2u) << "the full set, not the change";
  EXPECT_EQ(m.Find(1)->files->at("tokenizer.json"), m.Find(4)->files->at("tokenizer.json"))
      << "one content-addressed object for equal bytes";
  EXPECT_EQ(m.Find(1)->files->at("config.json").key, FileObjectKey(Xxh3Hex(v1[0].bytes.bytes())));
  EXPECT_EQ(Fetched(*store, 3), (Pairs{{"config.json", "{\"a\": 1}"}, {"tokenizer.json", "tok"}}));
  EXPECT_EQ(Fetched(*store, 4), (Pairs{{"config.json", "{\"a\": 2}"}, {"tokenizer.json", "tok"}}));

  // The JSON round trip keeps `files`; a reopened publisher compares with it.
  auto parsed = Manifest::Parse(
      ByteSpan(reinterpret_cast<const uint8_t*>(m.ToJson().data()), m.ToJson().size()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->ToJson(), m.ToJson());
  auto again = OpenPublisher(store);
  model.Step(0.01);
  ASSERT_TRUE(again->Publish(5, model.Views(), std::span<const SideFile>(v4)).ok());
  EXPECT_FALSE(ReadManifest(*store).Find(5)->files.has_value());
}

TEST(SideFilesTest, ACorruptOrMissingObjectIsReported) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  auto pub = OpenPublisher(store);
  RandomModel model(4);
  std::vector<SideFile> files = {File("config.json", "{\"a\": 1}")};
  ASSERT_TRUE(pub->Publish(1, model.Views(), std::span<const SideFile>(files)).ok());
  Manifest m = ReadManifest(*store);
  const std::string key = m.Find(1)->files->at("config.json").key;
  ASSERT_TRUE(store->Put(key, ByteSpan(reinterpret_cast<const uint8_t*>("{\"a\": 9}"), 8)).ok());
  auto bad = FetchSideFiles(*store, m.FilesAt(1), "version 1");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kIntegrity);
  EXPECT_NE(bad.status().message().find("version 1: side file config.json"), std::string::npos)
      << bad.status().ToString();
  ASSERT_TRUE(store->Delete(key).ok());
  auto missing = FetchSideFiles(*store, m.FilesAt(1), "version 1");
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound) << missing.status().ToString();
}

TEST(SideFilesTest, ParseRefusesUnsafeNamesAndForeignKeys) {
  auto parse = [](const std::string& files) {
    std::string json = R"({"format": "deltasync-manifest", "format_version": 1, "anchor_interval": 10, "versions": [)"
                       R"({"version": 1, "state_hash": "00000000000000000000000000000000", "total_elements": 1,)"
                       R"( "changed_elements": 1, "created_unix_ms": 0, "objects": [{"kind": "anchor",)"
                       R"( "key": "ds/anchors/step_000001.safetensors", "encoding": "compact", "size": 1,)"
                       R"( "xxh3_128": "00000000000000000000000000000000"}], "files": )" +
                       files + "}]}";
    return Manifest::Parse(ByteSpan(reinterpret_cast<const uint8_t*>(json.data()), json.size())).status();
  };
  const std::string hash = "0123456789abcdef0123456789abcdef";
  auto entry = [&](const std::string& key) {
    return R"({"key": ")" + key + R"(", "size": 3, "xxh3_128": ")" + hash + R"("})";
  };
  EXPECT_TRUE(parse("{\"config.json\": " + entry("ds/files/" + hash) + "}").ok());
  Status escape = parse("{\"../x.json\": " + entry("ds/files/" + hash) + "}");
  EXPECT_EQ(escape.code(), ErrorCode::kCorruption);
  EXPECT_NE(escape.message().find("plain file name"), std::string::npos) << escape.ToString();
  Status weights = parse("{\"model.safetensors\": " + entry("ds/files/" + hash) + "}");
  EXPECT_NE(weights.message().find("is a weight file"), std::string::npos) << weights.ToString();
  Status foreign = parse("{\"config.json\": " + entry("ds/anchors/step_000001.safetensors") + "}");
  EXPECT_NE(foreign.message().find("is not the content address"), std::string::npos) << foreign.ToString();
  EXPECT_EQ(parse("[]").code(), ErrorCode::kCorruption);
}

TEST(SideFilesTest, PruningKeepsWhatKeptVersionsListAndRewritesAnInheritedSet) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  PublisherOptions options;
  options.anchor_interval = 3;  // anchors 1, 3, 6
  auto pub = OpenPublisher(store, options);
  RandomModel model(5);
  std::vector<SideFile> old_set = {File("config.json", "old"), File("tokenizer.json", "tok")};
  std::vector<SideFile> new_set = {File("config.json", "new"), File("tokenizer.json", "tok")};
  for (uint64_t v = 1; v <= 7; ++v) {
    if (v > 1) model.Step(0.02);
    // The set changes at 2 and stays from then on: 3..7 inherit it from 2.
    std::span<const SideFile> files(v == 1 ? old_set : new_set);
    ASSERT_TRUE(pub->Publish(v, model.Views(), files).ok()) << v;
  }
  Manifest before = ReadManifest(*store);
  ASSERT_FALSE(before.Find(6)->files.has_value());
  const std::string old_key = before.Find(1)->files->at("config.json").key;
  const std::string new_key = before.Find(2)->files->at("config.json").key;
  const std::string tok_key = before.Find(1)->files->at("tokenizer.json").key;

  auto pruned = PruneVersions(*store, 1);  // keeps 6, 7
  ASSERT_TRUE(pruned.ok()) << pruned.status().ToString();
  Manifest after = ReadManifest(*store);
  ASSERT_EQ(after.versions.front().version, 6u);
  ASSERT_TRUE(after.Find(6)->files.has_value()) << "the oldest kept version lists the set it inherited";
  EXPECT_EQ(*after.Find(6)->files, before.FilesAt(6));
  EXPECT_EQ(Fetched(*store, 7), (Pairs{{"config.json", "new"}, {"tokenizer.json", "tok"}}));
  EXPECT_FALSE(store->Get(old_key).ok()) << "only removed versions listed it";
  EXPECT_TRUE(store->Get(new_key).ok());
  EXPECT_TRUE(store->Get(tok_key).ok()) << "shared by a kept version";
}

// A model folder written over the local bucket it came from, inside it or
// over a folder holding it is refused (CheckOutsideBucket), also with
// replace: before, Replica.save_hf_dir(BUCKET, force=True) (Python) replaced
// the bucket, manifest and all, with the model folder.
TEST(SideFilesTest, AReplicaFolderIsNeverWrittenOverItsLocalBucket) {
  TempDir tmp;
  auto store = OpenDirStore(tmp.Sub("bucket"));
  std::vector<SideFile> files = {File("config.json", "{}")};
  RandomModel model(5);
  auto pub = OpenPublisher(store);
  ASSERT_TRUE(pub->Publish(1, model.Views(), files).ok());
  auto replica = Replica::Create(store);
  ASSERT_TRUE(replica->Update(1).ok());
  const std::string manifest = ReadManifest(*store).ToJson();
  HfWriteOptions replace;
  replace.replace = true;
  for (const std::string& dir : {tmp.Sub("bucket"), tmp.Sub("bucket") + "/ds", tmp.Sub("bucket") + "/model",
                                 tmp.path()}) {
    Status written = WriteReplicaFolder(*store, *replica, dir, replace);
    EXPECT_EQ(written.code(), ErrorCode::kInvalidArgument) << dir << ": " << written.ToString();
    EXPECT_NE(written.message().find("bucket"), std::string::npos) << written.ToString();
    ASSERT_TRUE(store->Get(kManifestKey).ok()) << "the bucket is gone after writing " << dir;
    EXPECT_EQ(ReadManifest(*store).ToJson(), manifest);
  }
  EXPECT_TRUE(WriteReplicaFolder(*store, *replica, tmp.Sub("model"), {}).ok());
}

}  // namespace
}  // namespace deltasync
