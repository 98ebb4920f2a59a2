// Session 49's adversarial review of gc (retention.h): gc racing a
// publisher whose side file objects gc is removing, and gc keeping an
// oldest anchor that is damaged. Nothing is lost: every object a manifest
// lists is there, and every version a replica could reach before gc it can
// reach after, or gc (or the publish) fails saying why.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/retention.h"
#include "deltasync/side_files.h"
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

SideFile File(std::string name, std::string text) {
  return SideFile{std::move(name), Blob::FromVector(std::vector<uint8_t>(text.begin(), text.end()))};
}

using Pairs = std::vector<std::pair<std::string, std::string>>;

// The side files of `version`, fetched and verified; empty on failure.
Pairs Fetched(Store& store, uint64_t version) {
  Manifest m = ReadManifest(store);
  Result<std::vector<SideFile>> files = FetchSideFiles(store, m.FilesAt(version), "");
  EXPECT_TRUE(files.ok()) << "version " << version << ": " << files.status().ToString();
  Pairs out;
  if (!files.ok()) return out;
  for (const SideFile& f : *files) out.emplace_back(f.name, std::string(f.bytes.bytes().begin(), f.bytes.bytes().end()));
  return out;
}

// Every object the manifest lists (weights and side files) is in the store.
void ExpectEveryListedObjectIsThere(Store& store) {
  Manifest m = ReadManifest(store);
  for (const VersionEntry& v : m.versions) {
    for (const ObjectEntry& o : v.objects) {
      for (const PartObject& p : StoredObjects(o)) {
        EXPECT_TRUE(store.Size(p.key).ok()) << "version " << v.version << " lists " << p.key << ", which is gone";
      }
    }
    if (!v.files) continue;
    for (const auto& [name, f] : *v.files) {
      EXPECT_TRUE(store.Size(f.key).ok()) << "version " << v.version << " lists side file " << name << " (" << f.key
                                          << "), which is gone";
    }
  }
}

// Versions 1..7 with anchors 1, 3, 6 (interval 3): 1 lists config.json
// "old", 2 changes it to "new" and 3..7 inherit that. gc --keep-anchors 1
// keeps 6 and 7 and removes the "old" config object (only 1 lists it).
// Version 8 goes back to the "old" config: its publisher uploads that
// object again and lists it.
struct RevertedConfig {
  RevertedConfig() {
    options.anchor_interval = 3;
    auto pub = Publisher::Open(base, options);
    EXPECT_TRUE(pub.ok()) << pub.status().ToString();
    for (uint64_t v = 1; v <= 7; ++v) {
      if (v > 1) model.Step(0.02);
      std::span<const SideFile> files(v == 1 ? old_set : new_set);
      auto stats = (*pub)->Publish(v, model.Views(), files);
      EXPECT_TRUE(stats.ok()) << stats.status().ToString();
      if (stats.ok()) hashes[v] = stats->state_hash;
    }
    old_key = ReadManifest(*base).Find(1)->files->at("config.json").key;
    model.Step(0.02);
  }

  Result<PublishStats> PublishEight(Publisher& pub) {
    Result<PublishStats> stats = pub.Publish(8, model.Views(), std::span<const SideFile>(old_set));
    if (stats.ok()) hashes[8] = stats->state_hash;
    return stats;
  }

  void ExpectVersionEightIsWhole() {
    EXPECT_EQ(Fetched(*base, 8), (Pairs{{"config.json", "old"}, {"tokenizer.json", "tok"}}));
    ExpectReaches(8, hashes[8]);
  }

  // Every object the manifest lists is there, and a fresh replica reaches
  // `version` bit-exactly.
  void ExpectReaches(uint64_t version, const StateHash& hash) {
    ExpectEveryListedObjectIsThere(*base);
    auto replica = Replica::Create(base);
    Result<UpdateStats> updated = replica->Update(version);
    ASSERT_TRUE(updated.ok()) << updated.status().ToString();
    EXPECT_EQ(HashState(replica->state()), hash);
  }

  TempDir tmp;
  std::shared_ptr<Store> base = OpenDirStore(tmp.path());
  PublisherOptions options;
  RandomModel model{23};
  std::vector<SideFile> old_set = {File("config.json", "old"), File("tokenizer.json", "tok")};
  std::vector<SideFile> new_set = {File("config.json", "new"), File("tokenizer.json", "tok")};
  std::string old_key;
  std::map<uint64_t, StateHash> hashes;
};

