// Cumulative deltas, adaptive anchors, PublishChanges, change tracking and
// retention: end to end on a LocalStore.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "deltasync/changes.h"
#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/retention.h"
#include "testing/bucket_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::RandomModel;
using testing::OpenDirStore;
using testing::ReadManifest;
using testing::TempDir;

std::unique_ptr<Publisher> OpenPublisher(std::shared_ptr<Store> store, PublisherOptions options) {
  auto p = Publisher::Open(std::move(store), std::move(options));
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(*p) : nullptr;
}

// The replica's full state equals the model's, recomputed from scratch.
void ExpectHolds(const Replica& r, const RandomModel& model) {
  EXPECT_EQ(HashState(r.state()), HashTensors(model.Views()));
  EXPECT_EQ(r.state_hash(), HashTensors(model.Views()));
}

class CumulativeTest : public ::testing::TestWithParam<IndexEncoding> {};

TEST_P(CumulativeTest, FreshReplicasCatchUpThroughOneCumulativeDelta) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  PublisherOptions options;
  options.anchor_interval = 100;
  options.cumulative_interval = 4;
  options.encoding = GetParam();
  auto pub = OpenPublisher(store, options);
  RandomModel model(11);
  std::map<uint64_t, StateHash> hashes;
  for (uint64_t v = 1; v <= 14; ++v) {
    if (v > 1) model.Step(0.02);
    auto stats = pub->Publish(v, model.Views());
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    // Versions 5, 9, 13 are the 4th, 8th, 12th after the anchor at 1.
    EXPECT_EQ(stats->cumulative_bytes > 0, v == 5 || v == 9 || v == 13) << "version " << v;
    hashes[v] = stats->state_hash;
  }
  Manifest m = ReadManifest(*store);
  const ObjectEntry* cumulative = nullptr;
  for (const ObjectEntry& o : m.Find(13)->objects) {
    if (o.kind == PatchKind::kDelta && o.base_version == 1u) cumulative = &o;
  }
  ASSERT_NE(cumulative, nullptr);
  EXPECT_EQ(cumulative->key, CumulativeDeltaKey(1, 13, GetParam()));
  EXPECT_TRUE(cumulative->key.starts_with("ds/"));

  // Fresh: anchor 1 + cumulative 1->13 + step 14.
  auto fresh = Replica::Create(store);
  auto up = fresh->Update(14);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  EXPECT_EQ(up->anchors_applied, 1u);
  EXPECT_EQ(up->deltas_applied, 2u);
  ExpectHolds(*fresh, model);
  uint64_t steps_bytes = m.Find(1)->anchor()->size;
  for (uint64_t v = 2; v <= 14; ++v) steps_bytes += m.Find(v)->delta()->size;
  EXPECT_LT(up->bytes_downloaded, steps_bytes);
  // Every intermediate version too.
  for (uint64_t v = 2; v <= 13; ++v) {
    auto r = Replica::Create(store);
    ASSERT_TRUE(r->Update(v).ok()) << "version " << v;
    EXPECT_EQ(r->state_hash(), hashes[v]);
    EXPECT_EQ(HashState(r->state()), hashes[v]);
  }
  // A replica holding the anchor takes the cumulative delta directly.
  auto at_anchor = Replica::Create(store);
  ASSERT_TRUE(at_anchor->Update(1).ok());
  auto jump = at_anchor->Update(9);
  ASSERT_TRUE(jump.ok());
  EXPECT_EQ(jump->deltas_applied, 1u);
  EXPECT_EQ(at_anchor->state_hash(), hashes[9]);
}

TEST_P(CumulativeTest, AReopenedPublisherContinuesTheCumulativeChain) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  PublisherOptions options;
  options.anchor_interval = 100;
  options.cumulative_interval = 2;
  options.encoding = GetParam();
  RandomModel model(12);
  {
    auto pub = OpenPublisher(store, options);
    for (uint64_t v = 1; v <= 4; ++v) {
      if (v > 1) model.Step(0.03);
      ASSERT_TRUE(pub->Publish(v, model.Views()).ok());
    }
  }
  auto pub = OpenPublisher(store, options);
  model.Step(0.03);
  auto stats = pub->Publish(5, model.Views());
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_GT(stats->cumulative_bytes, 0u);  // the 4th after the anchor
  auto at_anchor = Replica::Create(store);
  ASSERT_TRUE(at_anchor->Update(1).ok());
  auto jump = at_anchor->Update(5);
  ASSERT_TRUE(jump.ok()) << jump.status().ToString();
  EXPECT_EQ(jump->deltas_applied, 1u);
  ExpectHolds(*at_anchor, model);
}

