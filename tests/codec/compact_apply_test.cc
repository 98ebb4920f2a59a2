// The fused compact apply (ApplyCompactDelta, src/codec/compact_decode.cc):
// on every SIMD target, thread count and chunk size it leaves the state
// exactly as DecodeCompactDelta + ApplyChanges would, with the same hash
// change; its undo log puts every old value back; and a delta that fails
// after values were written (gaps past the base's class elements, damaged
// bytes) leaves the state bit-identical to before.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "bf16/bf16_test_util.h"
#include "codec/compact_bf16.h"
#include "codec/compact_case_util.h"
#include "codec/patch_test_util.h"
#include "deltasync/compact.h"

namespace deltasync {
namespace {

using testing::Flatten;
using testing::ParseBytes;
using namespace testing_compact;

Result<CompactDelta> Apply(const std::vector<uint8_t>& bytes, WeightState& state, const StateHash& hash, int threads,
                           uint64_t chunk, CompactUndo& undo) {
  DS_ASSIGN_OR_RETURN(SafetensorsFile f, ParseBytes(bytes, "fused.safetensors"));
  return compact::ApplyCompactDeltaChunked(f, state, hash, threads, chunk, undo);
}

void ExpectEqualsDecodeAndScatterOnEveryTargetThreadCountAndChunkSize(const Case& c) {
  ASSERT_FALSE(c.bytes.empty());
  WeightState want = Copy(c.state);
  ApplyChanges(want, c.changes, 1);
  const StateHash want_delta = HashChanges(c.state, c.changes, 1);
  CompactUndo undo;  // reused across calls, as the replica does
  ForEachRouteTargetThreadCountAndChunk(c, [&](int threads, uint64_t chunk) {
    WeightState s = Copy(c.state);
    Result<CompactDelta> d = Apply(c.bytes, s, c.hash, threads, chunk, undo);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_TRUE(d->changes.empty());
    EXPECT_EQ(d->hash_delta, want_delta);
    EXPECT_EQ(d->info.model_version, 3u);
    ASSERT_TRUE(SameBytes(s, want));
    undo.Restore(threads);
    ASSERT_TRUE(SameBytes(s, c.state));
    undo.Restore(threads);  // a second call does nothing
    ASSERT_TRUE(SameBytes(s, c.state));
  });
}

// A case the apply walks on every thread it is given (the walk's class
// totals from the counting pass, or on one thread from the walk itself).
TEST(CompactApply, ALargeCaseWalkedOnEveryThreadCountEqualsDecodeAndScatter) {
  const Case c = MakeLargeCase();
  ASSERT_FALSE(c.bytes.empty());
  WeightState want = Copy(c.state);
  ApplyChanges(want, c.changes, 1);
  const StateHash want_delta = HashChanges(c.state, c.changes, 1);
  CompactUndo undo;
  WeightState s = Copy(c.state);
  ForEachTargetThreadCountAndLargeChunk([&](int threads, uint64_t chunk) {
    Result<CompactDelta> d = Apply(c.bytes, s, c.hash, threads, chunk, undo);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->hash_delta, want_delta);
    ASSERT_TRUE(SameBytes(s, want));
    undo.Restore(threads);
    ASSERT_TRUE(SameBytes(s, c.state));
  });
}

TEST(CompactApply, EqualsDecodeAndScatterOnEveryTargetThreadCountAndChunkSize) {
  ExpectEqualsDecodeAndScatterOnEveryTargetThreadCountAndChunkSize(MakeCase());
}

// Blocks with no change, blocks where only some classes have one, a class
// whose only change is in a block's last word, one that skips every block
// up to the last.
TEST(CompactApply, SparseChangesInFewClassesEqualDecodeAndScatter) {
  ExpectEqualsDecodeAndScatterOnEveryTargetThreadCountAndChunkSize(MakeSparseCase());
}

// Base values at every exponent-class edge, NaN/Inf, subnormals; a block
// with one class only; a tensor shorter than a vector.
TEST(CompactApply, BaseValuesAtEveryClassEdgeEqualDecodeAndScatter) {
  ExpectEqualsDecodeAndScatterOnEveryTargetThreadCountAndChunkSize(MakeEdgeCase());
}

TEST(CompactApply, RawModeTensorsApplyAndRestore) {
  // An F32 tensor beside a bf16 one: its changes are raw-mode, applied and
  // logged after the walk.
  MixedCase m = MakeMixedCase();
  WeightState& base = m.state;
  const std::vector<TensorChanges>& changes = m.changes;
  const StateHash hash = HashState(base, 1);
  PatchInfo info;
  info.model_version = 2;
  info.base_version = 1;
  Result<EncodedPatch> e = EncodeCompactDelta(info, hash, base, changes);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  const std::vector<uint8_t> bytes = Flatten(*e);
  WeightState want = Copy(base);
  ApplyChanges(want, changes, 1);
  CompactUndo undo;
  for (uint64_t chunk : {uint64_t{1}, uint64_t{64}, compact::DecodeChunkElements()}) {
    WeightState s = Copy(base);
    Result<CompactDelta> d = Apply(bytes, s, hash, 2, chunk, undo);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->hash_delta, HashChanges(base, changes, 1));
    EXPECT_TRUE(SameBytes(s, want));
    undo.Restore(2);
    EXPECT_TRUE(SameBytes(s, base));
  }
}