// gc runs whole between the publish's uploads (its side files first) and its
// manifest commit: the commit rebases onto the pruned manifest, whose gc
// has just deleted the "old" config object again. Listing it would be a
// version whose side file is gone for good (later versions inherit it);
// the publish fails instead, and publishing again uploads it again.
TEST(GcReviewTest, GcBetweenASideFileUploadAndTheCommitIsNeverSilent) {
  RevertedConfig b;
  auto store = std::make_shared<FaultStore>(b.base);
  auto pub = Publisher::Open(store, b.options);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  bool pruned = false;
  store->fail_write = [&](std::string_view key) {
    if (key == kManifestKey && !pruned) {
      pruned = true;
      Result<PruneStats> stats = PruneVersions(*b.base, 1);
      EXPECT_TRUE(stats.ok()) << stats.status().ToString();
      EXPECT_FALSE(b.base->Size(b.old_key).ok()) << "gc deleted the object only version 1 listed";
    }
    return Status::OK();
  };
  Result<PublishStats> first = b.PublishEight(**pub);
  ASSERT_TRUE(pruned);
  ExpectEveryListedObjectIsThere(*b.base);
  if (!first.ok()) {
    EXPECT_NE(first.status().message().find(b.old_key), std::string::npos) << first.status().ToString();
    EXPECT_EQ(ReadManifest(*b.base).Latest()->version, 7u);
    Result<PublishStats> again = b.PublishEight(**pub);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
  }
  b.ExpectVersionEightIsWhole();
}

// gc writes its pruned manifest, then a publisher commits version 8 (the
// one open since before gc, rebasing; or one opened on the pruned
// manifest), listing the "old" config object gc is about to delete; then
// gc deletes what it planned to. It must not delete an object the manifest
// lists by then.
class GcDeletesAfterACommitTest : public ::testing::TestWithParam<bool> {};

TEST_P(GcDeletesAfterACommitTest, KeepsTheSideFileObjectTheNewVersionLists) {
  const bool reopen = GetParam();
  RevertedConfig b;
  auto open = Publisher::Open(b.base, b.options);
  ASSERT_TRUE(open.ok()) << open.status().ToString();
  auto gc_store = std::make_shared<FaultStore>(b.base);
  bool published = false;
  gc_store->fail_after_conditional_write = [&](std::string_view key) {
    if (key == kManifestKey && !published) {
      published = true;
      std::unique_ptr<Publisher> pub = std::move(*open);
      if (reopen) {
        auto fresh = Publisher::Open(b.base, b.options);
        EXPECT_TRUE(fresh.ok()) << fresh.status().ToString();
        if (!fresh.ok()) return Status::OK();
        pub = std::move(*fresh);
      }
      Result<PublishStats> stats = b.PublishEight(*pub);
      EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    }
    return Status::OK();
  };
  Result<PruneStats> pruned = PruneVersions(*gc_store, 1);
  ASSERT_TRUE(published);
  ASSERT_TRUE(pruned.ok()) << pruned.status().ToString();
  EXPECT_EQ(pruned->removed_versions, (std::vector<uint64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(ReadManifest(*b.base).Latest()->version, 8u);
  b.ExpectVersionEightIsWhole();
  // The next version keeps the set: nothing is uploaded for it, it lists
  // nothing, and inherits what 8 lists.
  auto next = Publisher::Open(b.base, b.options);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  b.model.Step(0.02);
  ASSERT_TRUE((*next)->Publish(9, b.model.Views(), std::span<const SideFile>(b.old_set)).ok());
  EXPECT_FALSE(ReadManifest(*b.base).Find(9)->files.has_value());
  EXPECT_EQ(Fetched(*b.base, 9), (Pairs{{"config.json", "old"}, {"tokenizer.json", "tok"}}));
}

INSTANTIATE_TEST_SUITE_P(RebasedOrReopened, GcDeletesAfterACommitTest, ::testing::Bool());

// Weight objects: gc between the uploads of version 8 and its commit
// touches none of them (it deletes only what removed versions list).
TEST(GcReviewTest, GcBetweenAWeightUploadAndTheCommitKeepsTheNewObjects) {
  RevertedConfig b;
  auto store = std::make_shared<FaultStore>(b.base);
  auto pub = Publisher::Open(store, b.options);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  bool pruned = false;
  store->fail_write = [&](std::string_view key) {
    if (key == kManifestKey && !pruned) {
      pruned = true;
      EXPECT_TRUE(PruneVersions(*b.base, 1).ok());
    }
    return Status::OK();
  };
  // The same side files as version 7: nothing is uploaded for them.
  Result<PublishStats> stats = (*pub)->Publish(8, b.model.Views(), std::span<const SideFile>(b.new_set));
  ASSERT_TRUE(pruned);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(ReadManifest(*b.base).versions.front().version, 6u);
  b.ExpectReaches(8, stats->state_hash);
}

// A commit that rebases onto gc's pruned manifest and then fails (the
// rebased write hits an outage) must leave the publisher as it was: its
// next attempt rebases again. It must not write its pre-gc list (versions
// 1..5, whose objects gc deleted) over the pruned manifest.
TEST(GcReviewTest, AFailedRebasedCommitDoesNotBringBackThePrunedVersions) {
  RevertedConfig b;
  auto store = std::make_shared<FaultStore>(b.base);
  auto pub = Publisher::Open(store, b.options);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  int manifest_writes = 0;
  store->fail_write = [&](std::string_view key) {
    if (key != kManifestKey) return Status::OK();
    if (++manifest_writes == 1) EXPECT_TRUE(PruneVersions(*b.base, 1).ok());
    return manifest_writes == 2 ? Status::IOError("injected: connection reset") : Status::OK();
  };
  Result<PublishStats> first = (*pub)->Publish(8, b.model.Views(), std::span<const SideFile>(b.new_set));
  ASSERT_EQ(manifest_writes, 2);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), ErrorCode::kIOError) << first.status().ToString();
  Result<PublishStats> again = (*pub)->Publish(8, b.model.Views(), std::span<const SideFile>(b.new_set));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  Manifest now = ReadManifest(*b.base);
  EXPECT_EQ(now.versions.front().version, 6u) << "the pruned versions came back";
  EXPECT_EQ(now.Latest()->version, 8u);
  b.ExpectReaches(8, again->state_hash);
}