INSTANTIATE_TEST_SUITE_P(Encodings, CumulativeTest,
                         ::testing::Values(IndexEncoding::kCompact, IndexEncoding::kGapDelta),
                         [](const auto& info) { return std::string(EncodingName(info.param)); });

TEST(AdaptiveAnchorTest, ANewAnchorWhenTheCumulativeDeltaOutgrowsTheFraction) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  PublisherOptions options;
  options.anchor_interval = 1000;
  // RandomModel's steps are a random walk (+-1 ULP), so the cumulative
  // change grows slowly: at 5% per step it passes 12% of an anchor after a
  // few steps.
  options.anchor_max_fraction = 0.12;
  auto pub = OpenPublisher(store, options);
  RandomModel model(13);
  std::vector<uint64_t> anchors;
  for (uint64_t v = 1; v <= 16; ++v) {
    if (v > 1) model.Step(0.05);
    auto stats = pub->Publish(v, model.Views());
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    if (stats->wrote_anchor) anchors.push_back(v);
    auto r = Replica::Create(store);
    ASSERT_TRUE(r->Update().ok());
    ExpectHolds(*r, model);
  }
  ASSERT_GE(anchors.size(), 3u) << "5% per step outgrows 12% of an anchor within a few steps";
  EXPECT_EQ(anchors[0], 1u);
  // Between anchors, the cumulative change stayed under the fraction: no
  // anchor follows the previous one immediately at 5% per step.
  for (size_t i = 1; i < anchors.size(); ++i) EXPECT_GT(anchors[i] - anchors[i - 1], 1u);
  // A publisher reopened on the bucket keeps the same cadence decisions.
  auto reopened = OpenPublisher(store, options);
  model.Step(0.05);
  ASSERT_TRUE(reopened->Publish(17, model.Views()).ok());
}

TEST(PublishChangesTest, SameBytesAsPublishingTheFullTensors) {
  TempDir a_dir, b_dir;
  auto a_store = OpenDirStore(a_dir.path()), b_store = OpenDirStore(b_dir.path());
  PublisherOptions options;
  options.anchor_interval = 3;
  auto a = OpenPublisher(a_store, options);
  auto b = OpenPublisher(b_store, options);
  RandomModel model(14);
  for (uint64_t v = 1; v <= 7; ++v) {
    if (v > 1) model.Step(0.04);
    auto full = a->Publish(v, model.Views());
    ASSERT_TRUE(full.ok());
    Result<PublishStats> sparse = Status::Internal("unset");
    if (v == 1) {
      sparse = b->Publish(v, model.Views());
    } else {
      auto changes = DetectChanges(b->state(), model.Views());
      ASSERT_TRUE(changes.ok());
      sparse = b->PublishChanges(v, *changes);
    }
    ASSERT_TRUE(sparse.ok()) << sparse.status().ToString();
    EXPECT_EQ(sparse->state_hash, full->state_hash);
    EXPECT_EQ(sparse->changed_elements, full->changed_elements);
  }
  Manifest ma = ReadManifest(*a_store), mb = ReadManifest(*b_store);
  ASSERT_EQ(ma.versions.size(), mb.versions.size());
  for (size_t i = 0; i < ma.versions.size(); ++i) {
    ASSERT_EQ(ma.versions[i].objects.size(), mb.versions[i].objects.size());
    for (size_t j = 0; j < ma.versions[i].objects.size(); ++j) {
      EXPECT_EQ(ma.versions[i].objects[j].xxh3_128, mb.versions[i].objects[j].xxh3_128) << "deterministic encoders";
    }
  }
}

