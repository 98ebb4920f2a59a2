// The class totals a replica holds for the compact apply
// (CompactClassTotals): kept per part across parted versions, forgotten
// whenever parts are put back, a wrong held count still giving the exact
// state (reported stale), and the held applies reported.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "codec/compact_bf16.h"
#include "deltasync/parts.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "sync/replay.h"
#include "testing/bucket_util.h"
#include "testing/parts_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::ExpectSameState;
using testing::OpenDirStore;
using testing::Ranks;
using testing::RandomModel;
using testing::ReadManifest;
using testing::SplitLayout;
using testing::TempDir;

// RandomModel's tensors and one of 3 chunks of the walk (196,608 elements,
// values across many exponent classes): tensors of several chunks have
// starts that only the look-back or held totals give.
RandomModel LargeModel(uint64_t seed) {
  RandomModel model(seed);
  RandomModel::Tensor t{"model.layers.0.mlp.down_proj.weight", DType::kBF16, {768, 256}, {}};
  t.data.resize(768 * 256 * 2);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.05f);
  for (size_t i = 0; i < 768 * 256; ++i) {
    const float f = n(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    const uint16_t b = static_cast<uint16_t>(bits >> 16);
    std::memcpy(t.data.data() + 2 * i, &b, 2);
  }
  model.tensors().push_back(std::move(t));
  return model;
}

WeightState StateOf(const RandomModel& model) { return std::move(WeightState::FromViews(model.Views())).value(); }

// Versions 1..8 published (unparted, or parted into `parts`: row-range
// blocks in place, column blocks through a copy), followed by a replica one
// version per update: each delta is one fused compact apply per part, all
// held but the first delta's (the anchor is loaded, not walked: that first
// apply fills the totals; a parted replica keeps each part's from version
// to version), none stale, as the replica reports; bit-exact.
class HeldTotalsTest : public ::testing::TestWithParam<std::pair<size_t, size_t>> {};

TEST_P(HeldTotalsTest, EveryDeltaAfterTheFirstAppliesHeldBitExact) {
  const auto [parts, dim] = GetParam();  // parts 0: unparted
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model = LargeModel(5);
  PublisherOptions options;
  options.anchor_interval = 5;
  options.threads = 2;
  std::unique_ptr<Publisher> publisher;
  std::unique_ptr<Ranks> ranks;
  if (parts == 0) {
    auto opened = Publisher::Open(store, options);
    ASSERT_TRUE(opened.ok());
    publisher = std::move(*opened);
  } else {
    ranks = std::make_unique<Ranks>(store, SplitLayout(model.Views(), parts, dim), options);
  }
  const uint64_t applies = std::max<uint64_t>(parts, 1);
  auto replica = Replica::Create(store, ReplicaWithThreads(2));
  for (uint64_t v = 1; v <= 8; ++v) {
    if (v > 1) model.Step(0.03);
    ASSERT_TRUE(parts == 0 ? publisher->Publish(v, model.Views()).ok() : ranks->Publish(v, model.Views()).ok());
    auto stats = replica->Update();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->compact_applies, v > 1 ? applies : 0u) << "version " << v;
    EXPECT_EQ(stats->held_applies, v > 2 ? applies : 0u) << "version " << v;
    EXPECT_EQ(stats->stale_applies, 0u);
    EXPECT_EQ(replica->state_hash(), ReadManifest(*store).Find(v)->state_hash);
    ExpectSameState(replica->state(), StateOf(model));
  }
}

INSTANTIATE_TEST_SUITE_P(UnpartedAndLayouts, HeldTotalsTest,
                         ::testing::Values(std::pair<size_t, size_t>{0, 0}, std::pair<size_t, size_t>{2, 0},
                                           std::pair<size_t, size_t>{3, 1}));

