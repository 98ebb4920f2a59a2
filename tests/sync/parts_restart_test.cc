// Restarting a parted publisher with another layout (docs/format.md, "Parts":
// restarting with another layout): each rank reads only the objects of the
// parts its blocks depend on, and the versions after the restart equal a
// single-process Publisher's bit for bit.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <set>

#include "deltasync/manifest.h"
#include "deltasync/part_publisher.h"
#include "deltasync/parts.h"
#include "deltasync/plan.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "testing/bucket_util.h"
#include "testing/fault_store.h"
#include "testing/parts_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::DamageLastByte;
using testing::ExpectSameState;
using testing::OpenDirStore;
using testing::Ranks;
using testing::RandomModel;
using testing::ReadManifest;
using testing::SplitLayout;
using testing::TempDir;

// Records the keys read under ds/ and their bytes.
class CountingStore : public testing::FaultStore {
 public:
  using FaultStore::FaultStore;
  Result<Blob> Get(std::string_view key) override {
    Result<Blob> blob = FaultStore::Get(key);
    if (blob.ok() && key.starts_with("ds/")) {
      std::lock_guard<std::mutex> lock(mu_);
      keys_.insert(std::string(key));
      bytes_ += blob->size();
    }
    return blob;
  }
  Result<Blob> GetRange(std::string_view key, uint64_t offset, uint64_t length) override {
    ADD_FAILURE() << "ranged read of " << key;
    return FaultStore::GetRange(key, offset, length);
  }
  std::set<std::string> keys() const { return keys_; }
  uint64_t bytes() const { return bytes_; }

 private:
  std::mutex mu_;
  std::set<std::string> keys_;
  uint64_t bytes_ = 0;
};

bool Overlaps(const PartLayout& a, size_t pa, const PartLayout& b, size_t pb) {
  for (const Block& x : a.parts[pa]) {
    for (const Block& y : b.parts[pb]) {
      if (a.tensors[x.tensor].name != b.tensors[y.tensor].name) continue;
      bool meet = true;
      for (size_t d = 0; d < x.offset.size(); ++d) {
        if (x.offset[d] + x.shape[d] <= y.offset[d] || y.offset[d] + y.shape[d] <= x.offset[d]) meet = false;
      }
      if (meet) return true;
    }
  }
  return false;
}

// The keys part `q` of `layout` needs to rebuild the newest version of a
// bucket published in one layout: along the replica's chain, every unparted
// object, and of a parted one the parts overlapping part q.
std::set<std::string> NeededKeys(const Manifest& m, const PartLayout& layout, size_t q, uint64_t* bytes) {
  auto plan = PlanCatchUp(m, std::nullopt, m.Latest()->version);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  std::set<std::string> keys;
  *bytes = 0;
  for (const PlanStep& step : plan->steps) {
    const VersionEntry& v = *m.Find(step.version);
    if (!step.object.parted()) {
      keys.insert(step.object.key);
      *bytes += step.object.size;
      continue;
    }
    for (size_t p = 0; p < step.object.parts.size(); ++p) {
      if (Overlaps(*m.LayoutOf(v), p, layout, q)) {
        keys.insert(step.object.parts[p].key);
        *bytes += step.object.parts[p].size;
      }
    }
  }
  return keys;
}

struct Restart {
  size_t old_parts;  // 0: published by one process (a P=1 bucket)
  size_t old_dim;
  size_t new_parts;
  size_t new_dim;
};

class PartedRestartTest : public ::testing::TestWithParam<Restart> {};

