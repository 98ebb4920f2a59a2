// The life of an RL run around a bucket: a trainer restarted while its
// zombie (the old process, with a stale view of the bucket) still publishes.
#include <gtest/gtest.h>

#include "deltasync/manifest.h"
#include "deltasync/part_publisher.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/state_hash.h"
#include "testing/bucket_util.h"
#include "testing/fault_store.h"
#include "testing/parts_util.h"
#include "testing/random_model.h"
#include "testing/s3_test_env.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::OpenDirStore;
using testing::RandomModel;
using testing::TempDir;

// The state is the trainer's weights (names, shapes, dtypes and bytes), by
// their 128-bit state hash computed from the trainer's own tensors.
void ExpectStateIs(const WeightState& state, const RandomModel& model) {
  std::vector<TensorView> views = model.Views();
  EXPECT_EQ(HashState(state), HashTensors(views));
}

// The zombie's view of the bucket stops at version 3; the restarted trainer
// has committed 4..10 (10 an anchor). The zombie's next publishes (4, and
// 10) use the keys of those committed versions: they must fail before any
// upload, so that replicas still reach the trainer's weights through the
// step deltas (a replica at 3) and through the anchor (a new replica).
void StalePublisherNeverOverwritesCommittedVersions(std::shared_ptr<Store> store, IndexEncoding encoding) {
  PublisherOptions options;
  options.encoding = encoding;
  RandomModel trainer(21);
  RandomModel zombie_weights(21);
  auto zombie = Publisher::Open(store, options);
  ASSERT_TRUE(zombie.ok()) << zombie.status().ToString();
  for (uint64_t v = 1; v <= 3; ++v) {
    if (v > 1) {
      trainer.Step(0.05);
      zombie_weights.Step(0.05);
    }
    ASSERT_TRUE((*zombie)->Publish(v, trainer.Views()).ok());
  }
  auto follower = Replica::Create(store);
  ASSERT_TRUE(follower->Update().ok());
  ASSERT_EQ(follower->version(), 3u);

  auto restarted = Publisher::Open(store, options);
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  for (uint64_t v = 4; v <= 10; ++v) {
    trainer.Step(0.05);
    ASSERT_TRUE((*restarted)->Publish(v, trainer.Views()).ok()) << v;
  }
  ASSERT_TRUE(testing::ReadManifest(*store).Find(10)->anchor());

  for (uint64_t v : {4u, 10u}) {
    zombie_weights.Step(0.2);
    auto lost = (*zombie)->Publish(v, zombie_weights.Views());
    ASSERT_FALSE(lost.ok()) << "the zombie published version " << v;
    EXPECT_EQ(lost.status().code(), ErrorCode::kConflict) << lost.status().ToString();
    EXPECT_NE(lost.status().message().find("nothing of it was uploaded"), std::string::npos)
        << lost.status().ToString();
  }

  ASSERT_TRUE(follower->Update().ok()) << "a replica at 3 must reach 10 through the step deltas";
  EXPECT_EQ(follower->version(), 10u);
  ExpectStateIs(follower->state(), trainer);
  auto fresh = Replica::Create(store);
  auto started = fresh->Update();
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  ExpectStateIs(fresh->state(), trainer);

  // The restarted trainer goes on, unaffected.
  trainer.Step(0.05);
  ASSERT_TRUE((*restarted)->Publish(11, trainer.Views()).ok());
  ASSERT_TRUE(follower->Update().ok());
  ExpectStateIs(follower->state(), trainer);
}

class ZombiePublisherTest : public ::testing::TestWithParam<IndexEncoding> {};

