// Session 48's adversarial review of a replica's catch-up: buckets that lie
// or change under a replica (replaced, rolled back, pruned mid catch-up,
// an anchor gone). Bit-exact or loud: the replica either holds the
// manifest's state for its version or says why not, and keeps its last
// verified version on every failure.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/retention.h"
#include "testing/bucket_util.h"
#include "testing/fault_store.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

namespace fs = std::filesystem;
using testing::FaultStore;
using testing::OpenDirStore;
using testing::RandomModel;
using testing::ReadManifest;
using testing::TempDir;

// Publishes versions 1..last of a model seeded `seed` into `dir`; returns
// each version's state hash.
std::map<uint64_t, StateHash> PublishModel(const std::string& dir, uint64_t seed, uint64_t last,
                                           PublisherOptions options = {}) {
  std::map<uint64_t, StateHash> hashes;
  auto pub = Publisher::Open(OpenDirStore(dir), std::move(options));
  EXPECT_TRUE(pub.ok()) << pub.status().ToString();
  if (!pub.ok()) return hashes;
  RandomModel model(seed);
  for (uint64_t v = 1; v <= last; ++v) {
    if (v > 1) model.Step(0.05);
    auto stats = (*pub)->Publish(v, model.Views());
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    if (stats.ok()) hashes[v] = stats->state_hash;
  }
  return hashes;
}

// Replaces every file of bucket folder `dir` with those of `from` (another
// trainer's bucket put in its place, or one restored from an old backup).
void ReplaceBucket(const std::string& dir, const std::string& from) {
  fs::remove_all(dir);
  fs::copy(from, dir, fs::copy_options::recursive);
}

struct ReplacedBucket {
  TempDir tmp;
  std::string bucket = tmp.Sub("bucket");
  std::shared_ptr<Store> store = OpenDirStore(bucket);
  std::map<uint64_t, StateHash> first = PublishModel(bucket, 7, 3);
};

// A bucket replaced by another one whose newest version has the held number:
// the held weights are not that version's, and Update() must not answer
// "up to date".
TEST(ReplicaReviewTest, ABucketReplacedAtTheHeldVersionIsRefused) {
  ReplacedBucket b;
  auto replica = Replica::Create(b.store);
  ASSERT_TRUE(replica->Update().ok());
  ASSERT_EQ(replica->version(), 3u);
  ASSERT_EQ(replica->state_hash(), b.first[3]);

  std::map<uint64_t, StateHash> other = PublishModel(b.tmp.Sub("other"), 8, 3);
  ASSERT_NE(other[3], b.first[3]);
  ReplaceBucket(b.bucket, b.tmp.Sub("other"));

  Result<UpdateStats> updated = replica->Update();
  ASSERT_FALSE(updated.ok()) << "a replica holding another bucket's version 3 claimed to be up to date";
  EXPECT_EQ(updated.status().code(), ErrorCode::kIntegrity) << updated.status().ToString();
  EXPECT_NE(updated.status().message().find("version 3"), std::string::npos) << updated.status().message();
  EXPECT_EQ(replica->Refresh().code(), ErrorCode::kIntegrity);
  // Still the last verified state, untouched.
  EXPECT_EQ(replica->version(), 3u);
  EXPECT_EQ(replica->state_hash(), b.first[3]);
  EXPECT_EQ(HashState(replica->state()), b.first[3]);
  EXPECT_TRUE(replica->bad_objects().empty()) << "the new bucket's objects are not to blame";
}

// The same with newer versions in the replacement: its deltas must not be
// applied onto the old bucket's state, nor blamed for not fitting it.
TEST(ReplicaReviewTest, ABucketReplacedWithNewerVersionsIsRefusedWithoutBlamingItsObjects) {
  ReplacedBucket b;
  auto replica = Replica::Create(b.store);
  ASSERT_TRUE(replica->Update().ok());
  PublishModel(b.tmp.Sub("other"), 8, 5);
  ReplaceBucket(b.bucket, b.tmp.Sub("other"));

  Result<UpdateStats> updated = replica->Update();
  ASSERT_FALSE(updated.ok());
  EXPECT_EQ(updated.status().code(), ErrorCode::kIntegrity) << updated.status().ToString();
  EXPECT_EQ(replica->version(), 3u);
  EXPECT_EQ(HashState(replica->state()), b.first[3]);
  EXPECT_TRUE(replica->bad_objects().empty()) << updated.status().ToString();
}

