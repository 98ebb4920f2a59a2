// The class totals a replica holds for the compact apply
// (CompactClassTotals): counted from an anchor when it is loaded, kept per
// part across parted versions, forgotten whenever parts are put back, and
// a wrong held count still giving the exact state (reported stale).
#include <gtest/gtest.h>

#include <cstring>
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

// Every per-chunk count of all 16 classes of `blocks` (in order), brute
// force, against `held`'s.
void ExpectCountsOf(std::span<const TensorView> blocks, const CompactClassTotals::State& held) {
  const uint64_t chunk = compact::kDecodeChunkElements;
  ASSERT_EQ(held.tensors.size(), blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const CompactClassTotals::Tensor& t = held.tensors[i];
    if (blocks[i].dtype != DType::kBF16) {
      EXPECT_EQ(t.elements, 0u) << blocks[i].name;
      continue;
    }
    ASSERT_EQ(t.elements, blocks[i].num_elements()) << blocks[i].name;
    ASSERT_EQ(t.classes, 0xFFFFu);
    ASSERT_EQ(t.chunks.size(), (t.elements + chunk - 1) / chunk);
    for (size_t j = 0; j < t.chunks.size(); ++j) {
      std::array<uint32_t, 16> want{};
      for (uint64_t e = j * chunk; e < std::min(t.elements, (j + 1) * chunk); ++e) {
        uint16_t v;
        std::memcpy(&v, blocks[i].data.data() + 2 * e, 2);
        ++want[compact::ClassOf(v)];
      }
      EXPECT_EQ(t.chunks[j], want) << blocks[i].name << " chunk " << j;
    }
  }
}

// A replica of an unparted compact bucket: the anchor's totals are counted
// as it loads, so every compact delta (the first after each anchor too)
// applies held, one version per update; the replica reports it.
TEST(ReplicaHeldTotals, EveryPlainCompactDeltaAppliesHeldTheFirstAfterAnAnchorToo) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model = LargeModel(3);
  PublisherOptions options;
  options.anchor_interval = 4;
  options.threads = 2;
  auto publisher = Publisher::Open(store, options);
  ASSERT_TRUE(publisher.ok());
  auto replica = Replica::Create(store, ReplicaWithThreads(2));
  uint64_t held = 0, deltas = 0;
  for (uint64_t v = 1; v <= 9; ++v) {
    if (v > 1) model.Step(0.03);
    ASSERT_TRUE((*publisher)->Publish(v, model.Views()).ok());
    auto stats = replica->Update();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->compact_applies, stats->deltas_applied) << "version " << v;
    EXPECT_EQ(stats->held_applies, stats->deltas_applied) << "version " << v;
    EXPECT_EQ(stats->stale_applies, 0u);
    held += stats->held_applies;
    deltas += stats->deltas_applied;
    ExpectSameState(replica->state(), StateOf(model));
  }
  EXPECT_EQ(deltas, 8u);
  EXPECT_EQ(held, 8u);
  // A fresh replica: the anchor of 8, then 9's delta, held.
  auto fresh = Replica::Create(store, ReplicaWithThreads(1));
  auto caught = fresh->Update();
  ASSERT_TRUE(caught.ok()) << caught.status().ToString();
  EXPECT_EQ(caught->anchors_applied, 1u);
  EXPECT_EQ(caught->held_applies, 1u);
  ExpectSameState(fresh->state(), StateOf(model));
}

class PartedHeldTest : public ::testing::TestWithParam<std::pair<size_t, size_t>> {};

// A replica of a parted bucket: each part's totals are counted with the
// anchor and kept from version to version, so every part of every delta
// applies held (row-range blocks in place, column blocks through a copy);
// bit-exact, none stale.
TEST_P(PartedHeldTest, EveryPartOfEveryDeltaAppliesHeldBitExact) {
  const auto [parts, dim] = GetParam();
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model = LargeModel(5);
  PublisherOptions options;
  options.anchor_interval = 5;
  options.threads = 2;
  Ranks ranks(store, SplitLayout(model.Views(), parts, dim), options);
  auto replica = Replica::Create(store, ReplicaWithThreads(2));
  for (uint64_t v = 1; v <= 8; ++v) {
    if (v > 1) model.Step(0.03);
    ASSERT_TRUE(ranks.Publish(v, model.Views()).ok());
    auto stats = replica->Update();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->compact_applies, stats->deltas_applied * parts) << "version " << v;
    EXPECT_EQ(stats->held_applies, stats->compact_applies) << "version " << v;
    EXPECT_EQ(stats->stale_applies, 0u);
    EXPECT_EQ(replica->state_hash(), ReadManifest(*store).Find(v)->state_hash);
    ExpectSameState(replica->state(), StateOf(model));
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PartedHeldTest,
                         ::testing::Values(std::pair<size_t, size_t>{2, 0}, std::pair<size_t, size_t>{3, 1}));

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
  Result<replay::AppliedDelta> Apply(const VersionEntry& entry, replay::PartTotals& totals) {
    uint64_t downloaded = 0;
    DS_ASSIGN_OR_RETURN(std::vector<Blob> parts, replay::FetchParts(*store_, *entry.delta(), 1, &downloaded));
    const VersionEntry& base = *manifest_.Find(entry.version - 1);
    return replay::ApplyPartedDelta(std::move(parts), entry, *entry.delta(), layout(), state_, base.state_hash, base,
                                    2, /*want_changes=*/false, totals, nullptr);
  }

 private:
  TempDir dir_;
  std::shared_ptr<Store> store_;
  PartLayout layout_;
  Manifest manifest_;
  std::vector<WeightState> states_;
  WeightState state_;
};

