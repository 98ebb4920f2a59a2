// gc and the routes through the objects it removes (retention.h, session
// 50): a kept version that a fresh replica reaches today only through a
// removed object (here a cumulative delta from a removed anchor, around a
// damaged step delta) must not be left unreachable by gc.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/retention.h"
#include "testing/bucket_util.h"
#include "testing/random_model.h"
#include "testing/s3_test_env.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::RandomModel;
using testing::ReadManifest;

// Removes the stored object, or flips one byte of it in place (same size).
void Damage(Store& store, const std::string& key, bool remove) {
  if (remove) {
    ASSERT_TRUE(store.Delete(key).ok()) << key;
    return;
  }
  Result<Blob> blob = store.Get(key);
  ASSERT_TRUE(blob.ok()) << blob.status().ToString();
  std::vector<uint8_t> bytes(blob->bytes().begin(), blob->bytes().end());
  ASSERT_GT(bytes.size(), 100u) << key;
  bytes[bytes.size() / 2] ^= 0x10;
  ASSERT_TRUE(store.Put(key, ByteSpan(bytes)).ok()) << key;
}

// Versions 1..10 of one model published twice by the real Publisher: into
// `bucket` with anchors 1, 4, 8 (interval 4) and step deltas, and into a
// second bucket with one anchor (1) and a cumulative delta 1 -> 10
// (cumulative interval 9). That delta is copied into `bucket` and listed on
// its version 10, as a writer that keeps cumulative deltas from an older
// anchor would (the format allows any base; the Publisher starts them at the
// last anchor). Same model, same versions: same states and hashes.
struct CrossingBucket {
  // cheap_cumulative: small steps up to 8 and large ones after, so that
  // anchor 1 + the cumulative delta is the cheaper route to 10 (fewer bytes
  // than anchor 8 and the steps 9 and 10), the one fresh replicas take;
  // otherwise even steps, and fresh replicas start at anchor 8.
  // `on`: the bucket's store (default: a local one in tmp).
  explicit CrossingBucket(bool cheap_cumulative = true, std::shared_ptr<Store> on = nullptr)
      : cumulative_cheaper(cheap_cumulative), store(on ? std::move(on) : testing::OpenDirStore(tmp.Sub("bucket"))) {
    PublisherOptions steps;
    steps.anchor_interval = 4;
    PublisherOptions cumulative;
    cumulative.anchor_interval = 100;
    cumulative.cumulative_interval = 9;
    auto other = testing::OpenDirStore(tmp.Sub("other"));
    Publish(store, steps, true);
    Publish(other, cumulative, false);
    Manifest with = ReadManifest(*store);
    const Manifest cumulative_manifest = ReadManifest(*other);
    for (const ObjectEntry& o : cumulative_manifest.Find(10)->objects) {
      if (o.kind == PatchKind::kDelta && o.base_version == 1u) cumulative_delta = o;
    }
    EXPECT_EQ(cumulative_delta.key, CumulativeDeltaKey(1, 10, IndexEncoding::kCompact));
    Result<Blob> copied = other->Get(cumulative_delta.key);
    EXPECT_TRUE(copied.ok() && store->Put(cumulative_delta.key, copied->bytes()).ok());
    for (VersionEntry& v : with.versions) {
      if (v.version == 10) v.objects.push_back(cumulative_delta);
    }
    const std::string json = with.ToJson();
    EXPECT_TRUE(store->Put(kManifestKey, ByteSpan(reinterpret_cast<const uint8_t*>(json.data()), json.size())).ok());
    step9 = with.Find(9)->delta()->key;
  }

  void Publish(const std::shared_ptr<Store>& to, const PublisherOptions& options, bool keep_hashes) {
    auto pub = Publisher::Open(to, options);
    ASSERT_TRUE(pub.ok()) << pub.status().ToString();
    RandomModel model(53);
    for (uint64_t v = 1; v <= 10; ++v) {
      if (v > 1) model.Step(!cumulative_cheaper ? 0.05 : v <= 8 ? 0.002 : 0.3);
      auto stats = (*pub)->Publish(v, model.Views());
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
      if (keep_hashes) hashes[v] = stats->state_hash;
    }
  }

  void Damage(const std::string& key, bool remove) { deltasync::Damage(*store, key, remove); }

