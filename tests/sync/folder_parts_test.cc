// A sharded model folder published one part per weight file
// (folder_parts.h): the layout, the replica following it bit for bit with the
// hash a single Publisher computes, side files, a part that fails, and
// OpenAll's one rebuild giving what Open gives per part.
#include "deltasync/folder_parts.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "deltasync/part_publisher.h"
#include "deltasync/replica.h"
#include "deltasync/side_files.h"
#include "testing/bucket_util.h"
#include "testing/fault_store.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::FaultStore;
using testing::OpenDirStore;
using testing::RandomModel;
using testing::ReadManifest;
using testing::TempDir;

SideFile Config(std::string text) {
  return SideFile{"config.json", Blob::FromVector(std::vector<uint8_t>(text.begin(), text.end()))};
}

// The model written as a folder of several shards (about 10 kB each), read back mapped.
HfFolder WriteFolder(const std::string& dir, const RandomModel& model, const std::string& config) {
  HfWriteOptions options;
  options.max_shard_bytes = 10'000;
  std::vector<SideFile> side = {Config(config)};
  Status written = WriteHfFolder(dir, model.Views(), side, options);
  EXPECT_TRUE(written.ok()) << written.ToString();
  Result<HfFolder> folder = ReadHfFolder(dir);
  EXPECT_TRUE(folder.ok()) << folder.status().ToString();
  return std::move(*folder);
}

PublisherOptions Options() {
  PublisherOptions o;
  o.anchor_interval = 2;
  o.threads = 2;
  return o;
}

TEST(FolderParts, OnePartPerFileOfWholeTensors) {
  TempDir dir;
  RandomModel model(1);
  HfFolder folder = WriteFolder(dir.path() + "/ckpt", model, "{}");
  ASSERT_GE(folder.shards.size(), 3u);
  Result<FolderLayout> fl = MakeFolderLayout(folder, Options());
  ASSERT_TRUE(fl.ok()) << fl.status().ToString();
  ASSERT_EQ(fl->layout.parts.size(), folder.shards.size());
  EXPECT_EQ(fl->layout.tensors.size(), model.Views().size());
  for (size_t p = 0; p < fl->layout.parts.size(); ++p) {
    const SafetensorsFile& shard = folder.shards[fl->part_files[p]];
    ASSERT_EQ(fl->layout.parts[p].size(), shard.tensors().size());
    for (const Block& b : fl->layout.parts[p]) {
      const TensorDesc& t = fl->layout.tensors[b.tensor];
      ASSERT_NE(shard.Find(t.name), nullptr) << t.name;
      EXPECT_EQ(b.shape, t.shape);
      EXPECT_EQ(b.offset, std::vector<uint64_t>(t.shape.size(), 0));
    }
  }
}

TEST(FolderParts, ReplicaFollowsBitForBitWithTheSingleProcessHash) {
  TempDir dir;
  auto store = OpenDirStore(dir.path() + "/bucket");
  auto single = OpenDirStore(dir.path() + "/single");
  auto reference = Publisher::Open(single, Options());
  ASSERT_TRUE(reference.ok());
  std::unique_ptr<Replica> replica = Replica::Create(store);
  RandomModel model(2);
  size_t files = 0;
  for (uint64_t v = 1; v <= 5; ++v) {
    if (v > 1) model.Step(0.03);
    const std::string config = v < 4 ? "{\"v\": 1}" : "{\"v\": 4}";
    HfFolder folder = WriteFolder(dir.path() + "/ckpt-" + std::to_string(v), model, config);
    Result<FolderPartsStats> stats = PublishFolderParts(store, v, folder, Options());
    ASSERT_TRUE(stats.ok()) << "version " << v << ": " << stats.status().ToString();
    EXPECT_EQ(stats->parts, folder.shards.size());
    files = folder.shards.size();
    EXPECT_EQ(stats->stats.wrote_delta, v > 1);
    EXPECT_EQ(stats->stats.wrote_anchor, v % 2 == 0 || v == 1);
    Result<PublishStats> ref = (*reference)->Publish(v, model.Views());
    ASSERT_TRUE(ref.ok());
    EXPECT_EQ(stats->stats.state_hash, ref->state_hash) << "version " << v;

    ASSERT_TRUE(replica->Update(v).ok()) << "version " << v;
    EXPECT_EQ(replica->state_hash(), ref->state_hash);
    for (const WeightState::Tensor& t : (*reference)->state().tensors()) {
      const WeightState::Tensor* got = replica->state().Find(t.name);
      ASSERT_NE(got, nullptr) << t.name;
      EXPECT_EQ(got->data, t.data) << "version " << v << ": " << t.name;
    }
  }
  Manifest m = ReadManifest(*store);
  EXPECT_EQ(m.Latest()->parts.size(), files);
  ASSERT_TRUE(m.Find(1)->files.has_value());
  EXPECT_FALSE(m.Find(2)->files.has_value()) << "unchanged side files are inherited";
  ASSERT_TRUE(m.Find(4)->files.has_value()) << "config.json changed at version 4";
  Result<std::vector<SideFile>> side = FetchSideFiles(*store, m.FilesAt(5), "version 5");
  ASSERT_TRUE(side.ok());
  bool saw_config = false;
  for (const SideFile& f : *side) {
    if (f.name == "config.json") {
      saw_config = true;
      EXPECT_EQ(std::string(f.bytes.bytes().begin(), f.bytes.bytes().end()), "{\"v\": 4}");
    }
  }
  EXPECT_TRUE(saw_config);
}