TEST_P(ZombiePublisherTest, StalePublisherNeverOverwritesCommittedVersions) {
  TempDir dir;
  StalePublisherNeverOverwritesCommittedVersions(OpenDirStore(dir.path()), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Encodings, ZombiePublisherTest, testing::AllEncodings(), testing::EncodingParamName);

// S3's conditional writes (ETags) instead of the local store's content tokens.
std::shared_ptr<Store> S3BucketOrSkip(std::string_view tag) {
  std::optional<testing::S3TestServer> server = testing::FindS3TestServer();
  if (!server) return nullptr;
  return testing::MakeTestBucket(*server, testing::S3TestOptions(*server), tag, "run");
}

TEST(ZombiePublisherS3Test, StalePublisherNeverOverwritesCommittedVersions) {
  std::shared_ptr<Store> s3 = S3BucketOrSkip("zombie");
  if (!s3) GTEST_SKIP() << testing::kNoS3Reason;
  StalePublisherNeverOverwritesCommittedVersions(s3, IndexEncoding::kCompact);
}

// The same with sharded jobs: the zombie job's ranks hold version 3; the
// restarted job has committed 4 (its part objects are keyed by version, base
// and part, the zombie's too). The zombie's parts must upload nothing.
void StalePartedJobNeverOverwritesCommittedParts(std::shared_ptr<Store> store) {
  RandomModel trainer(23);
  RandomModel zombie_weights(23);
  PublisherOptions options;
  options.threads = 2;
  PartLayout layout = testing::SplitLayout(trainer.Views(), 3, 0);
  ASSERT_TRUE(layout.Validate().ok());
  testing::Ranks zombie(store, layout, options);
  for (uint64_t v = 1; v <= 3; ++v) {
    if (v > 1) {
      trainer.Step(0.05);
      zombie_weights.Step(0.05);
    }
    ASSERT_TRUE(zombie.Publish(v, trainer.Views()).ok());
  }
  auto follower = Replica::Create(store);
  ASSERT_TRUE(follower->Update().ok());
  testing::Ranks restarted(store, layout, options);
  for (uint64_t v = 4; v <= 5; ++v) {
    trainer.Step(0.05);
    ASSERT_TRUE(restarted.Publish(v, trainer.Views()).ok()) << v;
  }
  zombie_weights.Step(0.2);
  auto lost = zombie.Publish(4, zombie_weights.Views());
  ASSERT_FALSE(lost.ok()) << "the zombie job published version 4";
  EXPECT_NE(lost.status().message().find("nothing of it was uploaded"), std::string::npos) << lost.status().ToString();
  auto caught_up = follower->Update();
  ASSERT_TRUE(caught_up.ok()) << caught_up.status().ToString();
  EXPECT_EQ(follower->version(), 5u);
  ExpectStateIs(follower->state(), trainer);
}

TEST(ZombiePartedJobTest, StalePartedJobNeverOverwritesCommittedParts) {
  TempDir dir;
  StalePartedJobNeverOverwritesCommittedParts(OpenDirStore(dir.path()));
}

TEST(ZombiePartedJobS3Test, StalePartedJobNeverOverwritesCommittedParts) {
  std::shared_ptr<Store> s3 = S3BucketOrSkip("zombieparts");
  if (!s3) GTEST_SKIP() << testing::kNoS3Reason;
  StalePartedJobNeverOverwritesCommittedParts(s3);
}

// Counts whole reads (Get, GetVersioned) of manifest.json; a Token (a HEAD
// on S3) is not one.
class ManifestReadCounter : public testing::FaultStore {
 public:
  using FaultStore::FaultStore;
  Result<Blob> Get(std::string_view key) override {
    if (key == kManifestKey) ++reads;
    return FaultStore::Get(key);
  }
  Result<Versioned> GetVersioned(std::string_view key) override {
    if (key == kManifestKey) ++reads;
    return FaultStore::GetVersioned(key);
  }
  int reads = 0;
};

// The ranks' check for another job's commit costs a HEAD while the manifest
// is the one their committer wrote, not a read of the whole manifest on
// every rank for every version; once it moved (another job), they read it
// and refuse.
TEST(PartedJobCheckTest, RanksReadTheManifestOnlyWhenItMovedSinceTheirCommit) {
  TempDir dir;
  std::shared_ptr<Store> store = OpenDirStore(dir.path());
  RandomModel trainer(29);
  PublisherOptions options;
  options.threads = 2;
  PartLayout layout = testing::SplitLayout(trainer.Views(), 3, 0);
  ASSERT_TRUE(layout.Validate().ok());
  std::vector<std::shared_ptr<ManifestReadCounter>> counters;
  std::vector<std::shared_ptr<Store>> part_stores;
  for (size_t p = 0; p < layout.parts.size(); ++p) {
    counters.push_back(std::make_shared<ManifestReadCounter>(store));
    part_stores.push_back(counters.back());
  }
  testing::Ranks job(store, layout, options, part_stores);
  ASSERT_TRUE(job.Publish(1, trainer.Views()).ok());
  for (uint64_t v = 2; v <= 5; ++v) {
    trainer.Step(0.05);
    for (auto& c : counters) c->reads = 0;
    ASSERT_TRUE(job.Publish(v, trainer.Views()).ok()) << v;
    for (size_t p = 0; p < counters.size(); ++p) EXPECT_EQ(counters[p]->reads, 0) << "part " << p << ", version " << v;
  }
  // Another job commits 6: the ranks' next check reads the manifest and refuses.
  testing::Ranks other(store, layout, options);
  trainer.Step(0.05);
  ASSERT_TRUE(other.Publish(6, trainer.Views()).ok());
  for (auto& c : counters) c->reads = 0;
  RandomModel zombie_weights(29);
  zombie_weights.Step(0.2);
  auto lost = job.Publish(6, zombie_weights.Views());
  ASSERT_FALSE(lost.ok()) << "a stale job published version 6";
  EXPECT_NE(lost.status().message().find("nothing of it was uploaded"), std::string::npos) << lost.status().ToString();
  EXPECT_GE(counters[0]->reads, 1);
  auto follower = Replica::Create(store);
  ASSERT_TRUE(follower->Update().ok());
  EXPECT_EQ(follower->version(), 6u);
  ExpectStateIs(follower->state(), trainer);
}

// Not a zombie: this publisher's own commit landed although the store
// reported a failure (an answer lost after the write). The manifest then
// lists its version under its own writer id; publishing that version again
// with the same weights is recognised as its own commit (as before the
// pre-upload check), and the publisher goes on.
TEST(ZombieOwnCommitTest, OwnCommitThatReportedAFailureIsNotAnotherPublisher) {
  TempDir dir;
  auto faulty = std::make_shared<testing::FaultStore>(OpenDirStore(dir.path()));
  auto pub = Publisher::Open(faulty);
  ASSERT_TRUE(pub.ok());
  RandomModel model(25);
  ASSERT_TRUE((*pub)->Publish(1, model.Views()).ok());
  model.Step(0.05);
  faulty->fail_after_conditional_write = [](std::string_view) {
    return Status::IOError("injected: the answer to a landed manifest write was lost");
  };
  ASSERT_FALSE((*pub)->Publish(2, model.Views()).ok());
  faulty->fail_after_conditional_write = nullptr;
  ASSERT_EQ(testing::ReadManifest(*faulty).Latest()->version, 2u) << "the write landed";
  auto again = (*pub)->Publish(2, model.Views());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  model.Step(0.05);
  ASSERT_TRUE((*pub)->Publish(3, model.Views()).ok());
  auto replica = Replica::Create(faulty);
  ASSERT_TRUE(replica->Update().ok());
  ExpectStateIs(replica->state(), model);
}

}  // namespace
}  // namespace deltasync