TEST(PublishChangesTest, BadChangesAreRefusedAndChangeNothing) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  auto pub = OpenPublisher(store, {});
  RandomModel model(15);
  std::vector<TensorView> views = model.Views();
  TensorChanges c{views[0].name, DType::kBF16, {1, 5}, std::vector<uint8_t>(4, 0x3F)};
  auto first = pub->PublishChanges(1, std::span<const TensorChanges>(&c, 1));
  EXPECT_EQ(first.status().code(), ErrorCode::kFailedPrecondition) << first.status().ToString();
  ASSERT_TRUE(pub->Publish(1, views).ok());
  const StateHash before = HashState(pub->state());

  auto expect_refused = [&](TensorChanges bad, const std::string& needle) {
    auto r = pub->PublishChanges(2, std::span<const TensorChanges>(&bad, 1));
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << r.status().ToString();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    EXPECT_EQ(HashState(pub->state()), before);
    EXPECT_EQ(pub->latest_version(), 1u);
  };
  TensorChanges unsorted = c;
  unsorted.indices = {5, 1};
  expect_refused(unsorted, "strictly ascending");
  TensorChanges out_of_range = c;
  out_of_range.indices = {1, 1ull << 40};
  expect_refused(out_of_range, "out of range");
  TensorChanges unknown = c;
  unknown.name = "no.such.weight";
  expect_refused(unknown, "no such tensor");
  TensorChanges wrong_dtype = c;
  wrong_dtype.dtype = DType::kF16;
  expect_refused(wrong_dtype, "published as BF16");
  TensorChanges short_values = c;
  short_values.values.resize(3);
  expect_refused(short_values, "value bytes");
  TensorChanges nan = c;
  nan.values = {0xC0, 0x7F, 0x80, 0x3F};  // 0x7FC0 (NaN), 0x3F80
  expect_refused(nan, "NaN or Inf");

  ASSERT_TRUE(pub->PublishChanges(2, std::span<const TensorChanges>(&c, 1)).ok());
  auto r = Replica::Create(store);
  ASSERT_TRUE(r->Update().ok());
  EXPECT_EQ(HashState(r->state()), HashState(pub->state()));
}

// A background publisher snapshots the trainer's tensors, which then move on.
TEST(SnapshotTest, PublishesWhatTheTensorsHeldWhenTaken) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  auto pub = OpenPublisher(store, {});
  RandomModel model(19);
  Result<WeightState> snap = pub->Snapshot(model.Views());
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  const StateHash expected = HashTensors(model.Views());
  model.Step(0.5);  // the trainer's next step
  std::vector<TensorView> views = snap->views();
  auto stats = pub->Publish(1, views);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->state_hash, expected);
  // fp32 is rounded as Publish rounds it: a snapshot of fp32 masters
  // publishes the same state as the masters themselves.
  std::vector<float> w = {1.0f + 1.0f / 256, 1.0f + 1.0f / 256 + 1.0f / (1 << 20), -2.5f, 3e-3f};
  TensorView t{"w", DType::kF32, {4}, ByteSpan(reinterpret_cast<const uint8_t*>(w.data()), 16)};
  Result<WeightState> from_fp32 = pub->Snapshot(std::span<const TensorView>(&t, 1));
  ASSERT_TRUE(from_fp32.ok());
  EXPECT_EQ(from_fp32->tensors()[0].dtype, DType::kBF16);
  auto direct = ToPublishedState(std::span<const TensorView>(&t, 1));
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(from_fp32->tensors()[0].data, direct->tensors()[0].data);
  float nan = std::nanf("");
  TensorView bad{"w", DType::kF32, {1}, ByteSpan(reinterpret_cast<const uint8_t*>(&nan), 4)};
  EXPECT_EQ(pub->Snapshot(std::span<const TensorView>(&bad, 1)).status().code(), ErrorCode::kInvalidArgument);
}

