// Parts: block geometry, layouts, the parted manifest, and publishing a
// version from several part publishers, followed by a Replica, end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <random>

#include "deltasync/block.h"
#include "deltasync/manifest.h"
#include "deltasync/part_publisher.h"
#include "deltasync/parts.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/retention.h"
#include "deltasync/verify.h"
#include "testing/bucket_util.h"
#include "testing/fault_store.h"
#include "testing/parts_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::BlocksOf;
using testing::DamageLastByte;
using testing::ExpectSameState;
using testing::OpenDirStore;
using testing::PartBlocks;
using testing::Ranks;
using testing::RandomModel;
using testing::ReadManifest;
using testing::SplitLayout;
using testing::TempDir;

TEST(BlockGeometry, MapsRowRangesColumnRangesAndBoxes) {
  // Rows 2..4 of a 5x4 tensor: one run.
  auto rows = BlockGeometry::Make(std::vector<uint64_t>{5, 4}, std::vector<uint64_t>{2, 0}, std::vector<uint64_t>{3, 4});
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->runs(), 1u);
  EXPECT_EQ(rows->FullIndex(0), 8u);
  EXPECT_EQ(rows->FullIndex(11), 19u);
  // Columns 1..2 of a 5x4 tensor: five runs of two.
  auto cols = BlockGeometry::Make(std::vector<uint64_t>{5, 4}, std::vector<uint64_t>{0, 1}, std::vector<uint64_t>{5, 2});
  ASSERT_TRUE(cols.ok());
  EXPECT_EQ(cols->runs(), 5u);
  EXPECT_EQ(cols->run_length(), 2u);
  EXPECT_EQ(cols->FullIndex(0), 1u);
  EXPECT_EQ(cols->FullIndex(3), 6u);
  EXPECT_EQ(cols->FullIndex(9), 18u);
  // A box of a 3-D tensor: every element, brute force.
  const std::vector<uint64_t> full{4, 5, 6}, off{1, 2, 3}, shape{2, 3, 2};
  auto box = BlockGeometry::Make(full, off, shape);
  ASSERT_TRUE(box.ok());
  uint64_t local = 0;
  for (uint64_t a = 0; a < 2; ++a)
    for (uint64_t b = 0; b < 3; ++b)
      for (uint64_t c = 0; c < 2; ++c) EXPECT_EQ(box->FullIndex(local++), ((1 + a) * 5 + 2 + b) * 6 + 3 + c);
  // Copy out and back in.
  std::vector<uint8_t> data(4 * 5 * 6), block(12), back(4 * 5 * 6, 0);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
  CopyBlockOut(*box, 1, data.data(), block.data());
  for (uint64_t i = 0; i < 12; ++i) EXPECT_EQ(block[i], data[box->FullIndex(i)]);
  CopyBlockIn(*box, 1, block.data(), back.data());
  for (uint64_t i = 0; i < 12; ++i) EXPECT_EQ(back[box->FullIndex(i)], data[box->FullIndex(i)]);
  // A scalar is its own block.
  auto scalar = BlockGeometry::Make(std::vector<uint64_t>{}, std::vector<uint64_t>{}, std::vector<uint64_t>{});
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(scalar->elements(), 1u);
  EXPECT_EQ(scalar->FullIndex(0), 0u);
  EXPECT_FALSE(BlockGeometry::Make(std::vector<uint64_t>{5, 4}, std::vector<uint64_t>{3, 0}, std::vector<uint64_t>{3, 4}).ok());
}

TEST(PartLayout, DescriptorTermsPlusPartHashesAreTheStateHash) {
  RandomModel model(7);
  const std::vector<TensorView> views = model.Views();
  for (size_t dim : {0, 1}) {
    for (size_t parts : {1, 3, 4}) {
      PartLayout l = SplitLayout(views, parts, dim);
      ASSERT_TRUE(l.Validate().ok()) << l.Validate().ToString();
      auto full = WeightState::FromViews(views);
      ASSERT_TRUE(full.ok());
      StateHash sum = l.DescriptorTerms();
      for (size_t p = 0; p < parts; ++p) {
        auto blocks = ExtractPart(l, p, *full);
        ASSERT_TRUE(blocks.ok()) << blocks.status().ToString();
        sum += HashPart(l, p, *blocks, 2);
      }
      EXPECT_EQ(sum, HashTensors(views)) << "dim " << dim << ", " << parts << " parts";
    }
  }
}

