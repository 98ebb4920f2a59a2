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
#include <span>
#include <string>
#include <vector>

#include "deltasync/changes.h"
#include "deltasync/patch.h"
#include "deltasync/state_hash.h"
#include "deltasync/weight_state.h"
#include "codec/patch_test_util.h"
#include "testing/random_model.h"

namespace deltasync {
namespace {

using testing::Flatten;
using testing::RandomModel;

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

      Result<StateHash> delta = route.Run(*state, current, options, info, threads);
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
        delta = route.Run(*state, current, options, info, threads);
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
  ASSERT_TRUE(route.Run(*state, model.Views(), {.threads = 2}, InfoFor(*state, 2), 2).ok());
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
  Result<StateHash> refused = route.Run(*state, model.Views(), {.threads = 2}, InfoFor(*state, 3), 2);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("NaN"), std::string::npos) << refused.status().ToString();
  EXPECT_EQ(ContentsOf(*state), before);
  // A wrong element count: the encoder refuses it, the state stays.
  std::memcpy(bf16->data.data() + bf16->data.size() - 2, bf16->data.data(), 2);
  PatchInfo wrong = InfoFor(*state, 3);
  wrong.total_elements = 10;
  refused = route.Run(*state, model.Views(), {.threads = 2}, wrong, 2);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(ContentsOf(*state), before);
  // And the next good version publishes.
  const StateHash hash = HashState(*state);
  Result<StateHash> delta = route.Run(*state, model.Views(), {.threads = 2}, InfoFor(*state, 3), 2);
  ASSERT_TRUE(delta.ok()) << delta.status().ToString();
  EXPECT_EQ(hash + *delta, HashState(*state));
}

}  // namespace
}  // namespace deltasync