  // A fresh replica reaches `version` bit-exactly.
  bool Reaches(uint64_t version) {
    auto replica = Replica::Create(store);
    Result<UpdateStats> updated = replica->Update(version);
    if (updated.ok()) last = *updated;
    return updated.ok() && HashState(replica->state()) == hashes[version];
  }

  const bool cumulative_cheaper;
  testing::TempDir tmp;
  std::shared_ptr<Store> store;
  std::map<uint64_t, StateHash> hashes;
  ObjectEntry cumulative_delta;
  std::string step9;
  UpdateStats last;  // of the last Reaches that reached
};

// Intact: gc --keep-anchors 1 keeps 8..10 and checks anchor 8 and the route
// to 10 (the version a removed delta leads into): anchor 8 + steps 9 and 10
// read and hashed, nothing else.
TEST(GcRoutesTest, ChecksTheRoutesToTheVersionsARemovedDeltaLeadsInto) {
  CrossingBucket b;
  ASSERT_TRUE(b.Reaches(10));
  EXPECT_EQ(b.last.anchors_applied, 1u);
  EXPECT_EQ(b.last.deltas_applied, 1u) << "anchor 1 + the cumulative delta";
  const Manifest m = ReadManifest(*b.store);
  Result<PruneStats> dry = PruneVersions(*b.store, 1, /*dry_run=*/true);
  ASSERT_TRUE(dry.ok()) << dry.status().ToString();
  EXPECT_EQ(dry->routes_checked, (std::vector<uint64_t>{8, 10}));
  EXPECT_EQ(dry->anchor_checked, 8u);
  EXPECT_EQ(dry->anchor_bytes_read, m.Find(8)->anchor()->size);
  EXPECT_EQ(dry->check_objects, 3u);
  EXPECT_EQ(dry->check_bytes_read, m.Find(8)->anchor()->size + m.Find(9)->delta()->size + m.Find(10)->delta()->size);
  Result<PruneStats> by_size = PruneVersions(*b.store, 1, /*dry_run=*/true, AnchorCheck::kSize);
  ASSERT_TRUE(by_size.ok()) << by_size.status().ToString();
  EXPECT_EQ(by_size->check_objects, 3u);
  EXPECT_EQ(by_size->check_bytes_read, 0u);
}

// Version 9's step delta damaged (flipped) or missing: 9 is lost whatever
// gc does, but 10 is reached today through anchor 1 and the cumulative delta
// 1 -> 10 (fresh replicas take that route anyway: it is the cheaper one).
// gc --keep-anchors 1 (or 2) would remove both: 10 lost. Refused, naming 10
// and the step delta; nothing changed. On a local bucket, and on S3 when an
// endpoint is configured (the check's Size and ranged reads go to the server).
class GcCutRouteTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(GcCutRouteTest, RefusesToCutTheOnlyRouteToAKeptVersion) {
  const auto [remove, on_s3] = GetParam();
  std::shared_ptr<Store> s3;
  if (on_s3) {
    std::optional<testing::S3TestServer> server = testing::FindS3TestServer();
    if (!server) GTEST_SKIP() << testing::kNoS3Reason;
    s3 = testing::MakeTestBucket(*server, testing::S3TestOptions(*server), "gcroutes", "runs/a");
    ASSERT_TRUE(s3);
  }
  CrossingBucket b(/*cheap_cumulative=*/true, s3);
  b.Damage(b.step9, remove);
  ASSERT_FALSE(b.Reaches(9));
  ASSERT_TRUE(b.Reaches(10)) << "routed around 9 through the cumulative delta before gc";
  const std::string before = ReadManifest(*b.store).ToJson();

  for (uint64_t keep : {1, 2}) {
    for (bool dry_run : {true, false}) {
      Result<PruneStats> refused = PruneVersions(*b.store, keep, dry_run);
      if (refused.ok()) {
        ADD_FAILURE() << "gc --keep-anchors " << keep << (dry_run ? " would prune" : " pruned") << " versions "
                      << refused->removed_versions.front() << "-" << refused->removed_versions.back();
        if (dry_run) continue;
        EXPECT_TRUE(b.Reaches(10)) << "version 10 lost by gc";
        return;
      }
      EXPECT_EQ(refused.status().code(), ErrorCode::kFailedPrecondition);
      const std::string message = refused.status().message();
      EXPECT_NE(message.find("version 10,"), std::string::npos) << message;
      EXPECT_NE(message.find(b.step9), std::string::npos) << message;
      EXPECT_NE(message.find("--keep-anchors"), std::string::npos) << message;
    }
  }
  // --anchor-check size: a missing step delta is still refused; one damaged
  // in place is what that cheaper check gives up (a dry run shows it).
  Result<PruneStats> by_size = PruneVersions(*b.store, 1, /*dry_run=*/true, AnchorCheck::kSize);
  EXPECT_EQ(by_size.ok(), !remove) << by_size.status().ToString();
  EXPECT_EQ(ReadManifest(*b.store).ToJson(), before) << "nothing changed";
  EXPECT_TRUE(b.Reaches(10));