TEST(PartLayout, RefusesOverlapsGapsAndDisorder) {
  PartLayout l;
  l.tensors = {{"a", DType::kBF16, {4, 2}}, {"b", DType::kBF16, {3}}};
  l.parts = {{{0, {0, 0}, {2, 2}}, {1, {0}, {3}}}, {{0, {2, 0}, {2, 2}}}};
  ASSERT_TRUE(l.Validate().ok()) << l.Validate().ToString();
  const std::string digest = l.Digest();
  EXPECT_EQ(digest.size(), 32u);
  PartLayout overlap = l;
  overlap.parts[1][0].offset = {1, 0};
  overlap.parts[1][0].shape = {3, 2};
  EXPECT_NE(overlap.Validate().message().find("overlaps"), std::string::npos) << overlap.Validate().ToString();
  PartLayout gap = l;
  gap.parts[1][0].shape = {1, 2};
  EXPECT_NE(gap.Validate().message().find("cover 6 of its 8 elements"), std::string::npos) << gap.Validate().ToString();
  PartLayout outside = l;
  outside.parts[1][0].shape = {3, 2};
  EXPECT_NE(outside.Validate().message().find("does not fit"), std::string::npos);
  PartLayout disorder = l;
  std::swap(disorder.parts[0][0], disorder.parts[0][1]);
  EXPECT_NE(disorder.Validate().message().find("tensor order"), std::string::npos);
  PartLayout empty_part = l;
  empty_part.parts.push_back({});
  EXPECT_FALSE(empty_part.Validate().ok());
  PartLayout moved = l;
  moved.parts[0][1].offset = {0};
  EXPECT_EQ(moved.Digest(), digest);  // same layout, same digest
  moved.parts[0][0].shape = {2, 2};
  std::swap(moved.parts[0], moved.parts[1]);
  EXPECT_NE(moved.Digest(), digest);
}

// A fresh replica of `store` starts from the newest anchor's parts (one
// anchor applied) and holds `want`; verify --all replays every object of
// every part: `versions` verified, none bad.
void ExpectFreshReplicaAndVerified(const std::shared_ptr<Store>& store, const WeightState& want, size_t versions) {
  auto fresh = Replica::Create(store, ReplicaWithThreads(2));
  auto caught = fresh->Update();
  ASSERT_TRUE(caught.ok()) << caught.status().ToString();
  EXPECT_EQ(caught->anchors_applied, 1u);
  ExpectSameState(fresh->state(), want);
  VerifyOptions all;
  all.all = true;
  auto report = VerifyBucket(*store, all);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->verified.size(), versions);
  EXPECT_TRUE(report->bad_objects.empty());
}

class PartedPublishTest : public ::testing::TestWithParam<std::pair<size_t, size_t>> {};