// The anchor's count (CountPartTotals) of each part is a brute-force count
// of all 16 classes of the part's blocks, keyed by the part's hash.
TEST(PartedHeldTotals, TheAnchorsCountOfEachPartEqualsABruteForceCount) {
  for (auto [parts, dim] : {std::pair<size_t, size_t>{2, 0}, std::pair<size_t, size_t>{3, 1}}) {
    PartedReplay r(parts, dim, 1);
    const VersionEntry& v1 = *r.manifest().Find(1);
    replay::PartTotals totals;
    replay::CountPartTotals(r.state(), v1, r.layout(), 2, totals);
    EXPECT_EQ(totals.layout, v1.layout);
    ASSERT_EQ(totals.parts.size(), parts);
    for (size_t p = 0; p < parts; ++p) {
      const testing::PartBlocks blocks = testing::BlocksOf(r.layout(), p, r.state().views());
      const CompactClassTotals::State* held =
          totals.parts[p].Find(v1.parts[p].state_hash, compact::kDecodeChunkElements);
      ASSERT_NE(held, nullptr) << "part " << p;
      ExpectCountsOf(blocks.views, *held);
    }
  }
}

// A version refused by its first part's hash puts that part back and
// forgets every part's totals (the parts not reached too): the next try
// applies unheld and exact, the one after held again.
TEST(PartedHeldTotals, APutBackForgetsEveryPartsTotals) {
  PartedReplay r(3, 1, 3);
  replay::PartTotals totals;
  replay::CountPartTotals(r.state(), *r.manifest().Find(1), r.layout(), 2, totals);
  VersionEntry spoiled = *r.manifest().Find(2);
  spoiled.parts[0].state_hash.lo += 1;
  spoiled.state_hash.lo += 1;
  auto refused = r.Apply(spoiled, totals);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("its blocks would hash to"), std::string::npos)
      << refused.status().ToString();
  ExpectSameState(r.state(), r.expected(1));
  EXPECT_TRUE(totals.parts.empty());
  auto again = r.Apply(*r.manifest().Find(2), totals);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->compact_applies, 3u);
  EXPECT_EQ(again->held_applies, 0u);
  ExpectSameState(r.state(), r.expected(2));
  auto next = r.Apply(*r.manifest().Find(3), totals);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(next->held_applies, 3u);
  ExpectSameState(r.state(), r.expected(3));
}

// A held total of a part that is wrong (every class count of each tensor's
// first chunk off by one) is found by the walk: that part's apply is redone
// on the look-back route (stale 1), the others stay held, the state is
// exact, and the part's totals are right again for the next version.
TEST(PartedHeldTotals, ACorruptHeldTotalOfAPartIsStaleAndTheStateExact) {
  PartedReplay r(2, 0, 4);
  replay::PartTotals totals;
  replay::CountPartTotals(r.state(), *r.manifest().Find(1), r.layout(), 2, totals);
  auto v2 = r.Apply(*r.manifest().Find(2), totals);
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_EQ(v2->held_applies, 2u);
  CompactClassTotals::State* held =
      totals.parts[1].Find(r.manifest().Find(2)->parts[1].state_hash, compact::kDecodeChunkElements);
  ASSERT_NE(held, nullptr);
  for (CompactClassTotals::Tensor& t : held->tensors) {
    if (t.elements == 0) continue;
    for (uint32_t& count : t.chunks[0]) ++count;
  }
  auto v3 = r.Apply(*r.manifest().Find(3), totals);
  ASSERT_TRUE(v3.ok()) << v3.status().ToString();
  EXPECT_EQ(v3->compact_applies, 2u);
  EXPECT_EQ(v3->stale_applies, 1u);
  EXPECT_EQ(v3->held_applies, 1u);
  ExpectSameState(r.state(), r.expected(3));
  auto v4 = r.Apply(*r.manifest().Find(4), totals);
  ASSERT_TRUE(v4.ok()) << v4.status().ToString();
  EXPECT_EQ(v4->held_applies, 2u);
  EXPECT_EQ(v4->stale_applies, 0u);
  ExpectSameState(r.state(), r.expected(4));
}

}  // namespace
}  // namespace deltasync