// A delta of over 2.2M changes (92% of "grown", 2.4M elements spanning
// every class): its undo log outgrows that of MakeLargeCase (33,000).
Case MakeOutgrowingCase() {
  std::mt19937_64 rng(39);
  Model m;
  m.Add("grown", Spread(rng, 2400000));
  Case large{m.State(), {}, {}, {}};
  large.hash = HashState(large.state, 1);
  std::bernoulli_distribution p(0.92);
  std::vector<uint64_t> at;
  for (uint64_t i = 0; i < 2400000; ++i) {
    if (p(rng)) at.push_back(i);
  }
  EXPECT_GT(at.size(), uint64_t{2200000});
  large.changes = {Change(large.state, "grown", at, rng)};
  EncodeCase(large);
  return large;
}

uint64_t ChangeCount(const Case& c) {
  uint64_t count = 0;
  for (const TensorChanges& t : c.changes) count += t.count();
  return count;
}

// One undo log (as a replica keeps it) for a small delta, then one whose
// 2.2M changes outgrow it (its vectors grow: 17.6 MB of positions), then
// the small one again: each apply is exact, its log holds every change and
// puts back every old value.
TEST(CompactApply, AnUndoLogOutgrownByALargerDeltaGrowsAndPutsEveryValueBack) {
  const Case small = MakeLargeCase();
  const Case large = MakeOutgrowingCase();
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    CompactUndo undo;
    for (const Case* c : std::initializer_list<const Case*>{&small, &large, &small}) {
      const uint64_t count = ChangeCount(*c);
      WeightState want = Copy(c->state);
      ApplyChanges(want, c->changes, 1);
      WeightState s = Copy(c->state);
      Result<CompactDelta> d = Apply(c->bytes, s, c->hash, threads, compact::DecodeChunkElements(), undo);
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      EXPECT_EQ(d->hash_delta, HashChanges(c->state, c->changes, 1));
      ASSERT_TRUE(SameBytes(s, want));
      EXPECT_GE(undo.pos32.size(), count);
      EXPECT_GE(undo.old16.size(), count);
      undo.Restore(threads);
      ASSERT_TRUE(SameBytes(s, c->state));
    }
  }
}

TEST(CompactApply, GapsPastTheBaseLeaveTheStateAsItWas) {
  const Case c = MakeCase();
  // The walk fails only at its last chunk, after every earlier chunk (and
  // every other tensor) wrote its values.
  const WeightState other = ShortOfClass8(c);
  CompactUndo undo;
  ForEachRankRoute(c, [&] {
    testing_bf16::ForEachTarget([&] {
      for (int threads : {1, 2, 3}) {
        for (uint64_t chunk : {uint64_t{1}, uint64_t{64}, uint64_t{1000}, compact::DecodeChunkElements()}) {
          SCOPED_TRACE("threads " + std::to_string(threads) + ", chunk " + std::to_string(chunk));
          WeightState s = Copy(other);
          Result<CompactDelta> d = Apply(c.bytes, s, c.hash, threads, chunk, undo);
          ASSERT_FALSE(d.ok());
          EXPECT_EQ(d.status().code(), ErrorCode::kCorruption) << d.status().ToString();
          EXPECT_TRUE(SameBytes(s, other));
        }
      }
    });
  });
}