TEST_P(PartedPublishTest, ReplicaFollowsBitForBitWithTheSingleProcessHash) {
  const auto [parts, dim] = GetParam();
  TempDir dir;
  auto store = OpenDirStore(dir.Sub("parted"));
  auto reference_store = OpenDirStore(dir.Sub("single"));
  RandomModel model(11);
  PublisherOptions options;
  options.anchor_interval = 4;
  options.threads = 2;
  PartLayout layout = SplitLayout(model.Views(), parts, dim);
  ASSERT_TRUE(layout.Validate().ok());
  Ranks ranks(store, layout, options);
  auto reference = Publisher::Open(reference_store, options);
  ASSERT_TRUE(reference.ok());
  ReplicaOptions tracking = ReplicaWithThreads(2);
  tracking.track_changes = true;
  auto replica = Replica::Create(store, tracking);
  for (uint64_t v = 1; v <= 10; ++v) {
    if (v > 1) model.Step(0.02);
    auto stats = ranks.Publish(v, model.Views());
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    auto single = (*reference)->Publish(v, model.Views());
    ASSERT_TRUE(single.ok()) << single.status().ToString();
    EXPECT_EQ(stats->state_hash, single->state_hash) << "version " << v;
    EXPECT_EQ(stats->changed_elements, single->changed_elements) << "version " << v;
    EXPECT_EQ(stats->wrote_anchor, single->wrote_anchor) << "version " << v;
    auto updated = replica->Update();
    ASSERT_TRUE(updated.ok()) << updated.status().ToString();
    ASSERT_EQ(replica->version(), v);
    EXPECT_EQ(updated->deltas_applied, v > 1 ? 1u : 0u);
    ExpectSameState(replica->state(), (*reference)->state());
    EXPECT_EQ(replica->state_hash(), single->state_hash);
    // The changed elements, merged from every part: strictly ascending flat
    // indices per tensor, as many as the version changed.
    ChangedElements changes = replica->TakeChanges();
    if (v > 1) {
      ASSERT_FALSE(changes.everything);
      uint64_t count = 0;
      for (const auto& [name, indices] : changes.tensors) {
        EXPECT_TRUE(std::adjacent_find(indices.begin(), indices.end(), std::greater_equal<uint64_t>()) ==
                    indices.end())
            << name << " at version " << v;
        count += indices.size();
      }
      EXPECT_EQ(count, single->changed_elements) << "version " << v;
    }
  }
  Manifest m = ReadManifest(*store);
  ASSERT_EQ(m.layouts.size(), 1u);
  EXPECT_EQ(m.Find(4)->objects.size(), 2u);  // an anchor version: the step delta and the anchor
  EXPECT_TRUE(m.Find(4)->anchor() && m.Find(4)->anchor()->parts.size() == parts);
  ExpectFreshReplicaAndVerified(store, (*reference)->state(), 10);
}

INSTANTIATE_TEST_SUITE_P(Layouts, PartedPublishTest,
                         ::testing::Values(std::pair<size_t, size_t>{1, 0}, std::pair<size_t, size_t>{2, 0},
                                           std::pair<size_t, size_t>{4, 1}, std::pair<size_t, size_t>{3, 0}));

TEST(PartedPublish, ManifestIsFormatVersion2AndRoundTrips) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model(3);
  PublisherOptions options;
  options.threads = 1;
  PartLayout layout = SplitLayout(model.Views(), 2, 0);
  Ranks ranks(store, layout, options);
  ASSERT_TRUE(ranks.Publish(1, model.Views()).ok());
  model.Step(0.05);
  ASSERT_TRUE(ranks.Publish(2, model.Views()).ok());
  auto blob = store->Get(kManifestKey);
  ASSERT_TRUE(blob.ok());
  const std::string json(reinterpret_cast<const char*>(blob->data()), blob->size());
  EXPECT_NE(json.find("\"format_version\": 2"), std::string::npos);
  EXPECT_NE(json.find("ds/parts/step_000002.delta_from_000001.part_00001_of_00002.safetensors"), std::string::npos);
  auto m = Manifest::Parse(blob->bytes());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->ToJson(), json);
  // A parted version in a format_version 1 manifest is refused.
  std::string v1 = json;
  v1.replace(v1.find("\"format_version\": 2"), 19, "\"format_version\": 1");
  auto refused = Manifest::Parse(ByteSpan(reinterpret_cast<const uint8_t*>(v1.data()), v1.size()));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("needs format_version 2"), std::string::npos)
      << refused.status().ToString();
  // A part hash that does not add up is refused.
  std::string wrong = json;
  const size_t at = wrong.find("\"parts\":[{\"state_hash\":\"") + 25;
  wrong[at] = wrong[at] == '0' ? '1' : '0';
  auto bad = Manifest::Parse(ByteSpan(reinterpret_cast<const uint8_t*>(wrong.data()), wrong.size()));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("descriptor terms plus its parts' hashes"), std::string::npos)
      << bad.status().ToString();
}

