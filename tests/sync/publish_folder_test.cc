// Publisher::PublishFolder (one process, no parts) refuses a folder whose
// weight files changed after they were read: a trainer saving into the
// folder being published would otherwise commit one version mixing two
// checkpoints, which every replica would verify and serve. Nothing of the
// version is committed, the publisher keeps its state, and the folder read
// again publishes bit for bit (every encoding).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "deltasync/hf_folder.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/state_hash.h"
#include "testing/bucket_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::OpenDirStore;
using testing::RandomModel;
using testing::TempDir;

// The model written as a folder of several shards (about 10 kB each).
void WriteFolder(const std::string& dir, const RandomModel& model) {
  HfWriteOptions options;
  options.max_shard_bytes = 10'000;
  options.replace = true;  // the next save swaps the whole folder in
  Status written = WriteHfFolder(dir, model.Views(), {}, options);
  ASSERT_TRUE(written.ok()) << written.ToString();
}

class PublishFolderChanged : public ::testing::TestWithParam<IndexEncoding> {};

TEST_P(PublishFolderChanged, AFolderSavedIntoAfterItsReadIsNotPublished) {
  TempDir dir;
  auto store = OpenDirStore(dir.path() + "/bucket");
  PublisherOptions options;
  options.encoding = GetParam();
  options.anchor_interval = 4;
  options.threads = 2;
  auto publisher = Publisher::Open(store, options);
  ASSERT_TRUE(publisher.ok()) << publisher.status().ToString();
  const std::string ckpt = dir.path() + "/ckpt";
  RandomModel model(7);
  WriteFolder(ckpt, model);
  Result<HfFolder> first = ReadHfFolder(ckpt);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_GE(first->shards.size(), 3u);
  ASSERT_TRUE((*publisher)->PublishFolder(1, *first).ok());
  const StateHash v1 = HashState((*publisher)->state());
  Result<std::vector<std::string>> objects = store->List("");
  ASSERT_TRUE(objects.ok()) << objects.status().ToString();

  // Version 2 read, then the trainer's next save lands in the folder before
  // the publish commits (the read shards are mapped: the save replaces them).
  model.Step(0.05);
  WriteFolder(ckpt, model);
  Result<HfFolder> read = ReadHfFolder(ckpt);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  model.Step(0.05);
  WriteFolder(ckpt, model);
  Result<PublishStats> mixed = (*publisher)->PublishFolder(2, *read);
  ASSERT_FALSE(mixed.ok()) << "a folder saved into while read was published";
  EXPECT_EQ(mixed.status().code(), ErrorCode::kFailedPrecondition) << mixed.status().ToString();
  EXPECT_NE(mixed.status().message().find("changed while"), std::string::npos) << mixed.status().ToString();
  EXPECT_NE(mixed.status().message().find("version 2 not published"), std::string::npos)
      << mixed.status().ToString();
  EXPECT_EQ((*publisher)->latest_version(), 1u);
  EXPECT_EQ(HashState((*publisher)->state()), v1) << "the refused version left the publisher's state changed";
  EXPECT_EQ(testing::ReadManifest(*store).Latest()->version, 1u);
  // Checked before anything of the weights was uploaded (with gap_delta on
  // two threads, before the deferred state hash started).
  Result<std::vector<std::string>> after = store->List("");
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(*after, *objects) << "the refused version uploaded objects";

  // Read again, the folder publishes, and a replica follows it bit for bit.
  Result<HfFolder> again = ReadHfFolder(ckpt);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  Result<PublishStats> published = (*publisher)->PublishFolder(2, *again);
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  std::unique_ptr<Replica> replica = Replica::Create(store);
  ASSERT_TRUE(replica->Update(2).ok());
  EXPECT_EQ(replica->state_hash(), published->state_hash);
  const std::vector<TensorView> views = model.Views();
  for (const TensorView& t : views) {
    const WeightState::Tensor* got = replica->state().Find(t.name);
    ASSERT_NE(got, nullptr) << t.name;
    if (t.dtype == DType::kBF16) {
      ASSERT_EQ(got->data.size(), t.data.size()) << t.name;
      EXPECT_TRUE(std::equal(t.data.begin(), t.data.end(), got->data.begin())) << t.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Encodings, PublishFolderChanged,
                         testing::AllEncodings(), testing::EncodingParamName);

}  // namespace
}  // namespace deltasync