// The rebased write lands but its answer is lost: the publish fails, and
// its retry finds its own commit (the writer stamp). The publisher must then
// hold the pruned list it wrote, not its pre-gc one, or its next commit
// writes versions 1..5 back.
TEST(GcReviewTest, ALostAnswerToARebasedCommitLeavesThePublisherOnThePrunedList) {
  RevertedConfig b;
  auto store = std::make_shared<FaultStore>(b.base);
  auto pub = Publisher::Open(store, b.options);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  int manifest_writes = 0;
  store->fail_write = [&](std::string_view key) {
    if (key == kManifestKey && ++manifest_writes == 1) EXPECT_TRUE(PruneVersions(*b.base, 1).ok());
    return Status::OK();
  };
  store->fail_after_conditional_write = [&](std::string_view key) {
    return key == kManifestKey && manifest_writes == 2 ? Status::IOError("injected: answer lost") : Status::OK();
  };
  Result<PublishStats> first = (*pub)->Publish(8, b.model.Views(), std::span<const SideFile>(b.new_set));
  ASSERT_FALSE(first.ok());
  ASSERT_EQ(ReadManifest(*b.base).Latest()->version, 8u) << "the rebased write landed";
  Result<PublishStats> again = (*pub)->Publish(8, b.model.Views(), std::span<const SideFile>(b.new_set));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  b.model.Step(0.02);
  Result<PublishStats> nine = (*pub)->Publish(9, b.model.Views(), std::span<const SideFile>(b.new_set));
  ASSERT_TRUE(nine.ok()) << nine.status().ToString();
  Manifest now = ReadManifest(*b.base);
  EXPECT_EQ(now.versions.front().version, 6u) << "the pruned versions came back";
  EXPECT_EQ(now.Latest()->version, 9u);
  b.ExpectReaches(9, nine->state_hash);
}

// Anchors 1, 4, 8 (interval 4), versions 1..10. Anchor 8's object is
// damaged (or gone): replicas reach 8..10 through anchor 4 and the step
// deltas. gc --keep-anchors 1 would keep anchor 8 as the only start and
// remove that route: every kept version unreachable. gc refuses and
// changes nothing; with --keep-anchors 2 it keeps the route.
class GcDamagedAnchorTest : public ::testing::TestWithParam<bool> {};