TEST(PartedPublish, AFailedPartCommitsNothingRollsBackEveryPartAndTheNextVersionCommits) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model(5);
  PublisherOptions options;
  options.anchor_interval = 3;
  options.threads = 1;
  PartLayout layout = SplitLayout(model.Views(), 3, 0);
  Ranks ranks(store, layout, options);
  auto replica = Replica::Create(store, ReplicaWithThreads(1));
  ASSERT_TRUE(ranks.Publish(1, model.Views()).ok());
  model.Step(0.05);
  ASSERT_TRUE(ranks.Publish(2, model.Views()).ok());
  const StateHash before = ranks.part(0).part_hash();
  model.Step(0.05);
  // Part 2 fails: parts 0 and 1 uploaded and applied their changes, then roll back.
  auto failed = ranks.Publish(3, model.Views(), /*fail=*/2);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("part 2 failed"), std::string::npos) << failed.status().ToString();
  EXPECT_EQ(ReadManifest(*store).Latest()->version, 2u);
  EXPECT_EQ(ranks.part(0).part_hash(), before);
  EXPECT_EQ(ranks.part(0).latest_version(), 2u);
  auto held = WeightState::FromViews(model.Views());
  // The next version commits (its delta is from version 2) and replicas follow it.
  auto next = ranks.Publish(4, model.Views());
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->state_hash, HashState(*ToPublishedState(model.Views(), {false, 1, [](std::string_view n) {
                                                   return n.ends_with("e_score_correction_bias");
                                                 }})));
  auto updated = replica->Update();
  ASSERT_TRUE(updated.ok()) << updated.status().ToString();
  EXPECT_EQ(replica->version(), 4u);
  EXPECT_EQ(replica->state_hash(), next->state_hash);
}

TEST(PartedPublish, AStoreFailureInOnePartCommitsNothing) {
  TempDir dir;
  auto base = OpenDirStore(dir.path());
  auto faulty = std::make_shared<testing::FaultStore>(base);
  RandomModel model(9);
  PublisherOptions options;
  options.threads = 1;
  PartLayout layout = SplitLayout(model.Views(), 2, 0);
  Ranks ranks(faulty, layout, options);
  ASSERT_TRUE(ranks.Publish(1, model.Views()).ok());
  model.Step(0.05);
  faulty->fail_write = [](std::string_view key) {
    return key.find("part_00001") != std::string_view::npos ? Status::IOError("disk full") : Status::OK();
  };
  ASSERT_FALSE(ranks.Publish(2, model.Views()).ok());
  faulty->fail_write = nullptr;
  auto again = ranks.Publish(3, model.Views());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto replica = Replica::Create(base, ReplicaWithThreads(1));
  ASSERT_TRUE(replica->Update().ok());
  EXPECT_EQ(replica->state_hash(), again->state_hash);
}

TEST(PartedPublish, RestartWithMorePartsContinuesWithDeltas) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model(13);
  PublisherOptions options;
  options.anchor_interval = 100;
  options.threads = 1;
  auto replica = Replica::Create(store, ReplicaWithThreads(1));
  {
    Ranks two(store, SplitLayout(model.Views(), 2, 0), options);
    ASSERT_TRUE(PublishVersions(two, model, 1, 3, 0.03));
  }
  ASSERT_TRUE(replica->Update().ok());
  Ranks four(store, SplitLayout(model.Views(), 4, 1), options);
  for (uint64_t v = 4; v <= 6; ++v) {
    model.Step(0.03);
    auto stats = four.Publish(v, model.Views());
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_TRUE(stats->wrote_delta);
    EXPECT_FALSE(stats->wrote_anchor);
    auto updated = replica->Update();
    ASSERT_TRUE(updated.ok()) << updated.status().ToString();
    EXPECT_EQ(updated->anchors_applied, 0u);
    EXPECT_EQ(replica->state_hash(), stats->state_hash);
  }
  EXPECT_EQ(ReadManifest(*store).layouts.size(), 2u);
  // A fresh replica replays across the layout change.
  auto fresh = Replica::Create(store, ReplicaWithThreads(1));
  ASSERT_TRUE(fresh->Update().ok());
  ExpectSameState(fresh->state(), replica->state());
}