TEST(FolderParts, APartThatFailsCommitsNothingAndTheNextPublishWorks) {
  TempDir dir;
  auto base = OpenDirStore(dir.path() + "/bucket");
  auto faulty = std::make_shared<FaultStore>(base);
  RandomModel model(3);
  for (uint64_t v = 1; v <= 2; ++v) {
    if (v > 1) model.Step(0.03);
    HfFolder folder = WriteFolder(dir.path() + "/ckpt-" + std::to_string(v), model, "{}");
    ASSERT_TRUE(PublishFolderParts(faulty, v, folder, Options()).ok());
  }
  model.Step(0.03);
  HfFolder folder = WriteFolder(dir.path() + "/ckpt-3", model, "{}");
  faulty->fail_write = [](std::string_view key) {
    return key.find("step_000003") != std::string_view::npos && key.find("part_00001_") != std::string_view::npos
               ? Status::IOError("injected: cannot write " + std::string(key))
               : Status::OK();
  };
  Result<FolderPartsStats> failed = PublishFolderParts(faulty, 3, folder, Options());
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("part 1 ("), std::string::npos) << failed.status().ToString();
  EXPECT_NE(failed.status().message().find(folder.shards[1].label()), std::string::npos) << failed.status().ToString();
  EXPECT_EQ(ReadManifest(*base).Latest()->version, 2u);

  faulty->fail_write = nullptr;
  ASSERT_TRUE(PublishFolderParts(faulty, 3, folder, Options()).ok());
  std::unique_ptr<Replica> replica = Replica::Create(base);
  ASSERT_TRUE(replica->Update(3).ok());
  for (const TensorView& t : model.Views()) {
    if (t.dtype != DType::kBF16) continue;
    const WeightState::Tensor* got = replica->state().Find(t.name);
    ASSERT_NE(got, nullptr);
    EXPECT_TRUE(std::equal(t.data.begin(), t.data.end(), got->data.begin(), got->data.end())) << t.name;
  }
}

TEST(FolderParts, OpenAllRebuildsWhatOpenRebuildsPerPart) {
  TempDir dir;
  auto store = OpenDirStore(dir.path() + "/bucket");
  RandomModel model(4);
  HfFolder folder;
  for (uint64_t v = 1; v <= 3; ++v) {
    if (v > 1) model.Step(0.03);
    folder = WriteFolder(dir.path() + "/ckpt-" + std::to_string(v), model, "{}");
    ASSERT_TRUE(PublishFolderParts(store, v, folder, Options()).ok());
  }
  Result<FolderLayout> fl = MakeFolderLayout(folder, Options());
  ASSERT_TRUE(fl.ok());
  auto all = PartPublisher::OpenAll(store, fl->layout, Options());
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), fl->layout.parts.size());
  for (uint32_t p = 0; p < all->size(); ++p) {
    auto one = PartPublisher::Open(store, fl->layout, p, Options());
    ASSERT_TRUE(one.ok());
    const PartPublisher& a = *(*all)[p];
    EXPECT_EQ(a.latest_version(), 3u);
    EXPECT_EQ(a.latest_version(), (*one)->latest_version());
    EXPECT_EQ(a.part_hash(), (*one)->part_hash()) << "part " << p;
    EXPECT_EQ(a.state().tensors().size(), (*one)->state().tensors().size());
    for (const WeightState::Tensor& t : (*one)->state().tensors()) {
      ASSERT_NE(a.state().Find(t.name), nullptr);
      EXPECT_EQ(a.state().Find(t.name)->data, t.data) << t.name;
    }
  }
}

}  // namespace
}  // namespace deltasync
