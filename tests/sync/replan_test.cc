// Replica::Update routes around damaged and missing objects: it remembers
// them (bad_objects), plans again from the version it reached, and gives up
// only when no route is left, naming the objects that block it. Damage is
// made the way the bucket contract allows: a damaged copy renamed over the
// object, never an edit in place.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "testing/bucket_util.h"
#include "testing/fault_store.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::OpenDirStore;
using testing::RandomModel;
using testing::ReadManifest;
using testing::TempDir;

// A local bucket with a publisher and the state hash of every version.
struct Bucket {
  explicit Bucket(PublisherOptions options) : store(OpenDirStore(tmp.Sub("bucket"))), options(std::move(options)) {}

  void PublishRange(uint64_t from, uint64_t to) {
    if (!publisher) {
      auto p = Publisher::Open(store, options);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      publisher = std::move(*p);
    }
    for (uint64_t v = from; v <= to; ++v) {
      if (v > 1) model.Step(0.05);
      auto stats = publisher->Publish(v, model.Views());
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
      hashes[v] = stats->state_hash;
    }
  }

  // One byte flipped, in a copy renamed over the object.
  void Flip(const std::string& key) {
    const std::string path = tmp.Sub("bucket") + "/" + key;
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(bytes.size(), 100u) << path;
    bytes[bytes.size() - 7] ^= 0x40;
    const std::string copy = tmp.Sub("damaged");
    std::ofstream(copy, std::ios::binary) << bytes;
    std::filesystem::rename(copy, path);
  }

  const ObjectEntry& Object(uint64_t version, std::optional<uint64_t> base) {
    static ObjectEntry none;
    manifest = ReadManifest(*store);
    for (const ObjectEntry& o : manifest.Find(version)->objects) {
      if (o.base_version == base) return o;
    }
    ADD_FAILURE() << "no such object at version " << version;
    return none;
  }

  TempDir tmp;
  std::shared_ptr<Store> store;
  PublisherOptions options;
  std::unique_ptr<Publisher> publisher;
  RandomModel model{5};
  std::map<uint64_t, StateHash> hashes;
  Manifest manifest;
};

PublisherOptions Cumulative4() {
  PublisherOptions options;
  options.anchor_interval = 100;
  options.cumulative_interval = 4;
  return options;
}

TEST(ReplanTest, ADamagedCumulativeDeltaIsRoutedAroundThroughTheSteps) {
  Bucket b(Cumulative4());
  b.PublishRange(1, 9);
  const ObjectEntry cumulative = b.Object(9, 1);  // the cheapest route from nothing
  b.Flip(cumulative.key);

  auto replica = Replica::Create(b.store);
  Result<UpdateStats> stats = replica->Update(9);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(replica->version(), 9u);
  EXPECT_EQ(replica->state_hash(), b.hashes[9]);
  EXPECT_EQ(HashState(replica->state()), b.hashes[9]);
  ASSERT_EQ(replica->bad_objects().size(), 1u);
  const BadObject& bad = replica->bad_objects()[0];
  EXPECT_EQ(bad.key, cumulative.key);
  EXPECT_EQ(bad.xxh3_128, cumulative.xxh3_128);
  EXPECT_EQ(bad.version, 9u);
  EXPECT_EQ(bad.code, ErrorCode::kIntegrity);
  EXPECT_NE(bad.reason.find("xxh3"), std::string::npos) << bad.reason;

  // Remembered while the manifest lists it (also across a publish), so a
  // second replica's route is not needed to find out again.
  b.PublishRange(10, 10);
  ASSERT_TRUE(replica->Update().ok());
  EXPECT_EQ(replica->version(), 10u);
  ASSERT_EQ(replica->bad_objects().size(), 1u);
  EXPECT_EQ(replica->bad_objects()[0].key, cumulative.key);
}

TEST(ReplanTest, AReopenedPublisherRebuildsAroundADamagedCumulativeDelta) {
  Bucket b(Cumulative4());
  b.PublishRange(1, 9);
  b.Flip(b.Object(9, 1).key);
  // A restarted trainer: Publisher::Open rebuilds 9 through a Replica.
  b.publisher.reset();
  b.PublishRange(10, 10);
  auto replica = Replica::Create(b.store);
  ASSERT_TRUE(replica->Update(10).ok());
  EXPECT_EQ(replica->state_hash(), b.hashes[10]);
  EXPECT_EQ(HashState(replica->state()), HashTensors(b.model.Views()));
}