  // Keeping anchor 1 keeps the route (nothing to remove).
  Result<PruneStats> all = PruneVersions(*b.store, 3);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_TRUE(all->removed_versions.empty());
  EXPECT_TRUE(b.Reaches(10));
}

std::string CutRouteName(const ::testing::TestParamInfo<std::tuple<bool, bool>>& info) {
  return std::string(std::get<0>(info.param) ? "Deleted" : "Flipped") + (std::get<1>(info.param) ? "OnS3" : "Local");
}
INSTANTIATE_TEST_SUITE_P(Damage, GcCutRouteTest, ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         CutRouteName);

// The cumulative delta damaged too: 10 is unreachable today, so gc has
// nothing of it to save and prunes (refusing would keep the bucket from ever
// being pruned); what it keeps is still reached.
TEST(GcRoutesTest, AVersionUnreachableAlreadyDoesNotBlockGc) {
  CrossingBucket b;
  b.Damage(b.step9, true);
  b.Damage(b.cumulative_delta.key, false);
  ASSERT_FALSE(b.Reaches(10));
  Result<PruneStats> pruned = PruneVersions(*b.store, 1);
  ASSERT_TRUE(pruned.ok()) << pruned.status().ToString();
  EXPECT_EQ(pruned->removed_versions, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(pruned->routes_checked, (std::vector<uint64_t>{8, 10}));
  EXPECT_TRUE(b.Reaches(8));
}

// The oldest kept anchor is held to session 49's rule whatever else: when
// it is damaged gc refuses even if nothing reaches it today (here its step
// delta is gone too, and the cumulative delta to 10): pruning would
// otherwise leave a bucket in which no version is reachable at all, where
// versions 1-7 are today.
TEST(GcRoutesTest, ADamagedOldestKeptAnchorIsRefusedEvenWhenItsVersionIsUnreachableToday) {
  CrossingBucket b;
  const Manifest m = ReadManifest(*b.store);
  b.Damage(m.Find(8)->anchor()->key, false);
  b.Damage(m.Find(8)->delta()->key, true);
  b.Damage(b.cumulative_delta.key, true);
  ASSERT_FALSE(b.Reaches(8));
  ASSERT_FALSE(b.Reaches(10));
  ASSERT_TRUE(b.Reaches(7));
  Result<PruneStats> refused = PruneVersions(*b.store, 1, /*dry_run=*/true);
  ASSERT_FALSE(refused.ok()) << "would prune versions 1-7, leaving nothing reachable";
  EXPECT_EQ(refused.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find(m.Find(8)->anchor()->key), std::string::npos)
      << refused.status().ToString();
}

// A fresh replica (holding nothing when the update began) that loaded
// anchor 8 and then found step 9 bad routes around it through anchor 1 and
// the cumulative delta in the same update: it served nothing before, so
// going back to an older anchor leaves it no older than it was. Before, it
// stopped on 8 ("starts from the older anchor version 1") although a route
// was there (and every later update from 8 stopped the same way).
TEST(GcRoutesTest, AFreshReplicaRoutesAroundThroughAnOlderAnchorInItsFirstUpdate) {
  CrossingBucket b(/*cumulative_cheaper=*/false);
  ASSERT_TRUE(b.Reaches(10));
  EXPECT_EQ(b.last.deltas_applied, 2u) << "anchor 8 + steps 9 and 10: the cheaper route";
  b.Damage(b.step9, true);
  auto replica = Replica::Create(b.store);
  Result<UpdateStats> updated = replica->Update(10);
  ASSERT_TRUE(updated.ok()) << updated.status().ToString();
  EXPECT_EQ(HashState(replica->state()), b.hashes[10]);
  EXPECT_EQ(updated->anchors_applied, 2u) << "anchor 8, then anchor 1";
  EXPECT_EQ(updated->deltas_applied, 1u);
}

}  // namespace
}  // namespace deltasync