// A delta refused as corrupt midway, the state left as it was before.
void ExpectRefusedLeavingTheState(const Result<CompactDelta>& d, const WeightState& s, const WeightState& before) {
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kCorruption) << d.status().ToString();
  ASSERT_TRUE(SameBytes(s, before));
}

// The undo log grows without zeroing: its fresh slots hold whatever the
// memory held, and slots reused from a larger apply hold that apply's
// entries. Applies that fail after most chunks wrote, with a log grown
// across applies of different change counts (fresh for the small delta,
// grown for the large one, then reused by the small one holding the large
// one's entries past its own), each leave the state bit-identical, and a
// good apply between them still puts every value back.
TEST(CompactApply, AppliesFailingMidwayWithALogGrownWithoutZeroingLeaveTheStateExactly) {
  const Case small = MakeCase();
  const WeightState small_short = ShortOfClass8(small);
  const Case large = MakeOutgrowingCase();
  // "grown" with its last 100,000 elements in one class: the walk of the
  // last chunks runs past the other classes' elements.
  Model m;
  std::vector<uint16_t> bits(large.state.tensors()[0].num_elements());
  std::memcpy(bits.data(), large.state.tensors()[0].data.data(), 2 * bits.size());
  for (size_t i = bits.size() - 100000; i < bits.size(); ++i) bits[i] = Bf16(0.01f);
  m.Add("grown", bits);
  const WeightState large_short = m.State();
  WeightState large_want = Copy(large.state);
  ApplyChanges(large_want, large.changes, 1);
  struct Step {
    const Case* c;
    const WeightState* onto;  // nullptr: c's own base, where the apply succeeds
  };
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    CompactUndo undo;
    for (const Step& step : {Step{&small, &small_short}, Step{&large, &large_short}, Step{&large, nullptr},
                             Step{&small, &small_short}, Step{&large, &large_short}}) {
      const uint64_t count = ChangeCount(*step.c);
      WeightState s = Copy(step.onto ? *step.onto : step.c->state);
      Result<CompactDelta> d = Apply(step.c->bytes, s, step.c->hash, threads, compact::DecodeChunkElements(), undo);
      EXPECT_EQ(undo.pos32.size(), count);
      if (step.onto) {
        ASSERT_NO_FATAL_FAILURE(ExpectRefusedLeavingTheState(d, s, *step.onto));
        continue;
      }
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      ASSERT_TRUE(SameBytes(s, large_want));
      undo.Restore(threads);
      ASSERT_TRUE(SameBytes(s, large.state));
    }
  }
}