TEST(ReplanTest, AHeldReplicaPastADeletedDeltaReachesTheNextAnchor) {
  PublisherOptions options;
  options.anchor_interval = 10;  // anchors at 1 and 10
  Bucket b(options);
  b.PublishRange(1, 4);
  auto replica = Replica::Create(b.store);
  ASSERT_TRUE(replica->Update().ok());
  ASSERT_EQ(replica->version(), 4u);
  b.PublishRange(5, 5);
  const std::string delta5 = b.Object(5, 4).key;
  ASSERT_TRUE(b.store->Delete(delta5).ok());

  // No route to 5: the error names the object and what blocks; 4 is kept.
  Result<UpdateStats> stuck = replica->Update();
  ASSERT_FALSE(stuck.ok());
  EXPECT_EQ(stuck.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(stuck.status().message().find("no route to version 5"), std::string::npos) << stuck.status().ToString();
  EXPECT_NE(stuck.status().message().find(delta5 + " (version 5: not found)"), std::string::npos)
      << stuck.status().ToString();
  EXPECT_EQ(replica->version(), 4u);
  EXPECT_EQ(replica->state_hash(), b.hashes[4]);
  ASSERT_EQ(replica->bad_objects().size(), 1u);

  // Anchor 10, then 11 and 12: the same replica gets there.
  b.PublishRange(6, 12);
  Result<UpdateStats> stats = replica->Update();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(replica->version(), 12u);
  EXPECT_EQ(HashState(replica->state()), b.hashes[12]);
  EXPECT_EQ(stats->anchors_applied, 1u);
  EXPECT_EQ(stats->deltas_applied, 2u);
}

TEST(ReplanTest, AStoreFailureIsNotABadObject) {
  Bucket b(Cumulative4());
  b.PublishRange(1, 9);
  const std::string cumulative = b.Object(9, 1).key;
  auto faulty = std::make_shared<testing::FaultStore>(b.store);
  faulty->fail_read = [&](std::string_view key) {
    return key == cumulative ? Status::IOError("injected: connection reset") : Status::OK();
  };
  auto replica = Replica::Create(faulty);
  Result<UpdateStats> stats = replica->Update(9);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), ErrorCode::kIOError);
  EXPECT_TRUE(replica->bad_objects().empty());
  EXPECT_EQ(replica->version(), 1u);  // the anchor, verified, is kept
  faulty->fail_read = nullptr;
  ASSERT_TRUE(replica->Update(9).ok());
  EXPECT_EQ(replica->state_hash(), b.hashes[9]);
}

TEST(ReplanTest, ABadObjectIsNotFetchedAgainWhileListed) {
  PublisherOptions options;
  options.anchor_interval = 100;
  Bucket b(options);
  b.PublishRange(1, 3);
  auto counting = std::make_shared<testing::FaultStore>(b.store);
  std::map<std::string, int> reads;
  counting->fail_read = [&](std::string_view key) {
    ++reads[std::string(key)];
    return Status::OK();
  };
  auto replica = Replica::Create(counting);
  ASSERT_TRUE(replica->Update().ok());
  b.PublishRange(4, 4);
  const std::string delta4 = b.Object(4, 3).key;
  b.Flip(delta4);
  for (int poll = 0; poll < 3; ++poll) {
    Result<UpdateStats> s = replica->Update();
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), ErrorCode::kIntegrity) << s.status().ToString();
    EXPECT_NE(s.status().message().find(delta4), std::string::npos) << s.status().ToString();
  }
  EXPECT_EQ(reads[delta4], 1);
  EXPECT_EQ(replica->bad_objects().size(), 1u);
  EXPECT_EQ(replica->version(), 3u);
  // Forgotten once the manifest stops listing it: here, a bucket whose
  // manifest lists version 4 with other content (the key republished).
  Manifest m = ReadManifest(*b.store);
  for (ObjectEntry& o : m.versions.back().objects) {
    if (o.key == delta4) o.xxh3_128 = std::string(32, '0');
  }
  const std::string text = m.ToJson();
  ASSERT_TRUE(b.store->Put(kManifestKey, ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size())).ok());
  ASSERT_TRUE(replica->Refresh().ok());
  EXPECT_TRUE(replica->bad_objects().empty());
}

// Routing around a bad object never takes a held replica below its version:
// the only route left (an older anchor and its cumulative delta) could fail
// in turn and leave a follower serving older weights than before.
TEST(ReplanTest, RoutingAroundNeverGoesBelowTheHeldVersion) {
  PublisherOptions options;
  options.anchor_interval = 5;     // anchors 1, 5, 10
  options.cumulative_interval = 4;  // version 9 also gets a delta from anchor 5
  Bucket b(options);
  b.PublishRange(1, 9);
  auto replica = Replica::Create(b.store);
  ASSERT_TRUE(replica->Update(7).ok());
  const std::string delta8 = b.Object(8, 7).key;
  ASSERT_FALSE(b.Object(9, 5).key.empty());
  ASSERT_TRUE(b.store->Delete(delta8).ok());

  Result<UpdateStats> stats = replica->Update(9);
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("starts from the older anchor version 5"), std::string::npos)
      << stats.status().ToString();
  EXPECT_NE(stats.status().message().find(delta8), std::string::npos) << stats.status().ToString();
  EXPECT_EQ(replica->version(), 7u);
  EXPECT_EQ(HashState(replica->state()), b.hashes[7]);

  // A later poll knows the bad object and still stays on 7.
  EXPECT_FALSE(replica->Update(9).ok());
  EXPECT_EQ(replica->version(), 7u);
  // A fresh replica (nothing held) takes that route.
  auto fresh = Replica::Create(b.store);
  ASSERT_TRUE(fresh->Update(9).ok());
  EXPECT_EQ(fresh->state_hash(), b.hashes[9]);
}

}  // namespace
}  // namespace deltasync
