// Adversarial review of the parted paths (session 48, H2): receipts a
// committer must refuse (another part's or version's object, a malformed
// digest, a stale or foreign receipt) so that the manifest it writes is
// always one every reader parses, and layouts whose tensors are not the
// bucket's (tensors without elements included) refused before anything is
// committed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "deltasync/changes.h"
#include "deltasync/folder_parts.h"
#include "deltasync/hf_folder.h"
#include "deltasync/manifest.h"
#include "deltasync/part_publisher.h"
#include "deltasync/parts.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "testing/bucket_util.h"
#include "testing/parts_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"
#include "testing/test_bytes.h"

namespace deltasync {
namespace {

using testing::BlocksOf;
using testing::OpenDirStore;
using testing::RandomModel;
using testing::SplitLayout;
using testing::TempDir;

// Two part publishers and a committer on one bucket, version 1 committed.
struct TwoRanks {
  TempDir dir;
  std::shared_ptr<Store> store = OpenDirStore(dir.path());
  RandomModel model{21};
  PartLayout layout = SplitLayout(model.Views(), 2, 0);
  PublisherOptions options;
  std::vector<std::unique_ptr<PartPublisher>> pubs;
  std::unique_ptr<PartCommitter> committer;

  TwoRanks() {
    options.threads = 1;
    options.anchor_interval = 100;
    for (uint32_t p = 0; p < 2; ++p) {
      auto pub = PartPublisher::Open(store, layout, p, options);
      EXPECT_TRUE(pub.ok()) << pub.status().ToString();
      pubs.push_back(std::move(*pub));
    }
    auto c = PartCommitter::Open(store, layout, options);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    committer = std::move(*c);
    std::vector<PartReceipt> first = Receipts(1);
    EXPECT_TRUE(committer->Commit(1, first).ok());
    Finish(true);
  }
  std::vector<PartReceipt> Receipts(uint64_t version) {
    std::vector<PartReceipt> out;
    for (size_t p = 0; p < pubs.size(); ++p) {
      testing::PartBlocks blocks = BlocksOf(layout, p, model.Views());
      auto r = pubs[p]->Publish(version, blocks.views);
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      out.push_back(*r);
    }
    return out;
  }
  void Finish(bool committed) {
    for (auto& pub : pubs) pub->Finish(committed);
  }
};

TEST(PartsReview, TheCommitterRefusesReceiptsWhoseManifestReadersCouldNotParseOrTrust) {
  TwoRanks ranks;
  const Manifest v1 = testing::ReadManifest(*ranks.store);
  ranks.model.Step(0.05);
  const std::vector<PartReceipt> good = ranks.Receipts(2);
  PartReceipt stale = good[1];
  stale.version = 1;
  struct Case {
    const char* what;
    std::function<void(std::vector<PartReceipt>&)> tamper;
    const char* says;
  };
  const std::vector<Case> cases = {
      // Part 1 lists part 0's object: the key would be listed twice.
      {"another part's object",
       [](auto& r) { r[1].objects[0] = r[0].objects[0]; },
       "part 1: it lists the object 'ds/parts/step_000002.delta_from_000001.part_00000_of_00002.safetensors'"},
      // Part 1 lists an object of version 1 (its anchor).
      {"another version's object",
       [&](auto& r) {
         r[1].objects[0].key = v1.Find(1)->anchor()->parts[1].key;
         r[1].objects[0].xxh3_128 = v1.Find(1)->anchor()->parts[1].xxh3_128;
       },
       "its delta is 'ds/parts/step_000002.delta_from_000001.part_00001_of_00002.safetensors'"},
      {"an upper-case digest",
       [](auto& r) {
         for (char& c : r[1].objects[0].xxh3_128) c = static_cast<char>(std::toupper(c));
       },
       "not 32 lower-case hex digits"},
      {"a short digest", [](auto& r) { r[0].objects[0].xxh3_128 = "abc"; }, "not 32 lower-case hex digits"},
      {"sizes that overflow", [](auto& r) { r[1].objects[0].size = UINT64_MAX; }, "overflow"},
      // What held before the review (the same refusals, kept tested).
      {"a receipt of another version", [&](auto& r) { r[1] = stale; }, "its receipt is for version 1"},
      {"a receipt of another layout", [](auto& r) { r[0].layout = std::string(32, 'a'); }, "for layout aaaa"},
      {"a receipt published on an older version", [](auto& r) { r[1].base_version = 0; },
       "published on version 0"},
      {"two receipts for one part", [](auto& r) { r[1] = r[0]; }, "two receipts for part 0"},
      {"a missing part", [](auto& r) { r.pop_back(); }, "no receipt for part 1"},
      {"a part of another part count", [](auto& r) { r[1].parts = 3; }, "the layout has 2 parts"},
      {"a failed part", [](auto& r) { r[0].error = "boom"; }, "part 0 failed: boom"},
      {"a delta from another base", [](auto& r) { r[0].objects[0].base_version = 0; }, "a delta from version 0"},
      {"an anchor the cadence does not call for",
       [](auto& r) {
         r[0].objects.push_back(r[0].objects[0]);
         r[0].objects[1].kind = PatchKind::kAnchor;
       },
       "objects"},
      {"more changed elements than the part holds",
       [&](auto& r) { r[0].changed_elements = ranks.layout.PartElements(0) + 1; }, "more changed elements"},
  };
  for (const Case& c : cases) {
    std::vector<PartReceipt> receipts = good;
    c.tamper(receipts);
    auto refused = ranks.committer->Commit(2, receipts);
    ASSERT_FALSE(refused.ok()) << c.what;
    EXPECT_EQ(refused.status().code(), ErrorCode::kFailedPrecondition) << c.what;
    EXPECT_NE(refused.status().message().find(c.says), std::string::npos) << c.what << ": " << refused.status().ToString();
    // Nothing was written: the bucket still parses and ends at version 1.
    auto m = FetchManifest(*ranks.store);
    ASSERT_TRUE(m.ok()) << c.what << ": " << m.status().ToString();
    EXPECT_EQ(m->Latest()->version, 1u) << c.what;
  }
  // The true receipts commit, and a replica follows.
  auto stats = ranks.committer->Commit(2, good);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  ranks.Finish(true);
  auto replica = Replica::Create(ranks.store, ReplicaWithThreads(1));
  ASSERT_TRUE(replica->Update().ok());
  EXPECT_EQ(replica->version(), 2u);
  EXPECT_EQ(replica->state_hash(), stats->state_hash);
}

// A bf16 tensor of `shape` filled from `seed`.
using Owned = testing::OwnedBf16;
Owned Tensor(std::string name, std::vector<uint64_t> shape, uint8_t seed) {
  // High bytes 0x3f: finite bf16 values.
  return testing::MakeBf16(std::move(name), std::move(shape),
                           [&](size_t i) { return i % 2 ? uint8_t{0x3f} : static_cast<uint8_t>(seed + i); });
}

// Two parts of whole tensors a and b; the third tensor (no elements) has no block.
PartLayout WholeTensorLayout(const std::string& empty_name, std::vector<uint64_t> empty_shape) {
  PartLayout l;
  l.tensors = {{"a", DType::kBF16, {8, 4}}, {"b", DType::kBF16, {8, 4}}, {empty_name, DType::kBF16, empty_shape}};
  std::sort(l.tensors.begin(), l.tensors.end(), [](const TensorDesc& x, const TensorDesc& y) { return x.name < y.name; });
  auto index = [&](const std::string& n) {
    for (uint32_t i = 0; i < l.tensors.size(); ++i) {
      if (l.tensors[i].name == n) return i;
    }
    return uint32_t{0};
  };
  l.parts = {{{index("a"), {0, 0}, {8, 4}}}, {{index("b"), {0, 0}, {8, 4}}}};
  return l;
}

TEST(PartsReview, ALayoutWhoseEmptyTensorIsNotTheBucketsIsRefusedBeforeAnythingIsCommitted) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  PublisherOptions options;
  options.threads = 1;
  // Version 1, unparted: a, b and z, a tensor with no elements.
  const std::vector<Owned> v1 = {Tensor("a", {8, 4}, 1), Tensor("b", {8, 4}, 2), Tensor("z", {0, 4}, 0)};
  {
    auto pub = Publisher::Open(store, options);
    ASSERT_TRUE(pub.ok()) << pub.status().ToString();
    std::vector<TensorView> views;
    for (const Owned& t : v1) views.push_back(t.view());
    ASSERT_TRUE((*pub)->Publish(1, views).ok());
  }
  // Layouts that differ from version 1's tensors only in the empty tensor:
  // same count, same elements, the same blocks.
  for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<uint64_t>>>{
           {"y", {0, 4}}, {"z", {4, 0}}, {"z", {0}}}) {
    const PartLayout layout = WholeTensorLayout(name, shape);
    ASSERT_TRUE(layout.Validate().ok()) << layout.Validate().ToString();
    // One process publishing every part (--parts per-file).
    auto all = PartPublisher::OpenAll(store, layout, options);
    ASSERT_FALSE(all.ok()) << "'" << name << "' " << ShapeToString(shape) << " was accepted by OpenAll";
    EXPECT_EQ(all.status().code(), ErrorCode::kInvalidArgument) << all.status().ToString();
    EXPECT_NE(all.status().message().find("tensors"), std::string::npos) << all.status().ToString();
    // A rank on its own (PartPublisher::Open) refuses it too.
    auto one = PartPublisher::Open(store, layout, 0, options);
    ASSERT_FALSE(one.ok());
    EXPECT_EQ(one.status().code(), ErrorCode::kInvalidArgument) << one.status().ToString();
  }
  // The layout of the bucket's own tensors publishes, and a replica follows.
  const PartLayout same = WholeTensorLayout("z", {0, 4});
  auto all = PartPublisher::OpenAll(store, same, options);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  auto committer = PartCommitter::Open(store, same, options);
  ASSERT_TRUE(committer.ok()) << committer.status().ToString();
  const std::vector<Owned> v2 = {Tensor("a", {8, 4}, 5), Tensor("b", {8, 4}, 2)};
  std::vector<PartReceipt> receipts;
  for (size_t p = 0; p < 2; ++p) {
    std::vector<TensorView> blocks = {v2[p].view()};
    auto r = (*all)[p]->Publish(2, blocks);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    receipts.push_back(*r);
  }
  auto stats = (*committer)->Commit(2, receipts);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  for (auto& pub : *all) pub->Finish(true);
  auto replica = Replica::Create(store, ReplicaWithThreads(1));
  auto updated = replica->Update();
  ASSERT_TRUE(updated.ok()) << updated.status().ToString();
  EXPECT_EQ(replica->version(), 2u);
  EXPECT_EQ(replica->state_hash(), stats->state_hash);
  EXPECT_TRUE(replica->state().Find("a")->data == v2[0].bytes);
  EXPECT_NE(replica->state().Find("z"), nullptr);
}