// Rolled back: the newest listed version is below the held one.
TEST(ReplicaReviewTest, AManifestThatGoesBackwardsIsRefused) {
  ReplacedBucket b;
  auto replica = Replica::Create(b.store);
  ASSERT_TRUE(replica->Update().ok());
  PublishModel(b.tmp.Sub("old"), 7, 2);  // the same trainer, an older backup
  ReplaceBucket(b.bucket, b.tmp.Sub("old"));

  Result<UpdateStats> updated = replica->Update();
  ASSERT_FALSE(updated.ok());
  EXPECT_EQ(updated.status().code(), ErrorCode::kIntegrity) << updated.status().ToString();
  EXPECT_NE(updated.status().message().find("rolled back"), std::string::npos) << updated.status().message();
  EXPECT_EQ(replica->version(), 3u);
  EXPECT_EQ(HashState(replica->state()), b.first[3]);
}

// A fresh replica with a bucket whose same-numbered versions are identical
// (a bucket copied elsewhere, same trainer): nothing to refuse.
TEST(ReplicaReviewTest, AnIdenticalCopyOfTheBucketIsFollowedOn) {
  ReplacedBucket b;
  auto replica = Replica::Create(b.store);
  ASSERT_TRUE(replica->Update(2).ok());
  std::map<uint64_t, StateHash> again = PublishModel(b.tmp.Sub("copy"), 7, 4);
  ASSERT_EQ(again[3], b.first[3]);
  ReplaceBucket(b.bucket, b.tmp.Sub("copy"));
  Result<UpdateStats> updated = replica->Update();
  ASSERT_TRUE(updated.ok()) << updated.status().ToString();
  EXPECT_EQ(replica->version(), 4u);
  EXPECT_EQ(HashState(replica->state()), again[4]);
}

// gc runs between the replica's manifest read and its download of the next
// delta: the delta is gone (kNotFound); the replica routes through the
// anchor gc kept, in the same update, and reaches the target exactly.
TEST(ReplicaReviewTest, ADeltaPrunedMidCatchUpIsRoutedAroundThroughTheKeptAnchor) {
  TempDir tmp;
  PublisherOptions options;
  options.anchor_interval = 4;  // anchors 1, 4, 8
  std::map<uint64_t, StateHash> hashes = PublishModel(tmp.path(), 11, 10, options);
  auto base = OpenDirStore(tmp.path());
  auto store = std::make_shared<FaultStore>(base);
  auto replica = Replica::Create(store);
  ASSERT_TRUE(replica->Update(2).ok());

  bool pruned = false;
  store->fail_read = [&](std::string_view key) {
    if (!pruned && key != kManifestKey) {
      pruned = true;
      Result<PruneStats> stats = PruneVersions(*base, 1);  // keeps anchor 8 and on
      EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    }
    return Status::OK();
  };
  Result<UpdateStats> updated = replica->Update(10);
  ASSERT_TRUE(pruned);
  ASSERT_TRUE(updated.ok()) << updated.status().ToString();
  EXPECT_EQ(replica->version(), 10u);
  EXPECT_EQ(replica->state_hash(), hashes[10]);
  EXPECT_EQ(HashState(replica->state()), hashes[10]);
  EXPECT_EQ(updated->anchors_applied, 1u);
  ASSERT_EQ(replica->bad_objects().size(), 1u);
  EXPECT_EQ(replica->bad_objects()[0].code, ErrorCode::kNotFound);
  // The next manifest no longer lists it: forgotten.
  ASSERT_TRUE(replica->Refresh().ok());
  EXPECT_TRUE(replica->bad_objects().empty());
}

// The anchor of the only chain is missing while its deltas are there: a new
// replica fails naming it, holding nothing; one already past it is not
// affected.
TEST(ReplicaReviewTest, AMissingAnchorWithItsDeltasPresentFailsLoudly) {
  TempDir tmp;
  std::map<uint64_t, StateHash> hashes = PublishModel(tmp.path(), 12, 3);
  auto store = OpenDirStore(tmp.path());
  auto ahead = Replica::Create(store);
  ASSERT_TRUE(ahead->Update(2).ok());
  const Manifest manifest = ReadManifest(*store);
  const VersionEntry* first = manifest.Find(1);
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(first->anchor());
  const std::string anchor_key = first->anchor()->key;
  ASSERT_TRUE(store->Delete(anchor_key).ok());

  auto fresh = Replica::Create(store);
  Result<UpdateStats> updated = fresh->Update();
  ASSERT_FALSE(updated.ok());
  EXPECT_EQ(updated.status().code(), ErrorCode::kNotFound) << updated.status().ToString();
  EXPECT_NE(updated.status().message().find(anchor_key), std::string::npos) << updated.status().message();
  EXPECT_EQ(fresh->version(), 0u);

  Result<UpdateStats> moved = ahead->Update();
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_EQ(HashState(ahead->state()), hashes[3]);
}

}  // namespace
}  // namespace deltasync