// The parted apply as the replica runs it (replay::ApplyPartedDelta with the
// replica's PartTotals), version by version from a parted anchor.
class PartedReplay {
 public:
  PartedReplay(size_t parts, size_t dim, uint64_t versions) : store_(OpenDirStore(dir_.path())) {
    RandomModel model = LargeModel(7);
    PublisherOptions options;
    options.anchor_interval = 100;
    options.threads = 1;
    layout_ = SplitLayout(model.Views(), parts, dim);
    Ranks ranks(store_, layout_, options);
    for (uint64_t v = 1; v <= versions; ++v) {
      if (v > 1) model.Step(0.03);
      EXPECT_TRUE(ranks.Publish(v, model.Views()).ok());
      states_.push_back(StateOf(model));
    }
    manifest_ = ReadManifest(*store_);
    state_ = std::move(WeightState::FromViews(states_[0].views())).value();
  }

  const Manifest& manifest() const { return manifest_; }
  const PartLayout& layout() const { return *manifest_.LayoutOf(*manifest_.Find(1)); }
  WeightState& state() { return state_; }
  const WeightState& expected(uint64_t v) const { return states_[v - 1]; }

  // Applies version v's parted delta to the held state (of v - 1), as
  // listed by `entry` (the manifest's, or a spoiled copy).
  Result<replay::AppliedDelta> Apply(const VersionEntry& entry, replay::PartTotals& totals, int threads = 2) {
    uint64_t downloaded = 0;
    DS_ASSIGN_OR_RETURN(std::vector<Blob> parts, replay::FetchParts(*store_, *entry.delta(), 1, &downloaded));
    const VersionEntry& base = *manifest_.Find(entry.version - 1);
    return replay::ApplyPartedDelta(std::move(parts), entry, *entry.delta(), layout(), state_, base.state_hash, base,
                                    threads, /*want_changes=*/false, totals, nullptr);
  }

 private:
  TempDir dir_;
  std::shared_ptr<Store> store_;
  PartLayout layout_;
  Manifest manifest_;
  std::vector<WeightState> states_;
  WeightState state_;
};

// A version refused by its first part's hash puts that part back and
// forgets every part's totals (the parts not reached too): the next try
// applies unheld and exact, the one after held again.
TEST(PartedHeldTotals, APutBackForgetsEveryPartsTotals) {
  PartedReplay r(3, 1, 4);
  replay::PartTotals totals;
  auto v2 = r.Apply(*r.manifest().Find(2), totals);
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_EQ(v2->held_applies, 0u);  // fills them
  VersionEntry spoiled = *r.manifest().Find(3);
  spoiled.parts[0].state_hash.lo += 1;
  spoiled.state_hash.lo += 1;
  auto refused = r.Apply(spoiled, totals);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("its blocks would hash to"), std::string::npos)
      << refused.status().ToString();
  ExpectSameState(r.state(), r.expected(2));
  EXPECT_TRUE(totals.parts.empty());
  auto again = r.Apply(*r.manifest().Find(3), totals);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->compact_applies, 3u);
  EXPECT_EQ(again->held_applies, 0u);
  ExpectSameState(r.state(), r.expected(3));
  auto next = r.Apply(*r.manifest().Find(4), totals);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->held_applies, 3u);
  ExpectSameState(r.state(), r.expected(4));
}

// A held total of a part that is wrong (every class count of each tensor's
// first chunk off by one) is found by the walk: that part's apply is redone
// on the look-back route (stale 1), the other stays held, the state is
// exact, and the part's totals are right again for the next version.
TEST(PartedHeldTotals, ACorruptHeldTotalOfAPartIsStaleAndTheStateExact) {
  PartedReplay r(2, 0, 5);
  replay::PartTotals totals;
  ASSERT_TRUE(r.Apply(*r.manifest().Find(2), totals).ok());
  auto v3 = r.Apply(*r.manifest().Find(3), totals);
  ASSERT_TRUE(v3.ok()) << v3.status().ToString();
  EXPECT_EQ(v3->held_applies, 2u);
  CompactClassTotals::State* held =
      totals.parts[1].Find(r.manifest().Find(3)->parts[1].state_hash, compact::DecodeChunkElements());
  ASSERT_NE(held, nullptr);
  for (CompactClassTotals::Tensor& t : held->tensors) {
    if (t.elements == 0) continue;
    for (uint32_t& count : t.chunks[0]) ++count;
  }
  auto v4 = r.Apply(*r.manifest().Find(4), totals);
  ASSERT_TRUE(v4.ok()) << v4.status().ToString();
  EXPECT_EQ(v4->compact_applies, 2u);
  EXPECT_EQ(v4->stale_applies, 1u);
  EXPECT_EQ(v4->held_applies, 1u);
  ExpectSameState(r.state(), r.expected(4));
  auto v5 = r.Apply(*r.manifest().Find(5), totals);
  ASSERT_TRUE(v5.ok()) << v5.status().ToString();
  EXPECT_EQ(v5->held_applies, 2u);
  EXPECT_EQ(v5->stale_applies, 0u);
  ExpectSameState(r.state(), r.expected(5));
}