// A replica's first compact apply after it starts parses into fresh
// buffers (its thread's are empty), sized ahead of the parse and not
// zero-filled; its later applies reuse them, holding the last delta's ranks
// and diffs. Here each thread count runs in a new thread (its first apply
// the thread's first), through deltas of versions 3 and 2 of different
// sizes, in and out of order, some failing midway: every success equals
// decode + scatter (the decoder's own run too) and is put back exactly by
// its undo log; every failure leaves the state bit-identical.
TEST(CompactApply, FirstAndLaterAppliesOverUnzeroedParseBuffersAreExact) {
  const Case small = MakeCase();
  const WeightState small_short = ShortOfClass8(small);
  const Case mid = MakeLargeCase();
  const Case large = MakeOutgrowingCase();
  struct Step {
    const Case* c;
    int version;
    const WeightState* onto;  // nullptr: c's own base, where the apply succeeds
  };
  const std::vector<Step> steps = {{&large, 3, nullptr}, {&small, 3, &small_short}, {&small, 3, nullptr},
                                   {&mid, 2, nullptr},   {&large, 2, nullptr},      {&small, 2, &small_short},
                                   {&small, 2, nullptr}, {&mid, 3, nullptr},        {&large, 3, nullptr}};
  std::vector<std::vector<uint8_t>> bytes;
  for (const Step& step : steps) {
    bytes.push_back(EncodeBytes(step.c->state, step.c->hash, step.c->changes, step.version));
    ASSERT_FALSE(bytes.back().empty());
  }
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    std::thread replica([&] {
      CompactUndo undo;
      for (size_t i = 0; i < steps.size(); ++i) {
        const Step& step = steps[i];
        SCOPED_TRACE("step " + std::to_string(i) + ", stream version " + std::to_string(step.version));
        WeightState s = Copy(step.onto ? *step.onto : step.c->state);
        Result<CompactDelta> d = Apply(bytes[i], s, step.c->hash, threads, compact::DecodeChunkElements(), undo);
        if (step.onto) {
          ASSERT_NO_FATAL_FAILURE(ExpectRefusedLeavingTheState(d, s, *step.onto));
          continue;
        }
        ASSERT_TRUE(d.ok()) << d.status().ToString();
        WeightState want = Copy(step.c->state);
        ApplyChanges(want, step.c->changes, 1);
        EXPECT_EQ(d->hash_delta, HashChanges(step.c->state, step.c->changes, 1));
        ASSERT_TRUE(SameBytes(s, want));
        undo.Restore(threads);
        ASSERT_TRUE(SameBytes(s, step.c->state));
        // The decoder, on the same thread's buffers, gives the same changes.
        Result<SafetensorsFile> f = ParseBytes(bytes[i], "decode.safetensors");
        ASSERT_TRUE(f.ok());
        Result<CompactDelta> decoded = DecodeCompactDelta(*f, step.c->state, step.c->hash, threads);
        ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
        EXPECT_EQ(decoded->hash_delta, d->hash_delta);
        WeightState scattered = Copy(step.c->state);
        ApplyChanges(scattered, decoded->changes, 1);
        ASSERT_TRUE(SameBytes(scattered, want));
      }
    });
    replica.join();
  }
}

TEST(CompactApply, DamagedBytesEitherApplyAsDecodedOrLeaveTheState) {
  // One bit flipped at a time in the delta's payload (the streams): the
  // fused apply either fails with the state untouched, or succeeds exactly
  // as decode + scatter of the same bytes does.
  const Case c = MakeCase();
  ASSERT_FALSE(c.bytes.empty());
  uint64_t header = 0;
  std::memcpy(&header, c.bytes.data(), 8);
  const size_t payload = 8 + static_cast<size_t>(header);
  CompactUndo undo;
  int failed = 0, applied = 0;
  for (size_t at = payload; at < c.bytes.size(); at += 13) {
    std::vector<uint8_t> bytes = c.bytes;
    bytes[at] ^= static_cast<uint8_t>(1u << (at % 8));
    WeightState s = Copy(c.state);
    // 1 to 3 threads: a stream read while others are walked (RunTasks).
    const int threads = 1 + static_cast<int>(at % 3);
    Result<CompactDelta> d = Apply(bytes, s, c.hash, threads, 1000, undo);
    Result<SafetensorsFile> f = ParseBytes(bytes, "fused.safetensors");
    ASSERT_TRUE(f.ok());
    Result<CompactDelta> ref = compact::DecodeCompactDeltaChunked(*f, c.state, c.hash, 1, 1000);
    ASSERT_EQ(d.ok(), ref.ok()) << "byte " << at;
    if (!d.ok()) {
      ++failed;
      EXPECT_EQ(d.status().ToString(), ref.status().ToString());
      ASSERT_TRUE(SameBytes(s, c.state)) << "byte " << at << ": " << d.status().ToString();
      continue;
    }
    ++applied;
    WeightState want = Copy(c.state);
    ApplyChanges(want, ref->changes, 1);
    EXPECT_EQ(d->hash_delta, ref->hash_delta);
    ASSERT_TRUE(SameBytes(s, want)) << "byte " << at;
  }
  EXPECT_GT(failed, 0);
  EXPECT_GT(applied, 0);
}

}  // namespace
}  // namespace deltasync
