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

}  // namespace
}  // namespace deltasync