// What a consumer mirroring the state (a GPU copy) needs: exactly the
// elements that differ since it last looked.
TEST(TrackChangesTest, TakeChangesNamesExactlyWhatChanged) {
  // The default (compact) deltas and gap_delta ones (applied from their encoded gaps).
  for (std::optional<IndexEncoding> encoding :
       {std::optional<IndexEncoding>(), std::optional<IndexEncoding>(IndexEncoding::kGapDelta)}) {
    SCOPED_TRACE(encoding ? std::string(EncodingName(*encoding)) : "default");
    TempDir dir;
    auto store = OpenDirStore(dir.path());
    PublisherOptions options;
    options.anchor_interval = 1000;
    options.encoding = encoding;
    auto pub = OpenPublisher(store, options);
    RandomModel model(16);
    ASSERT_TRUE(pub->Publish(1, model.Views()).ok());
    auto replica = Replica::Create(store, ReplicaOptions{0, /*track_changes=*/true});
    ASSERT_TRUE(replica->Update().ok());
    EXPECT_TRUE(replica->TakeChanges().everything);
    ChangedElements none = replica->TakeChanges();
    EXPECT_FALSE(none.everything);
    EXPECT_TRUE(none.tensors.empty());

    auto snapshot = [&] {
      std::map<std::string, std::vector<uint8_t>> s;
      for (const auto& t : replica->state().tensors()) s[t.name] = t.data;
      return s;
    };
    auto before = snapshot();
    for (uint64_t v = 2; v <= 4; ++v) {
      model.Step(0.03);
      ASSERT_TRUE(pub->Publish(v, model.Views()).ok());
    }
    ASSERT_TRUE(replica->Update().ok());  // three deltas
    ChangedElements changed = replica->TakeChanges();
    ASSERT_FALSE(changed.everything);
    std::map<std::string, std::vector<uint64_t>> got(changed.tensors.begin(), changed.tensors.end());
    uint64_t differing = 0;
    for (const auto& t : replica->state().tensors()) {
      const std::vector<uint8_t>& old = before[t.name];
      const size_t w = DTypeSize(t.dtype);
      std::vector<uint64_t>& listed = got[t.name];
      EXPECT_TRUE(std::is_sorted(listed.begin(), listed.end()));
      EXPECT_EQ(std::adjacent_find(listed.begin(), listed.end()), listed.end()) << "unique";
      for (uint64_t i = 0; i < t.num_elements(); ++i) {
        if (std::memcmp(&old[i * w], &t.data[i * w], w) != 0) {
          ++differing;
          EXPECT_TRUE(std::binary_search(listed.begin(), listed.end(), i)) << t.name << "[" << i << "] changed";
        }
      }
    }
    EXPECT_GT(differing, 0u);
    // Listed but equal is allowed only for an element changed and changed back.
    uint64_t listed_total = 0;
    for (const auto& [name, idx] : changed.tensors) listed_total += idx.size();
    EXPECT_GE(listed_total, differing);
    EXPECT_LE(listed_total, differing + differing / 5 + 16);
  }
}

// Views of the state stay valid across updates, anchors included.
TEST(TrackChangesTest, AnAnchorIsCopiedIntoTheSameBuffers) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  PublisherOptions options;
  options.anchor_interval = 4;
  auto pub = OpenPublisher(store, options);
  RandomModel model(17);
  ASSERT_TRUE(pub->Publish(1, model.Views()).ok());
  auto replica = Replica::Create(store, ReplicaOptions{0, true});
  ASSERT_TRUE(replica->Update().ok());
  ASSERT_TRUE(replica->TakeChanges().everything);
  std::vector<const uint8_t*> addresses;
  for (const auto& t : replica->state().tensors()) addresses.push_back(t.data.data());
  for (uint64_t v = 2; v <= 8; ++v) {
    model.Step(0.9);  // big steps: the anchor at 8 is cheaper than seven deltas
    ASSERT_TRUE(pub->Publish(v, model.Views()).ok());
  }
  auto up = replica->Update(8);
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->anchors_applied, 1u);
  ExpectHolds(*replica, model);
  for (size_t i = 0; i < addresses.size(); ++i) EXPECT_EQ(replica->state().tensors()[i].data.data(), addresses[i]);
  EXPECT_TRUE(replica->TakeChanges().everything) << "after an anchor, everything may have changed";
}