TEST_P(GcDamagedAnchorTest, RefusesToStrandTheVersionsBehindADamagedOldestKeptAnchor) {
  const bool remove = GetParam();
  TempDir tmp;
  auto store = OpenDirStore(tmp.path());
  PublisherOptions options;
  options.anchor_interval = 4;
  std::map<uint64_t, StateHash> hashes;
  {
    auto pub = Publisher::Open(store, options);
    ASSERT_TRUE(pub.ok());
    RandomModel model(31);
    for (uint64_t v = 1; v <= 10; ++v) {
      if (v > 1) model.Step(0.05);
      auto stats = (*pub)->Publish(v, model.Views());
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
      hashes[v] = stats->state_hash;
    }
  }
  Manifest before = ReadManifest(*store);
  ASSERT_NE(before.Find(8)->anchor(), nullptr);
  const std::string anchor8 = before.Find(8)->anchor()->key;
  const std::string path = tmp.path() + "/" + anchor8;
  if (remove) {
    ASSERT_TRUE(fs::remove(path));
  } else {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    ASSERT_GT(bytes.size(), 100u);
    bytes[bytes.size() / 2] ^= 0x10;
    std::ofstream(tmp.Sub("damaged"), std::ios::binary) << bytes;
    fs::rename(tmp.Sub("damaged"), path);
  }
  auto reaches_ten = [&] {
    auto replica = Replica::Create(store);
    Result<UpdateStats> updated = replica->Update(10);
    return updated.ok() && HashState(replica->state()) == hashes[10];
  };
  ASSERT_TRUE(reaches_ten()) << "routed around anchor 8 before gc";

  for (bool dry_run : {true, false}) {
    Result<PruneStats> refused = PruneVersions(*store, 1, dry_run);
    ASSERT_FALSE(refused.ok()) << "dry run " << dry_run;
    EXPECT_NE(refused.status().message().find(anchor8), std::string::npos) << refused.status().ToString();
    EXPECT_NE(refused.status().message().find("--keep-anchors"), std::string::npos) << refused.status().ToString();
  }
  // --anchor-check size: a missing anchor is still refused; one damaged in
  // place (same size) is what that cheaper check gives up (a dry run shows it).
  Result<PruneStats> by_size = PruneVersions(*store, 1, /*dry_run=*/true, AnchorCheck::kSize);
  EXPECT_EQ(by_size.ok(), !remove) << by_size.status().ToString();
  if (by_size.ok()) {
    EXPECT_EQ(by_size->anchor_checked, 8u);
    EXPECT_EQ(by_size->anchor_bytes_read, 0u);
  }
  EXPECT_EQ(ReadManifest(*store).ToJson(), before.ToJson()) << "nothing changed";
  ASSERT_TRUE(reaches_ten());

  Result<PruneStats> kept = PruneVersions(*store, 2);  // keeps anchor 4 as the start
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(kept->kept_anchors, (std::vector<uint64_t>{4, 8}));
  EXPECT_EQ(kept->anchor_checked, 4u);
  EXPECT_EQ(kept->anchor_bytes_read, before.Find(4)->anchor()->size) << "read whole to hash it";
  EXPECT_TRUE(reaches_ten()) << "still routed around anchor 8";
}

INSTANTIATE_TEST_SUITE_P(FlippedOrDeleted, GcDamagedAnchorTest, ::testing::Bool());

// Recovery seen from a replica that holds the version that became
// unrebuildable (it reached 12 before 12's step delta was damaged): the
// recovered 13 has no delta, so it moves by 13's anchor, exactly; then on.
TEST(GcReviewTest, AReplicaOnTheDamagedVersionMovesToTheRecoveredOneExactly) {
  TempDir tmp;
  auto store = OpenDirStore(tmp.Sub("bucket"));
  RandomModel model(41);
  std::map<uint64_t, StateHash> hashes;
  {
    auto pub = Publisher::Open(store, {});
    ASSERT_TRUE(pub.ok());
    for (uint64_t v = 1; v <= 12; ++v) {
      if (v > 1) model.Step(0.05);
      auto stats = (*pub)->Publish(v, model.Views());
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
      hashes[v] = stats->state_hash;
    }
  }
  auto replica = Replica::Create(store);
  ASSERT_TRUE(replica->Update(12).ok());
  const std::string step12 = ReadManifest(*store).Find(12)->delta()->key;
  ASSERT_TRUE(fs::remove(tmp.Sub("bucket") + "/" + step12));

  auto pub = Publisher::Open(store, {});
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  ASSERT_TRUE((*pub)->degraded());
  for (uint64_t v = 13; v <= 14; ++v) {
    model.Step(0.05);
    auto stats = (*pub)->Publish(v, model.Views());
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->recovered, v == 13);
    hashes[v] = stats->state_hash;
  }
  Result<UpdateStats> to13 = replica->Update(13);
  ASSERT_TRUE(to13.ok()) << to13.status().ToString();
  EXPECT_EQ(to13->anchors_applied, 1u);
  EXPECT_EQ(HashState(replica->state()), hashes[13]);
  Result<UpdateStats> to14 = replica->Update(14);
  ASSERT_TRUE(to14.ok()) << to14.status().ToString();
  EXPECT_EQ(to14->deltas_applied, 1u);
  EXPECT_EQ(HashState(replica->state()), hashes[14]);
}

}  // namespace
}  // namespace deltasync