TEST(PartsReview, AFolderSavedIntoWhileItsPartsAreReadIsNotCommitted) {
  // --parts per-file: the shards read, then the trainer's next save
  // replaces one of them before the commit. The parts already read hold the
  // old file (its mapping lives on) and the others would be new: refused.
  TempDir dir;
  auto store = OpenDirStore(dir.path() + "/bucket");
  RandomModel model(3);
  const std::string ckpt = dir.path() + "/ckpt";
  HfWriteOptions write;
  write.max_shard_bytes = 10'000;
  ASSERT_TRUE(WriteHfFolder(ckpt, model.Views(), {}, write).ok());
  auto folder = ReadHfFolder(ckpt);
  ASSERT_TRUE(folder.ok()) << folder.status().ToString();
  ASSERT_GE(folder->shards.size(), 2u);
  model.Step(0.1);
  write.replace = true;
  ASSERT_TRUE(WriteHfFolder(ckpt, model.Views(), {}, write).ok());  // swapped in under the reader
  PublisherOptions options;
  options.threads = 1;
  auto refused = PublishFolderParts(store, 1, *folder, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kFailedPrecondition) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("changed while the folder was read"), std::string::npos)
      << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("version 1 not committed"), std::string::npos)
      << refused.status().ToString();
  EXPECT_EQ(FetchManifest(*store).status().code(), ErrorCode::kNotFound);
  // Read again, it publishes, and a replica holds the new save bit for bit.
  auto reread = ReadHfFolder(ckpt);
  ASSERT_TRUE(reread.ok()) << reread.status().ToString();
  auto published = PublishFolderParts(store, 1, *reread, options);
  ASSERT_TRUE(published.ok()) << published.status().ToString();
  auto replica = Replica::Create(store, ReplicaWithThreads(1));
  ASSERT_TRUE(replica->Update().ok());
  auto want = ToPublishedState(model.Views(), {false, 1, [](std::string_view n) {
                                                 return n.ends_with("e_score_correction_bias");
                                               }});
  ASSERT_TRUE(want.ok());
  testing::ExpectSameState(replica->state(), *want);
}