// A consumer that writes into the replica's memory is caught by Verify, and
// the next update repairs the state in the same buffers.
TEST(VerifyTest, MemoryChangedBehindTheReplicaIsCaughtAndRepaired) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  PublisherOptions options;
  options.anchor_interval = 3;
  auto pub = OpenPublisher(store, options);
  RandomModel model(20);
  for (uint64_t v = 1; v <= 4; ++v) {
    if (v > 1) model.Step(0.05);
    ASSERT_TRUE(pub->Publish(v, model.Views()).ok());
  }
  auto replica = Replica::Create(store, ReplicaOptions{0, true});
  EXPECT_EQ(replica->Verify().code(), ErrorCode::kFailedPrecondition);
  ASSERT_TRUE(replica->Update().ok());
  ASSERT_TRUE(replica->Verify().ok());
  (void)replica->TakeChanges();
  auto& t = const_cast<WeightState::Tensor&>(replica->state().tensors()[0]);
  const uint8_t* address = t.data.data();
  t.data[1] ^= 0x01;  // what a stray write through a view does
  Status verified = replica->Verify();
  EXPECT_EQ(verified.code(), ErrorCode::kIntegrity);
  EXPECT_NE(verified.message().find("version 4"), std::string::npos) << verified.message();
  EXPECT_EQ(replica->version(), 0u);
  EXPECT_TRUE(replica->TakeChanges().everything);
  auto repaired = replica->Update();
  ASSERT_TRUE(repaired.ok()) << repaired.status().ToString();
  EXPECT_EQ(repaired->anchors_applied, 1u);
  ExpectHolds(*replica, model);
  EXPECT_TRUE(replica->Verify().ok());
  EXPECT_EQ(replica->state().tensors()[0].data.data(), address);
}

TEST(RetentionTest, KeepsTheNewestAnchorsAndEverythingTheirChainsNeed) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  PublisherOptions options;
  options.anchor_interval = 4;
  options.cumulative_interval = 2;
  auto pub = OpenPublisher(store, options);
  RandomModel model(18);
  std::map<uint64_t, StateHash> hashes;
  for (uint64_t v = 1; v <= 14; ++v) {  // anchors 1, 4, 8, 12
    if (v > 1) model.Step(0.03);
    auto stats = pub->Publish(v, model.Views());
    ASSERT_TRUE(stats.ok());
    hashes[v] = stats->state_hash;
  }
  Manifest before = ReadManifest(*store);
  auto dry = PruneVersions(*store, 2, /*dry_run=*/true);
  ASSERT_TRUE(dry.ok());
  EXPECT_EQ(ReadManifest(*store).ToJson(), before.ToJson()) << "a dry run changes nothing";

  auto pruned = PruneVersions(*store, 2);
  ASSERT_TRUE(pruned.ok()) << pruned.status().ToString();
  EXPECT_EQ(pruned->kept_anchors, (std::vector<uint64_t>{8, 12}));
  EXPECT_EQ(pruned->removed_versions, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(pruned->objects_deleted, dry->objects_deleted);
  Manifest after = ReadManifest(*store);
  EXPECT_EQ(after.versions.front().version, 8u);
  EXPECT_EQ(after.Find(8)->objects.size(), 1u) << "version 8 keeps its anchor, not its delta from 7";
  // Every removed object is gone; every listed one is there.
  for (const VersionEntry& v : before.versions) {
    for (const ObjectEntry& o : v.objects) {
      bool listed = false;
      for (const VersionEntry& w : after.versions) {
        for (const ObjectEntry& p : w.objects) listed |= p.key == o.key;
      }
      EXPECT_EQ(store->Get(o.key).ok(), listed) << o.key;
    }
  }
  for (uint64_t v = 8; v <= 14; ++v) {
    auto r = Replica::Create(store);
    ASSERT_TRUE(r->Update(v).ok()) << "version " << v;
    EXPECT_EQ(r->state_hash(), hashes[v]);
  }
  // The publisher rebases its next commit onto the pruned manifest.
  model.Step(0.03);
  auto next = pub->Publish(15, model.Views());
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  Manifest latest = ReadManifest(*store);
  EXPECT_EQ(latest.versions.front().version, 8u);
  EXPECT_EQ(latest.Latest()->version, 15u);
  // Nothing to do the second time; K = 0 is refused.
  auto again = PruneVersions(*store, 2);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->removed_versions.empty());
  EXPECT_EQ(PruneVersions(*store, 0).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace deltasync