TEST(PartedPublish, ReplicaRoutesAroundADamagedPartAndGcRemovesEveryPart) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model(17);
  PublisherOptions options;
  options.anchor_interval = 3;
  options.threads = 1;
  Ranks ranks(store, SplitLayout(model.Views(), 2, 0), options);
  ASSERT_TRUE(PublishVersions(ranks, model, 1, 7, 0.03));
  // Damage part 1 of version 7's delta: the only route from the held 6.
  Manifest m = ReadManifest(*store);
  const ObjectEntry* delta7 = m.Find(7)->delta();
  ASSERT_TRUE(delta7 && delta7->parted());
  DamageLastByte(dir.path(), delta7->parts[1].key);
  auto replica = Replica::Create(store, ReplicaWithThreads(1));
  ASSERT_TRUE(replica->Update(6).ok());
  auto blocked = replica->Update();
  ASSERT_FALSE(blocked.ok());
  ASSERT_EQ(replica->bad_objects().size(), 1u);
  EXPECT_EQ(replica->bad_objects()[0].key, delta7->parts[1].key);
  EXPECT_EQ(replica->version(), 6u);
  // gc: keep the newest anchor (6): every part of the older versions goes.
  auto pruned = PruneVersions(*store, 1);
  ASSERT_TRUE(pruned.ok()) << pruned.status().ToString();
  EXPECT_EQ(pruned->kept_versions, 2u);
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir.path()) / PartAnchorKey(1, 0, 2)));
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir.path()) / PartAnchorKey(1, 1, 2)));
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir.path()) / PartDeltaKey(6, 5, 1, 2)));
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(dir.path()) / PartAnchorKey(6, 1, 2)));
  Manifest after = ReadManifest(*store);
  EXPECT_EQ(after.versions.front().version, 6u);
}

// How version 3's parted delta is spoiled for a replica on version 2.
enum class PartFault {
  kOtherObject,  // the last part's object is another well-formed part (version 2's): refused while decoding
  kPartHash,     // the manifest's hash of the last part is wrong (and the version's, to match):
                 // refused after every part is written
};

struct PartFaultCase {
  size_t parts, dim;
  PartFault fault;
};
// Named by its fields: GoogleTest's default printer dumps the struct's bytes,
// its padding too (valgrind: uninitialised values read in main).
void PrintTo(const PartFaultCase& c, std::ostream* os) {
  *os << c.parts << " parts, dim " << c.dim << ", fault " << static_cast<int>(c.fault);
}

class PartedUndoTest : public ::testing::TestWithParam<PartFaultCase> {};

// A replica applies each part straight into its blocks of the held state
// (row ranges in place, other blocks copied out and back): whichever check
// refuses the version, every part written before it is put back.
TEST_P(PartedUndoTest, ReplicaStaysBitForBitOnItsVersionWhenAPartOrTheVersionFails) {
  const PartFaultCase c = GetParam();
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model(19);
  PublisherOptions options;
  options.threads = 1;
  Ranks ranks(store, SplitLayout(model.Views(), c.parts, c.dim), options);
  ASSERT_TRUE(PublishVersions(ranks, model, 1, 3, 0.05));
  auto replica = Replica::Create(store, ReplicaWithThreads(2));
  ASSERT_TRUE(replica->Update(2).ok());
  auto copied = WeightState::FromViews(replica->state().views());
  ASSERT_TRUE(copied.ok());
  const WeightState before = std::move(*copied);
  const StateHash before_hash = replica->state_hash();
  Manifest m = ReadManifest(*store);
  VersionEntry* v3 = nullptr;
  for (VersionEntry& v : m.versions) {
    if (v.version == 3) v3 = &v;
  }
  ASSERT_TRUE(v3 && v3->delta() && v3->delta()->parted());
  ObjectEntry* delta3 = nullptr;
  for (ObjectEntry& o : v3->objects) {
    if (o.kind == PatchKind::kDelta) delta3 = &o;
  }
  const size_t last = c.parts - 1;
  std::string expect;
  switch (c.fault) {
    case PartFault::kOtherObject: {
      // Listed with its true size and digest: the earlier parts are written,
      // the last is refused (it names another base).
      auto other = store->Get(m.Find(2)->delta()->parts[last].key);
      ASSERT_TRUE(other.ok());
      ASSERT_TRUE(store->Put(delta3->parts[last].key, other->bytes()).ok());
      delta3->size += other->size() - delta3->parts[last].size;
      delta3->parts[last].size = other->size();
      delta3->parts[last].xxh3_128 = Xxh3Hex(other->bytes());
      expect = "part " + std::to_string(last) + " of " + std::to_string(c.parts);
      break;
    }
    case PartFault::kPartHash:
      // The manifest checks that the parts' hashes add up to the version's.
      v3->parts[last].state_hash.lo += 1;
      v3->state_hash.lo += 1;
      expect = "part " + std::to_string(last) + " of " + std::to_string(c.parts) + "): its blocks would hash to";
      break;
  }
  const std::string json = m.ToJson();
  ASSERT_TRUE(store->Put(kManifestKey, ByteSpan(reinterpret_cast<const uint8_t*>(json.data()), json.size())).ok());
  auto failed = replica->Update();
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find(expect), std::string::npos) << failed.status().ToString();
  EXPECT_EQ(replica->version(), 2u);
  EXPECT_EQ(replica->state_hash(), before_hash);
  ExpectSameState(replica->state(), before);
  EXPECT_TRUE(replica->Verify().ok());
}