// Versions applied one after another with refusals injected before the
// good apply (random, seeded): a later part's hash wrong (the parts before
// it applied, in place or through a block copy, then put back), only the
// whole state's hash wrong (every part applied, then all put back), or a
// held count of a random part corrupted. After a refusal the state is bit
// for bit the last good version and every part's totals are forgotten (the
// next apply unheld); after a good apply it is the next version, held where
// nothing was refused before it; on 1-3 threads, row and column blocks.
TEST(PartedHeldTotals, RefusalsAtAnyPartLeaveTheLastGoodVersionAndTheNextApplyExact) {
  for (const size_t dim : {size_t{0}, size_t{1}}) {
    PartedReplay r(3, dim, 7);
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE("dim " + std::to_string(dim) + ", threads " + std::to_string(threads));
      std::mt19937_64 rng(dim * 10 + static_cast<uint64_t>(threads));
      r.state() = std::move(WeightState::FromViews(r.expected(1).views())).value();
      replay::PartTotals totals;
      bool refused = true;  // none held before the first apply
      uint64_t refusals = 0, stale = 0;
      for (uint64_t v = 2; v <= 7; ++v) {
        SCOPED_TRACE("version " + std::to_string(v));
        const VersionEntry& entry = *r.manifest().Find(v);
        const int inject = static_cast<int>(rng() % 4);
        if (inject == 3 && !totals.parts.empty()) {
          CompactClassTotals& part = totals.parts[rng() % totals.parts.size()];
          for (CompactClassTotals::State& s : part.states) {
            for (CompactClassTotals::Tensor& t : s.tensors) {
              if (t.chunks.size() > 1) ++t.chunks[0][rng() % 16];
            }
          }
        } else if (inject < 3 && v > 2) {
          VersionEntry spoiled = entry;
          if (inject == 2) {
            spoiled.state_hash.lo += 1;  // every part passes, the whole does not
          } else {
            spoiled.parts[1 + static_cast<size_t>(inject)].state_hash.hi += 1;
          }
          auto no = r.Apply(spoiled, totals, threads);
          ASSERT_FALSE(no.ok());
          EXPECT_EQ(no.status().code(), ErrorCode::kIntegrity) << no.status().ToString();
          ExpectSameState(r.state(), r.expected(v - 1));
          EXPECT_TRUE(totals.parts.empty());
          refused = true;
          ++refusals;
        }
        auto yes = r.Apply(entry, totals, threads);
        ASSERT_TRUE(yes.ok()) << yes.status().ToString();
        ExpectSameState(r.state(), r.expected(v));
        EXPECT_EQ(yes->compact_applies, 3u);
        if (refused) EXPECT_EQ(yes->held_applies, 0u);
        if (!refused) EXPECT_EQ(yes->held_applies + yes->stale_applies, 3u);
        stale += yes->stale_applies;
        refused = false;
      }
      EXPECT_GT(refusals, 0u);
      std::printf("dim %zu, threads %d: %llu refusals, %llu stale\n", dim, threads,
                  static_cast<unsigned long long>(refusals), static_cast<unsigned long long>(stale));
    }
  }
}

}  // namespace
}  // namespace deltasync