TEST(PartsReview, ATrackingReplicaGetsEachTensorsChangesAscendingFromEveryPart) {
  // Column blocks (Shard(1)) interleave the parts' flat indices, so the
  // parts' changes of one tensor are merged by sorting (MergeParts): the
  // replica's changed elements must be exactly the elements that differ, each
  // tensor's strictly ascending (ChangedElements' contract).
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model(31);
  PublisherOptions options;
  options.threads = 1;
  options.anchor_interval = 100;
  testing::Ranks ranks(store, SplitLayout(model.Views(), 3, 1), options);
  ReplicaOptions tracking = ReplicaWithThreads(1);
  tracking.track_changes = true;
  auto replica = Replica::Create(store, tracking);
  auto published = [&]() -> WeightState {
    Result<WeightState> state = ToPublishedState(model.Views(), {false, 1, [](std::string_view n) {
                                                   return n.ends_with("e_score_correction_bias");
                                                 }});
    EXPECT_TRUE(state.ok());
    return std::move(*state);
  };
  ASSERT_TRUE(ranks.Publish(1, model.Views()).ok());
  ASSERT_TRUE(replica->Update().ok());
  EXPECT_TRUE(replica->TakeChanges().everything);
  WeightState before = published();
  for (uint64_t v = 2; v <= 3; ++v) {
    model.Step(0.05);
    ASSERT_TRUE(ranks.Publish(v, model.Views()).ok());
    ASSERT_TRUE(replica->Update().ok());
    WeightState after = published();
    ChangedElements changes = replica->TakeChanges();
    ASSERT_FALSE(changes.everything);
    size_t multi_part_tensors = 0;
    for (const WeightState::Tensor& t : after.tensors()) {
      const size_t width = DTypeSize(t.dtype);
      std::vector<uint64_t> want;
      for (uint64_t i = 0; i < t.data.size() / width; ++i) {
        if (std::memcmp(t.data.data() + i * width, before.Find(t.name)->data.data() + i * width, width) != 0) {
          want.push_back(i);
        }
      }
      auto got = std::find_if(changes.tensors.begin(), changes.tensors.end(),
                              [&](const auto& c) { return c.first == t.name; });
      if (want.empty()) {
        EXPECT_EQ(got, changes.tensors.end()) << t.name;
        continue;
      }
      ASSERT_NE(got, changes.tensors.end()) << t.name;
      EXPECT_EQ(got->second, want) << "version " << v << ": " << t.name;
      multi_part_tensors += t.shape.size() > 1 ? 1 : 0;
    }
    EXPECT_GT(multi_part_tensors, 0u);
    testing::ExpectSameState(replica->state(), after);
    before = std::move(after);
  }
}

}  // namespace
}  // namespace deltasync
