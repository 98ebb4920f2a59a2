// The Publisher's gap_delta route (sync/gap_delta_publish.h): its delta is
// the bytes DetectChanges + EncodeDelta give, the state it leaves is the
// current tensors (bit for bit), the hash change it returns is the state's,
// Undo puts the state back, and an error leaves the state untouched; all
// with buffers reused across versions that grow, shrink and vanish.
#include "sync/gap_delta_publish.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "deltasync/changes.h"
#include "deltasync/manifest.h"
#include "deltasync/patch.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/state_hash.h"
#include "deltasync/weight_state.h"
#include "codec/patch_test_util.h"
#include "testing/bucket_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::Flatten;
using testing::OpenDirStore;
using testing::RandomModel;
using testing::ReadManifest;
using testing::TempDir;

using Contents = std::map<std::string, std::vector<uint8_t>>;

Contents ContentsOf(std::span<const TensorView> views) {
  Contents out;
  for (const TensorView& v : views) out[v.name].assign(v.data.begin(), v.data.end());
  return out;
}
Contents ContentsOf(const WeightState& state) { return ContentsOf(state.views()); }

PatchInfo InfoFor(const WeightState& state, uint64_t version) {
  PatchInfo info;
  info.kind = PatchKind::kDelta;
  info.model_version = version;
  info.base_version = version - 1;
  info.encoding = IndexEncoding::kGapDelta;
  info.total_elements = state.total_elements();
  return info;
}

TEST(GapDeltaPublishTest, TheDeltaOfDetectThenEncodeAppliedBitForBit) {
  for (int threads : {1, 2}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    RandomModel model(61);
    Result<WeightState> state = WeightState::FromViews(model.Views());
    ASSERT_TRUE(state.ok()) << state.status().ToString();
    StateHash hash = HashState(*state);
    GapDeltaPublish route;
    const DetectOptions options{.threads = threads};
    // Growing, shrinking, none, growing again; an undone version between.
    const double fractions[] = {0.02, 0.3, 0.001, 0.0, 0.2, 0.05, 0.6};
    uint64_t version = 1;
    for (double f : fractions) {
      ++version;
      SCOPED_TRACE("version " + std::to_string(version) + ", " + std::to_string(f) + " changed");
      if (f > 0) model.Step(f);
      const std::vector<TensorView> current = model.Views();
      const PatchInfo info = InfoFor(*state, version);
      Result<std::vector<TensorChanges>> changes = DetectChanges(*state, current, options);
      ASSERT_TRUE(changes.ok()) << changes.status().ToString();
      Result<EncodedPatch> want = EncodeDelta(info, *changes);
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      uint64_t want_changed = 0;
      for (const TensorChanges& c : *changes) want_changed += c.count();
      const Contents before = ContentsOf(*state);

      Result<StateHash> delta = route.Run(*state, current, options, info);
      ASSERT_TRUE(delta.ok()) << delta.status().ToString();
      EXPECT_EQ(route.changed(), want_changed);
      const EncodedPatch got = route.TakePatch();
      EXPECT_EQ(Flatten(got), Flatten(*want));
      const Contents now = ContentsOf(current);
      ASSERT_EQ(ContentsOf(*state), now);
      EXPECT_EQ(hash + *delta, HashState(*state));
      if (version == 4) {
        // Undone (a failed upload), then published again.
        route.Undo(*state, threads);
        ASSERT_EQ(ContentsOf(*state), before);
        EXPECT_EQ(HashState(*state), hash);
        delta = route.Run(*state, current, options, info);
        ASSERT_TRUE(delta.ok()) << delta.status().ToString();
        EXPECT_EQ(Flatten(route.TakePatch()), Flatten(*want));
        ASSERT_EQ(ContentsOf(*state), now);
      }
      hash = hash + *delta;
      if (version == 6) route.Release();
    }
  }
}

TEST(GapDeltaPublishTest, AnErrorLeavesTheStateAsItWas) {
  RandomModel model(62);
  Result<WeightState> state = WeightState::FromViews(model.Views());
  ASSERT_TRUE(state.ok());
  GapDeltaPublish route;
  model.Step(0.05);
  ASSERT_TRUE(route.Run(*state, model.Views(), {.threads = 2}, InfoFor(*state, 2)).ok());
  const Contents before = ContentsOf(*state);
  model.Step(0.05);
  // A NaN in the first bf16 tensor, late: the detect refuses it.
  RandomModel::Tensor* bf16 = nullptr;
  for (RandomModel::Tensor& t : model.tensors()) {
    if (t.dtype == DType::kBF16 && bf16 == nullptr) bf16 = &t;
  }
  ASSERT_NE(bf16, nullptr);
  const uint16_t nan = 0x7FC1;
  std::memcpy(bf16->data.data() + bf16->data.size() - 2, &nan, 2);
  Result<StateHash> refused = route.Run(*state, model.Views(), {.threads = 2}, InfoFor(*state, 3));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("NaN"), std::string::npos) << refused.status().ToString();
  EXPECT_EQ(ContentsOf(*state), before);
  // A wrong element count: the encoder refuses it, the state stays.
  std::memcpy(bf16->data.data() + bf16->data.size() - 2, bf16->data.data(), 2);
  PatchInfo wrong = InfoFor(*state, 3);
  wrong.total_elements = 10;
  refused = route.Run(*state, model.Views(), {.threads = 2}, wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(ContentsOf(*state), before);
  // And the next good version publishes.
  const StateHash hash = HashState(*state);
  Result<StateHash> delta = route.Run(*state, model.Views(), {.threads = 2}, InfoFor(*state, 3));
  ASSERT_TRUE(delta.ok()) << delta.status().ToString();
  EXPECT_EQ(hash + *delta, HashState(*state));
}