TEST_P(PartedRestartTest, EachRankReadsOnlyTheObjectsItsBlocksNeedAndContinuesBitForBit) {
  const Restart r = GetParam();
  TempDir dir;
  auto store = OpenDirStore(dir.Sub("bucket"));
  auto reference_store = OpenDirStore(dir.Sub("single"));
  RandomModel model(21);
  PublisherOptions options;
  options.anchor_interval = 4;
  options.threads = 1;
  options.cumulative_interval = 0;
  options.anchor_max_fraction = 0;
  auto reference = Publisher::Open(reference_store, options);
  ASSERT_TRUE(reference.ok()) << reference.status().ToString();
  {
    std::unique_ptr<Ranks> old_ranks;
    std::unique_ptr<Publisher> single;
    if (r.old_parts > 0) {
      old_ranks = std::make_unique<Ranks>(store, SplitLayout(model.Views(), r.old_parts, r.old_dim), options);
    } else {
      auto opened = Publisher::Open(store, options);
      ASSERT_TRUE(opened.ok()) << opened.status().ToString();
      single = std::move(*opened);
    }
    for (uint64_t v = 1; v <= 6; ++v) {
      if (v > 1) model.Step(0.03);
      auto stats = old_ranks ? old_ranks->Publish(v, model.Views()) : single->Publish(v, model.Views());
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
      ASSERT_TRUE((*reference)->Publish(v, model.Views()).ok());
    }
  }
  const Manifest m = ReadManifest(*store);
  uint64_t chain_bytes = 0;
  auto chain = PlanCatchUp(m, std::nullopt, 6);
  ASSERT_TRUE(chain.ok()) << chain.status().ToString();
  for (const PlanStep& step : chain->steps) chain_bytes += step.object.size;

  // The new ranks, each through its own counting store.
  const PartLayout layout = SplitLayout(model.Views(), r.new_parts, r.new_dim);
  std::vector<std::shared_ptr<CountingStore>> counting;
  std::vector<std::shared_ptr<Store>> part_stores;
  for (size_t q = 0; q < r.new_parts; ++q) {
    counting.push_back(std::make_shared<CountingStore>(store));
    part_stores.push_back(counting.back());
  }
  Ranks ranks(store, layout, options, part_stores);
  bool some_rank_read_less = false;
  for (size_t q = 0; q < r.new_parts; ++q) {
    uint64_t needed_bytes = 0;
    const std::set<std::string> needed = NeededKeys(m, layout, q, &needed_bytes);
    EXPECT_EQ(counting[q]->keys(), needed) << "rank " << q;
    EXPECT_EQ(counting[q]->bytes(), needed_bytes) << "rank " << q;
    if (needed_bytes < chain_bytes) some_rank_read_less = true;
    // Its blocks of version 6, exactly.
    auto full = WeightState::FromViews((*reference)->state().views());
    auto want = ExtractPart(layout, q, *full);
    ASSERT_TRUE(want.ok());
    ExpectSameState(ranks.part(q).state(), *want);
    EXPECT_EQ(ranks.part(q).part_hash(), HashPart(layout, q, *want));
    EXPECT_EQ(ranks.part(q).latest_version(), 6u);
  }
  // Split along the same dimension, some rank reads less than the whole
  // chain (across dimensions every old part overlaps every new one).
  if (r.old_parts > 1 && r.old_dim == r.new_dim) EXPECT_TRUE(some_rank_read_less);

  // The next versions are deltas in the new layout, equal to one process's.
  auto replica = Replica::Create(store, ReplicaWithThreads(1));
  for (uint64_t v = 7; v <= 9; ++v) {
    model.Step(0.03);
    auto stats = ranks.Publish(v, model.Views());
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    auto single = (*reference)->Publish(v, model.Views());
    ASSERT_TRUE(single.ok()) << single.status().ToString();
    EXPECT_TRUE(stats->wrote_delta);
    EXPECT_EQ(stats->wrote_anchor, single->wrote_anchor) << "version " << v;
    EXPECT_EQ(stats->state_hash, single->state_hash) << "version " << v;
    auto updated = replica->Update();
    ASSERT_TRUE(updated.ok()) << updated.status().ToString();
    ExpectSameState(replica->state(), (*reference)->state());
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PartedRestartTest,
                         ::testing::Values(Restart{2, 0, 4, 0}, Restart{4, 0, 2, 0}, Restart{4, 1, 2, 0},
                                           Restart{0, 0, 2, 0}, Restart{2, 0, 3, 1}),
                         [](const ::testing::TestParamInfo<Restart>& info) {
                           const Restart& r = info.param;
                           return (r.old_parts ? std::to_string(r.old_parts) + "_dim" + std::to_string(r.old_dim)
                                               : std::string("single")) +
                                  "_to_" + std::to_string(r.new_parts) + "_dim" + std::to_string(r.new_dim);
                         });

TEST(PartedRestart, ARankSkipsDamageItDoesNotNeedAndRoutesAroundDamageItDoes) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model(23);
  PublisherOptions options;
  options.anchor_interval = 4;
  options.threads = 1;
  {
    Ranks two(store, SplitLayout(model.Views(), 2, 0), options);
    ASSERT_TRUE(PublishVersions(two, model, 1, 6, 0.03));
  }
  const PartLayout four = SplitLayout(model.Views(), 4, 0);
  const Manifest m = ReadManifest(*store);
  const ObjectEntry* delta6 = m.Find(6)->delta();
  const ObjectEntry* anchor4 = m.Find(4)->anchor();
  ASSERT_TRUE(delta6 && anchor4);
  // Rank 0's blocks of version 6, from a replica before any damage.
  auto replica = Replica::Create(store, ReplicaWithThreads(1));
  ASSERT_TRUE(replica->Update().ok());
  auto want = ExtractPart(four, 0, replica->state());
  ASSERT_TRUE(want.ok());

  // Rank 0 of 4 overlaps only old part 0: old part 1's damage is not its concern.
  DamageLastByte(dir.path(), delta6->parts[1].key);
  auto counting = std::make_shared<CountingStore>(store);
  auto opened = PartPublisher::Open(counting, four, 0, options);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(counting->keys().count(delta6->parts[1].key), 0u);

  // A damaged anchor part it needs: routed around, from the older anchor.
  DamageLastByte(dir.path(), anchor4->parts[0].key);
  counting = std::make_shared<CountingStore>(store);
  opened = PartPublisher::Open(counting, four, 0, options);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(counting->keys().count(m.Find(1)->anchor()->parts[0].key), 1u);
  EXPECT_EQ(counting->keys().count(m.Find(2)->delta()->parts[0].key), 1u);
  EXPECT_EQ((*opened)->latest_version(), 6u);
  ExpectSameState((*opened)->state(), *want);

  // A damaged delta part it needs, on the only route: an error naming it.
  DamageLastByte(dir.path(), delta6->parts[0].key);
  opened = PartPublisher::Open(store, four, 0, options);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), ErrorCode::kIntegrity) << opened.status().ToString();
  EXPECT_NE(opened.status().message().find(delta6->parts[0].key), std::string::npos) << opened.status().ToString();
  EXPECT_NE(opened.status().message().find("cannot continue publishing part 0"), std::string::npos)
      << opened.status().ToString();
}

TEST(PartedRestart, ALayoutWhoseTensorsAreNotTheBucketsIsRefusedNamingTheTensor) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model(29);
  PublisherOptions options;
  options.threads = 1;
  {
    Ranks two(store, SplitLayout(model.Views(), 2, 0), options);
    ASSERT_TRUE(two.Publish(1, model.Views()).ok());
  }
  PartLayout other = SplitLayout(model.Views(), 2, 0);
  other.tensors[0].shape[0] += 1;  // one more row in the first tensor, which the last part takes
  for (Block& b : other.parts.back()) {
    if (b.tensor == 0) b.shape[0] += 1;
  }
  ASSERT_TRUE(other.Validate().ok()) << other.Validate().ToString();
  auto opened = PartPublisher::Open(store, other, 0, options);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), ErrorCode::kInvalidArgument) << opened.status().ToString();
  EXPECT_NE(opened.status().message().find("'" + other.tensors[0].name + "'"), std::string::npos)
      << opened.status().ToString();
}

}  // namespace
}  // namespace deltasync
