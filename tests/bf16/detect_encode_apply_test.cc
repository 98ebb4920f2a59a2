// GapDeltaApply (bf16/detect_encode_apply.h): the detect, encode and apply
// in one pass give the patch DetectChanges + EncodeDelta give, leave the
// state a replica gets from that patch's bytes (DecodePatch keeping the gaps
// encoded, ApplyGapChanges) with the same hash change, on every SIMD target,
// thread count and chunk size; Undo puts the state back bit for bit; an
// error leaves the state as it was, wherever in the pass it is found.
#include "bf16/detect_encode_apply.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "bf16/bf16_test_util.h"
#include "bf16/chunked.h"
#include "bf16/chunks.h"
#include "bf16/gap_delta_case.h"
#include "codec/patch_test_util.h"
#include "deltasync/patch.h"
#include "deltasync/safetensors.h"
#include "deltasync/state_hash.h"

namespace deltasync {
namespace {

using testing::Flatten;
using testing_bf16::Case;
using testing_bf16::ForEachRate;
using testing_bf16::ForEachTarget;
using testing_bf16::InfoFor;
using testing_bf16::MakeCase;
using testing_bf16::RateCase;
using testing_bf16::Separate;
using testing_bf16::Views;

WeightState Copy(const WeightState& state) {
  Result<WeightState> copy = WeightState::FromViews(state.views());
  EXPECT_TRUE(copy.ok()) << copy.status().ToString();
  return std::move(copy).value();
}

std::vector<std::vector<uint8_t>> Bytes(const WeightState& state) {
  std::vector<std::vector<uint8_t>> out;
  for (const WeightState::Tensor& t : state.tensors()) out.push_back(t.data);
  return out;
}

// What a replica makes of `patch` applied to `state`: the state's bytes and
// the hash change.
StateHash ReplicaApply(WeightState& state, const std::vector<uint8_t>& patch, int threads) {
  Result<SafetensorsFile> file = SafetensorsFile::Parse(Blob::FromVector(patch), "want");
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  Result<DecodedPatch> decoded = DecodePatch(std::move(*file), DecodePatchOptions{.keep_gaps_encoded = true});
  EXPECT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_TRUE(ValidateEncodedChanges(state, decoded->encoded).ok());
  std::vector<uint8_t> undo;
  return ApplyGapChanges(state, decoded->encoded, threads, undo);
}

TEST(GapDeltaApplyTest, ThePatchOfDetectThenEncodeAndTheStateAReplicaGetsFromIt) {
  ForEachRate(13, [](const RateCase& r) {
    WeightState replica = Copy(r.c.state);
    const StateHash before_hash = HashState(r.c.state);
    const StateHash want_delta = ReplicaApply(replica, r.want, 2);
    const auto want_state = Bytes(replica);
    ASSERT_EQ(HashState(replica), before_hash + want_delta);
    const auto before = Bytes(r.c.state);

    WeightState state = Copy(r.c.state);
    DetectedGapDelta out;  // reused across targets, chunk sizes and threads
    bf16::GapDeltaApply route;
    ForEachTarget([&] {
      for (uint64_t chunk : {uint64_t{333}, uint64_t{4096}, uint64_t{70001}, bf16::kDefaultChunkElements}) {
        for (int threads : {1, 2, 5}) {
          SCOPED_TRACE("chunk " + std::to_string(chunk) + " threads " + std::to_string(threads));
          Result<StateHash> delta = route.Run(state, r.current, {.threads = threads}, r.info, chunk, out);
          ASSERT_TRUE(delta.ok()) << delta.status().ToString();
          EXPECT_EQ(Flatten(out.patch), r.want);
          EXPECT_EQ(out.changed, r.want_changed);
          EXPECT_EQ(*delta, want_delta);
          ASSERT_EQ(Bytes(state), want_state);
          route.Undo(state, out, threads);
          ASSERT_EQ(Bytes(state), before);
          route.Undo(state, out, threads);  // once only: a second Undo does nothing
          ASSERT_EQ(Bytes(state), before);
        }
      }
    });
  });
}

// The detect's and the encoder's errors, found in the scan (NaN masters,
// late in a tensor after other chunks applied theirs, and early) and after
// it (the element count the header checks, once every chunk applied its
// changes): the same errors as DetectAndEncodeGapDelta, no patch, and the
// state as it was, also after an Undo. The next good call publishes.
TEST(GapDeltaApplyTest, AnErrorLeavesTheStateAsItWas) {
  const Case c = MakeCase(7, 0.034);
  Case next = MakeCase(8, 0.034);  // other weights of the same tensors: changes nearly everywhere
  const PatchInfo info = InfoFor(c.state);
  DetectedGapDelta out, plain;
  bf16::GapDeltaApply route;
  for (int threads : {1, 2}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    WeightState state = Copy(c.state);
    ASSERT_TRUE(route.Run(state, Views(c.current), {.threads = threads}, info, 4096, out).ok());
    const auto applied = Bytes(state);
    auto expect_refused = [&](const PatchInfo& i) {
      Status want = bf16::DetectAndEncodeGapDeltaChunked(state, Views(next.current), {.threads = threads}, i, 4096,
                                                          plain);
      ASSERT_FALSE(want.ok());
      Result<StateHash> got = route.Run(state, Views(next.current), {.threads = threads}, i, 4096, out);
      ASSERT_FALSE(got.ok());
      EXPECT_EQ(got.status().code(), want.code());
      EXPECT_EQ(got.status().message(), want.message());
      EXPECT_TRUE(out.patch.parts.empty());
      EXPECT_EQ(out.patch.size, 0u);
      EXPECT_EQ(Bytes(state), applied);
      route.Undo(state, out, threads);
      EXPECT_EQ(Bytes(state), applied);
    };
    const std::vector<uint8_t> saved = next.current[0].data;
    for (uint64_t at : {uint64_t{120000}, uint64_t{5}}) {
      SCOPED_TRACE("NaN at " + std::to_string(at));
      const uint32_t nan = 0x7FC00001;
      std::memcpy(next.current[0].data.data() + 4 * at, &nan, 4);
      expect_refused(info);
      next.current[0].data = saved;
    }
    PatchInfo small = info;
    small.total_elements = 10;
    expect_refused(small);
    // The next version publishes, from the state kept.
    uint64_t changed = 0;
    auto want = Separate(state, Views(next.current), {.threads = threads}, info, &changed);
    ASSERT_TRUE(want.ok());
    WeightState replica = Copy(state);
    const StateHash want_delta = ReplicaApply(replica, *want, threads);
    Result<StateHash> delta = route.Run(state, Views(next.current), {.threads = threads}, info, 4096, out);
    ASSERT_TRUE(delta.ok()) << delta.status().ToString();
    EXPECT_EQ(Flatten(out.patch), *want);
    EXPECT_EQ(*delta, want_delta);
    EXPECT_EQ(Bytes(state), Bytes(replica));
  }
}

}  // namespace
}  // namespace deltasync