INSTANTIATE_TEST_SUITE_P(
    LayoutsAndFaults, PartedUndoTest,
    ::testing::Values(PartFaultCase{2, 0, PartFault::kOtherObject}, PartFaultCase{2, 0, PartFault::kPartHash},
                      PartFaultCase{3, 1, PartFault::kOtherObject}, PartFaultCase{3, 1, PartFault::kPartHash},
                      PartFaultCase{1, 0, PartFault::kPartHash}));

TEST(PartedPublish, RefusesSettingsAndBlocksItCannotPublish) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model(19);
  PartLayout layout = SplitLayout(model.Views(), 2, 0);
  PublisherOptions cumulative;
  cumulative.cumulative_interval = 4;
  auto refused = PartPublisher::Open(store, layout, 0, cumulative);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("cumulative deltas"), std::string::npos);
  PublisherOptions trl;
  trl.encoding = IndexEncoding::kGapDelta;
  EXPECT_FALSE(PartCommitter::Open(store, layout, trl).ok());
  auto pub = PartPublisher::Open(store, layout, 1, {});
  ASSERT_TRUE(pub.ok());
  PartBlocks wrong = BlocksOf(layout, 0, model.Views());  // part 0's blocks given to part 1
  auto r = (*pub)->Publish(1, wrong.views);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("the layout says"), std::string::npos) << r.status().ToString();
}

// Tensor names where one is another's prefix followed by a byte that sorts
// below the compressed anchor's stream suffix ("m", "m-c", "m.b": their
// streams "m-c.zan" < "m.b.zan" < "m.zan"): the parted anchor's blocks are
// checked in the layout's (name) order, and load; a replica follows and a
// fresh one starts from the anchor, bit for bit with the single publisher.
TEST(PartedPublish, AnAnchorOfNamesThatArePrefixesOfOthersLoads) {
  TempDir dir;
  auto store = OpenDirStore(dir.Sub("parted"));
  auto reference_store = OpenDirStore(dir.Sub("single"));
  RandomModel model(23);
  model.tensors()[0].name = "m-c";
  model.tensors()[1].name = "m";
  model.tensors()[2].name = "m.b";
  PublisherOptions options;
  options.anchor_interval = 2;
  options.threads = 2;
  PartLayout layout = SplitLayout(model.Views(), 2, 0);
  ASSERT_TRUE(layout.Validate().ok());
  Ranks ranks(store, layout, options);
  auto reference = Publisher::Open(reference_store, options);
  ASSERT_TRUE(reference.ok());
  auto replica = Replica::Create(store, ReplicaWithThreads(2));
  for (uint64_t v = 1; v <= 3; ++v) {
    if (v > 1) model.Step(0.02);
    auto stats = ranks.Publish(v, model.Views());
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    ASSERT_TRUE((*reference)->Publish(v, model.Views()).ok());
    auto updated = replica->Update();
    ASSERT_TRUE(updated.ok()) << updated.status().ToString();
    ExpectSameState(replica->state(), (*reference)->state());
  }
  ExpectFreshReplicaAndVerified(store, (*reference)->state(), 3);
}

}  // namespace
}  // namespace deltasync