// fp32 masters of `model`'s bf16 tensors (low halves below 0x8000 round
// down to the bf16 value), other dtypes as they are.
struct Masters {
  std::vector<std::vector<uint8_t>> data;
  std::vector<TensorView> views;
};
Masters MastersOf(const RandomModel& model, std::mt19937_64& rng) {
  Masters m;
  const std::vector<TensorView> views = model.Views();
  m.data.reserve(views.size());
  for (const TensorView& v : views) {
    if (v.dtype != DType::kBF16) {
      m.data.emplace_back(v.data.begin(), v.data.end());
      m.views.push_back(TensorView{v.name, v.dtype, v.shape, m.data.back()});
      continue;
    }
    std::vector<uint8_t>& out = m.data.emplace_back(v.data.size() * 2);
    for (size_t i = 0; i < v.data.size() / 2; ++i) {
      uint16_t b;
      std::memcpy(&b, v.data.data() + 2 * i, 2);
      const uint32_t bits = (uint32_t{b} << 16) | static_cast<uint32_t>(rng() & 0x7FFF);
      std::memcpy(out.data() + 4 * i, &bits, 4);
    }
    m.views.push_back(TensorView{v.name, DType::kF32, v.shape, out});
  }
  return m;
}

// The Publisher's gap_delta route end to end, from fp32 masters (the
// compare kernel that writes the gaps itself) into a local bucket: each
// delta object is the bytes DetectChanges + EncodeDelta give against the
// previous state, the publisher's state is the masters rounded, the
// manifest's hash is the state's, and a replica reaches the same state.
TEST(GapDeltaPublishTest, ThePublishersObjectsFromMastersAreTheSeparateRoutesBytes) {
  for (int threads : {1, 2}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    TempDir dir;
    auto store = OpenDirStore(dir.path());
    PublisherOptions options;
    options.encoding = IndexEncoding::kGapDelta;
    options.anchor_interval = 1000;
    options.threads = threads;
    auto pub = Publisher::Open(store, options);
    ASSERT_TRUE(pub.ok()) << pub.status().ToString();
    RandomModel model(63);
    std::mt19937_64 rng(64);
    ASSERT_TRUE((*pub)->Publish(1, model.Views()).ok());
    Result<WeightState> previous = WeightState::FromViews(model.Views());
    ASSERT_TRUE(previous.ok());
    auto replica = Replica::Create(store);
    uint64_t version = 1;
    for (double f : {0.03, 0.3, 0.0, 0.001, 0.1}) {
      ++version;
      SCOPED_TRACE("version " + std::to_string(version));
      if (f > 0) model.Step(f);
      const Masters masters = MastersOf(model, rng);
      Result<std::vector<TensorChanges>> changes = DetectChanges(*previous, masters.views, {.threads = threads});
      ASSERT_TRUE(changes.ok()) << changes.status().ToString();
      Result<EncodedPatch> want = EncodeDelta(InfoFor(*previous, version), *changes);
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      Result<PublishStats> stats = (*pub)->Publish(version, masters.views);
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
      const Manifest manifest = ReadManifest(*store);
      const VersionEntry* entry = manifest.Find(version);
      ASSERT_TRUE(entry && entry->delta());
      Result<Blob> object = store->Get(entry->delta()->key);
      ASSERT_TRUE(object.ok()) << object.status().ToString();
      EXPECT_EQ(std::vector<uint8_t>(object->bytes().begin(), object->bytes().end()), Flatten(*want));
      ASSERT_EQ(ContentsOf((*pub)->state()), ContentsOf(model.Views()));
      EXPECT_EQ(entry->state_hash, HashState((*pub)->state()));
      ASSERT_TRUE(replica->Update().ok());
      EXPECT_EQ(replica->version(), version);
      EXPECT_EQ(ContentsOf(replica->state()), ContentsOf(model.Views()));
      previous = WeightState::FromViews(model.Views());
      ASSERT_TRUE(previous.ok());
    }
  }
}

}  // namespace
}  // namespace deltasync
