// The class totals a CompactUndo holds (CompactClassTotals,
// include/deltasync/compact_class_totals.h): an apply to a state whose
// totals are held starts every chunk from them (no look-back; chunks handed
// out one ahead) and gives exactly what the look-back apply gives (state
// bytes, hash change, undo) over a chain of versions, on every target, 1-3
// threads and a few chunk sizes; the totals it keeps are the states' own
// class counts (elements moved between classes by the changes counted);
// wrong totals (corrupted, or a state changed behind them) are found by the
// chunks' own counts, undone and redone on the look-back route (counted in
// `stale`) with the exact result; Restore and a failed apply forget them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "bf16/bf16_test_util.h"
#include "codec/compact_bf16.h"
#include "codec/compact_case_util.h"
#include "codec/patch_test_util.h"
#include "deltasync/compact.h"

namespace deltasync {
namespace {

using testing::ParseBytes;
using namespace testing_compact;

// Versions 0..n of a large case (MakeLargeCase's tensors): each next
// version changes about 3% of "large" (a run across a chunk border) and a
// few of "after" (Change: +-1 ULP, larger moves into other classes, sign
// flips, NaN/Inf), delta k from version k to k + 1.
struct Chain {
  std::vector<WeightState> states;
  std::vector<StateHash> hashes;
  std::vector<std::vector<uint8_t>> deltas;
};

// The next version: `changes` to the chain's last state, and their delta.
void AddVersion(Chain& c, const std::vector<TensorChanges>& changes) {
  const WeightState& s = c.states.back();
  PatchInfo info;
  info.base_version = c.deltas.size();
  info.model_version = c.deltas.size() + 1;
  Result<EncodedPatch> e = EncodeCompactDelta(info, c.hashes.back(), s, changes);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  c.deltas.push_back(e.ok() ? testing::Flatten(*e) : std::vector<uint8_t>{});
  WeightState next = Copy(s);
  ApplyChanges(next, changes, 1);
  c.hashes.push_back(c.hashes.back() + HashChanges(s, changes, 1));
  c.states.push_back(std::move(next));
}

Chain MakeChain(int versions) {
  Chain c;
  Case first = MakeLargeCase();
  c.states.push_back(Copy(first.state));
  c.hashes.push_back(first.hash);
  std::mt19937_64 rng(37);
  for (int v = 0; v < versions; ++v) {
    const WeightState& s = c.states.back();
    std::bernoulli_distribution p(0.03);
    std::vector<uint64_t> large, after;
    for (uint64_t i = 0; i < 1050000; ++i) {
      if ((i >= 130000 && i < 131500) || p(rng)) large.push_back(i);
    }
    for (uint64_t i = 0; i < 40000; i += 97) after.push_back(i);
    AddVersion(c, {Change(s, "after", after, rng), Change(s, "large", large, rng)});
  }
  return c;
}

Result<CompactDelta> Apply(const std::vector<uint8_t>& bytes, WeightState& state, const StateHash& hash, int threads,
                           uint64_t chunk, CompactUndo& undo) {
  DS_ASSIGN_OR_RETURN(SafetensorsFile f, ParseBytes(bytes, "totals.safetensors"));
  return compact::ApplyCompactDeltaChunked(f, state, hash, threads, chunk, undo);
}

// The held totals of `hash` are `state`'s own class counts, chunk by chunk,
// of all 16 classes, and they hold every tensor.
void ExpectTotalsOf(const WeightState& state, const StateHash& hash, uint64_t chunk, const CompactUndo& undo) {
  const CompactClassTotals::State* held = undo.totals.Find(hash, chunk);
  ASSERT_NE(held, nullptr);
  ASSERT_EQ(held->tensors.size(), state.tensors().size());
  for (size_t i = 0; i < held->tensors.size(); ++i) {
    const CompactClassTotals::Tensor& t = held->tensors[i];
    const WeightState::Tensor& s = state.tensors()[i];
    ASSERT_EQ(t.elements, s.num_elements()) << s.name;
    ASSERT_EQ(t.chunks.size(), (t.elements + chunk - 1) / chunk);
    for (size_t j = 0; j < t.chunks.size(); ++j) {
      std::array<uint32_t, 16> want{};
      for (uint64_t e = j * chunk; e < std::min(t.elements, (j + 1) * chunk); ++e) {
        uint16_t v;
        std::memcpy(&v, s.data.data() + 2 * e, 2);
        ++want[compact::ClassOf(v)];
      }
      for (int cl = 0; cl < 16; ++cl) {
        ASSERT_EQ(t.chunks[j][cl], want[cl]) << s.name << " chunk " << j << " class " << cl;
      }
    }
  }
}

// Over versions 0 -> 1 -> 2 -> 3, one CompactUndo kept (as a replica): the
// first apply runs the look-back, the next two start from held totals
// (held_applies), none stale; each equals a look-back apply (a fresh undo)
// of the same delta to the same state: bytes, hash change, and the undo
// (Restore of either puts back the same state).
TEST(CompactClassTotals, HeldTotalsApplyEqualsTheLookBackApplyOverVersions) {
  const Chain c = MakeChain(3);
  ForEachTargetThreadCountAndLargeChunk([&](int threads, uint64_t chunk) {
    WeightState s = Copy(c.states[0]);
    CompactUndo kept;
    for (size_t v = 0; v < c.deltas.size(); ++v) {
      SCOPED_TRACE("delta " + std::to_string(v));
      WeightState r = Copy(c.states[v]);
      CompactUndo fresh;
      Result<CompactDelta> want = Apply(c.deltas[v], r, c.hashes[v], threads, chunk, fresh);
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      EXPECT_EQ(fresh.totals.held_applies, 0u);
      Result<CompactDelta> d = Apply(c.deltas[v], s, c.hashes[v], threads, chunk, kept);
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      EXPECT_EQ(kept.totals.held_applies, v);
      EXPECT_EQ(kept.totals.stale, 0u);
      EXPECT_EQ(d->hash_delta, want->hash_delta);
      EXPECT_EQ(c.hashes[v] + d->hash_delta, c.hashes[v + 1]);
      ASSERT_TRUE(SameBytes(s, c.states[v + 1]));
      ASSERT_TRUE(SameBytes(r, c.states[v + 1]));
      ExpectTotalsOf(c.states[v + 1], c.hashes[v + 1], chunk, kept);
      ExpectTotalsOf(c.states[v], c.hashes[v], chunk, kept);
      fresh.Restore(threads);
      ASSERT_TRUE(SameBytes(r, c.states[v]));
    }
    kept.Restore(threads);
    ASSERT_TRUE(SameBytes(s, c.states[c.deltas.size() - 1]));
  });
}

// Totals that do not describe the state (one class count of one chunk
// moved to the next: the sums still agree, only the chunks' own counts can
// tell) are found, the apply undone and redone with the look-back (stale
// 1), and the result is exact; on 1-3 threads and a few chunk sizes.
TEST(CompactClassTotals, CorruptHeldTotalsAreFoundAndTheApplyIsRedoneExactly) {
  const Chain c = MakeChain(2);
  ForEachTargetThreadCountAndLargeChunk([&](int threads, uint64_t chunk) {
    for (size_t at : {size_t{0}, size_t{3}}) {
      SCOPED_TRACE("chunk pair at " + std::to_string(at));
      WeightState s = Copy(c.states[0]);
      CompactUndo kept;
      ASSERT_TRUE(Apply(c.deltas[0], s, c.hashes[0], threads, chunk, kept).ok());
      auto* held = const_cast<CompactClassTotals::State*>(kept.totals.Find(c.hashes[1], chunk));
      ASSERT_NE(held, nullptr);
      CompactClassTotals::Tensor& large = held->tensors[1];  // "after", "large" in name order
      ASSERT_GT(large.chunks.size(), at + 1);
      // The chunk's most common class (3% of it changes: some in this class).
      const auto& counts = large.chunks[at];
      const int cl = static_cast<int>(std::max_element(counts.begin(), counts.end()) - counts.begin());
      ASSERT_GT(large.chunks[at][cl], 0u);
      --large.chunks[at][cl];
      ++large.chunks[at + 1][cl];
      Result<CompactDelta> d = Apply(c.deltas[1], s, c.hashes[1], threads, chunk, kept);
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      EXPECT_EQ(kept.totals.stale, 1u);
      EXPECT_EQ(kept.totals.held_applies, 0u);
      EXPECT_EQ(c.hashes[1] + d->hash_delta, c.hashes[2]);
      ASSERT_TRUE(SameBytes(s, c.states[2]));
      ExpectTotalsOf(c.states[2], c.hashes[2], chunk, kept);
      kept.Restore(threads);
      ASSERT_TRUE(SameBytes(s, c.states[1]));
    }
  });
}

// A state changed behind the totals (elements of chunk 2 moved into
// another class, the caller still naming the old hash): the held totals
// are found stale and the result is what the look-back apply gives on that
// state.
TEST(CompactClassTotals, AStateChangedBehindTheTotalsIsFoundAndTheResultIsExact) {
  const Chain c = MakeChain(2);
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    const uint64_t chunk = compact::DecodeChunkElements();
    WeightState s = Copy(c.states[0]);
    CompactUndo kept;
    ASSERT_TRUE(Apply(c.deltas[0], s, c.hashes[0], threads, chunk, kept).ok());
    // Unchanged elements of "large" in chunk 2 (none of delta 1 there
    // besides the ones we skip) moved to class 15 (1.0).
    WeightState::Tensor& large = s.mutable_tensors()[1];
    ASSERT_EQ(large.name, "large");
    for (uint64_t e = 2 * chunk + 5; e < 2 * chunk + 40; e += 7) {
      const uint16_t one = Bf16(1.0f);
      std::memcpy(large.data.data() + 2 * e, &one, 2);
    }
    WeightState r = Copy(s);
    CompactUndo fresh;
    Result<CompactDelta> want = Apply(c.deltas[1], r, c.hashes[1], threads, chunk, fresh);
    Result<CompactDelta> d = Apply(c.deltas[1], s, c.hashes[1], threads, chunk, kept);
    ASSERT_EQ(d.ok(), want.ok());
    EXPECT_EQ(kept.totals.stale, 1u);
    ASSERT_TRUE(SameBytes(s, r));
    if (d.ok()) EXPECT_EQ(d->hash_delta, want->hash_delta);
  }
}

// Restore forgets the totals; so does a failed apply (here a base hash
// that is not the delta's); a later apply runs the look-back again.
TEST(CompactClassTotals, RestoreAndAFailedApplyForgetTheTotals) {
  const Chain c = MakeChain(2);
  const uint64_t chunk = compact::DecodeChunkElements();
  WeightState s = Copy(c.states[0]);
  CompactUndo kept;
  ASSERT_TRUE(Apply(c.deltas[0], s, c.hashes[0], 2, chunk, kept).ok());
  EXPECT_NE(kept.totals.Find(c.hashes[0], chunk), nullptr);
  EXPECT_NE(kept.totals.Find(c.hashes[1], chunk), nullptr);
  EXPECT_EQ(kept.totals.Find(c.hashes[1], 4096), nullptr);  // another chunk size
  EXPECT_GT(kept.totals.HeldBytes(), 0u);
  kept.Restore(2);
  EXPECT_EQ(kept.totals.Find(c.hashes[0], chunk), nullptr);
  EXPECT_EQ(kept.totals.Find(c.hashes[1], chunk), nullptr);
  ASSERT_TRUE(SameBytes(s, c.states[0]));
  ASSERT_TRUE(Apply(c.deltas[0], s, c.hashes[0], 2, chunk, kept).ok());
  EXPECT_EQ(kept.totals.held_applies, 0u);
  ASSERT_NE(kept.totals.Find(c.hashes[1], chunk), nullptr);
  EXPECT_FALSE(Apply(c.deltas[1], s, c.hashes[0], 2, chunk, kept).ok());
  EXPECT_EQ(kept.totals.Find(c.hashes[1], chunk), nullptr);
  ASSERT_TRUE(SameBytes(s, c.states[1]));
  ASSERT_TRUE(Apply(c.deltas[1], s, c.hashes[1], 2, chunk, kept).ok());
  EXPECT_EQ(kept.totals.held_applies, 0u);
  ASSERT_TRUE(SameBytes(s, c.states[2]));
}

// Elements moved between classes across a chunk border: in a 3000-element
// tensor walked in chunks of 1000, element 999 from class 8 to 15 and 1000
// from 15 to 8, element 2999 from class 0 to 8: the totals kept for the
// new state are its own counts, and a held apply of a next delta is exact.
TEST(CompactClassTotals, ClassMovesAcrossChunksAreCounted) {
  std::vector<uint16_t> bits(3000, Bf16(0.01f));  // class 8
  for (size_t i = 0; i < bits.size(); i += 3) bits[i] = Bf16(1.0f);  // class 15
  bits[999] = Bf16(0.01f);
  bits[1000] = Bf16(2.0f);
  bits[2999] = 0;  // class 0
  Model m;
  m.Add("t", bits);
  Chain c;
  c.states.push_back(m.State());
  c.hashes.push_back(HashState(c.states[0], 1));
  auto change = [](std::vector<std::pair<uint64_t, uint16_t>> to) {
    TensorChanges t{"t", DType::kBF16, {}, {}};
    for (auto [i, v] : to) {
      t.indices.push_back(i);
      t.values.push_back(static_cast<uint8_t>(v));
      t.values.push_back(static_cast<uint8_t>(v >> 8));
    }
    return std::vector<TensorChanges>{t};
  };
  AddVersion(c, change({{5, Bf16(0.02f)}, {999, Bf16(1.5f)}, {1000, Bf16(0.011f)}, {2999, Bf16(0.01f)}}));
  AddVersion(c, change({{4, Bf16(0.03f)}, {999, Bf16(0.012f)}, {2000, Bf16(0.5f)}}));
  testing_bf16::ForEachTarget([&] {
    WeightState s = Copy(c.states[0]);
    CompactUndo kept;
    ASSERT_TRUE(Apply(c.deltas[0], s, c.hashes[0], 1, 1000, kept).ok());
    ASSERT_TRUE(SameBytes(s, c.states[1]));
    ExpectTotalsOf(c.states[1], c.hashes[1], 1000, kept);
    const CompactClassTotals::State* held = kept.totals.Find(c.hashes[1], 1000);
    ASSERT_NE(held, nullptr);
    EXPECT_EQ(held->tensors[0].chunks[0][15], 334u);  // 0, 3, ..., 999 less 999, plus 999
    EXPECT_EQ(held->tensors[0].chunks[1][15], 333u);  // 1002, ..., 1998: 1000 moved out
    Result<CompactDelta> d = Apply(c.deltas[1], s, c.hashes[1], 1, 1000, kept);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(kept.totals.held_applies, 1u);
    EXPECT_EQ(kept.totals.stale, 0u);
    ASSERT_TRUE(SameBytes(s, c.states[2]));
  });
}

// A chain whose delta v changes, in each tensor named in names[v], every
// 7th element of the classes in classes[v] (Change: most stay in their
// class, some move to others; a change's class is its old value's).
Chain MakeClassChain(const std::vector<std::vector<std::string>>& names, const std::vector<uint32_t>& classes) {
  Chain c;
  Case first = MakeLargeCase();
  c.states.push_back(Copy(first.state));
  c.hashes.push_back(first.hash);
  std::mt19937_64 rng(38);
  for (size_t v = 0; v < classes.size(); ++v) {
    const WeightState& s = c.states.back();
    std::vector<TensorChanges> changes;
    for (const std::string& name : names[v]) {
      const WeightState::Tensor* t = s.Find(name);
      std::vector<uint64_t> at;
      for (uint64_t i = 0, seen = 0; i < t->num_elements(); ++i) {
        uint16_t x;
        std::memcpy(&x, t->data.data() + 2 * i, 2);
        if ((classes[v] >> compact::ClassOf(x) & 1) && seen++ % 7 == 0) at.push_back(i);
      }
      changes.push_back(Change(s, name, at, rng));
    }
    AddVersion(c, changes);
  }
  return c;
}

// Applies delta v of `c` to `s` (at version v) with `kept`, and checks it
// against a look-back apply (a fresh undo) of the same delta to a copy:
// bytes, hash change; then the totals `kept` holds for version v + 1
// against a brute-force count of all 16 classes.
void ApplyAndCheck(const Chain& c, size_t v, WeightState& s, int threads, uint64_t chunk, CompactUndo& kept) {
  SCOPED_TRACE("delta " + std::to_string(v));
  WeightState r = Copy(c.states[v]);
  CompactUndo fresh;
  Result<CompactDelta> want = Apply(c.deltas[v], r, c.hashes[v], threads, chunk, fresh);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  Result<CompactDelta> d = Apply(c.deltas[v], s, c.hashes[v], threads, chunk, kept);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->hash_delta, want->hash_delta);
  EXPECT_EQ(c.hashes[v] + d->hash_delta, c.hashes[v + 1]);
  ASSERT_TRUE(SameBytes(s, c.states[v + 1]));
  ASSERT_TRUE(SameBytes(r, c.states[v + 1]));
  ExpectTotalsOf(c.states[v + 1], c.hashes[v + 1], chunk, kept);
}

constexpr uint32_t kClass8 = 1u << 8, kClass10 = 1u << 10;

// Every delta of `c` in turn with one CompactUndo kept (ApplyAndCheck),
// every apply after the first from held totals, none stale; on every
// target, 1-3 threads and a few chunk sizes.
void ApplyChainHeld(const Chain& c) {
  ForEachTargetThreadCountAndLargeChunk([&](int threads, uint64_t chunk) {
    WeightState s = Copy(c.states[0]);
    CompactUndo kept;
    for (size_t v = 0; v < c.deltas.size(); ++v) {
      ApplyAndCheck(c, v, s, threads, chunk, kept);
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_EQ(kept.totals.held_applies, v);
      EXPECT_EQ(kept.totals.stale, 0u);
    }
  });
}

// Held classes only grow: the first delta changes elements of class 8 only,
// the second of class 8 again, the third of classes 8 and 10. The totals
// the first apply fills count every class, and each apply carries them all
// (the class moves of its changes added), so the third still starts from
// held totals (held_applies 2, none stale) and is exact.
TEST(CompactClassTotals, ADeltaWithAClassTheEarlierOnesLackedStaysHeld) {
  const std::vector<std::string> both = {"after", "large"};
  const Chain c = MakeClassChain({both, both, both}, {kClass8, kClass8, kClass8 | kClass10});
  ApplyChainHeld(c);
}

// The totals after N applies equal a brute-force count of all 16 classes
// of the state (ApplyAndCheck), also over deltas that change one tensor
// and then another (the tensors not walked keep their totals).
TEST(CompactClassTotals, TotalsAfterManyAppliesCountEveryClass) {
  const std::vector<std::string> both = {"after", "large"}, large = {"large"};
  const Chain c = MakeClassChain({both, large, both, large, both}, {0xFFFF, 0x00F0, 0x0F0F, 0xF000, 0xFFFF});
  ApplyChainHeld(c);
}

// A tensor walked as one chunk that is not held ("after", 40,000 elements,
// not changed by the first delta) beside a held tensor of several chunks:
// it has no look-back to wait on, so the apply still counts as held (the
// chunks claimed one ahead) and is exact; the totals then hold both.
TEST(CompactClassTotals, AnUnheldOneChunkTensorKeepsTheHeldRoute) {
  const Chain c = MakeClassChain({{"large"}, {"after", "large"}}, {0xFFFF, 0xFFFF});
  testing_bf16::ForEachTarget([&] {
    for (int threads : {1, 2, 3}) {
      SCOPED_TRACE("threads " + std::to_string(threads));
      const uint64_t chunk = compact::DecodeChunkElements();
      WeightState s = Copy(c.states[0]);
      CompactUndo kept;
      Result<CompactDelta> first = Apply(c.deltas[0], s, c.hashes[0], threads, chunk, kept);
      ASSERT_TRUE(first.ok()) << first.status().ToString();
      EXPECT_EQ(kept.totals.held_applies, 0u);
      const CompactClassTotals::State* held = kept.totals.Find(c.hashes[1], chunk);
      ASSERT_NE(held, nullptr);
      ASSERT_EQ(held->tensors[0].elements, 0u);  // "after": not walked, not held
      ASSERT_GT(held->tensors[1].chunks.size(), 1u);
      ApplyAndCheck(c, 1, s, threads, chunk, kept);
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_EQ(kept.totals.held_applies, 1u);
      EXPECT_EQ(kept.totals.stale, 0u);
    }
  });
}

// A corrupted held count of a class the next delta has no change in (class
// 10 of "large", one count moved from a chunk to the next) does not matter
// to that apply (held, exact) and is carried on; the delta after it, with
// changes in class 10, finds it (stale 1) and is redone exactly.
TEST(CompactClassTotals, ACorruptCountOfAClassWithoutChangesIsFoundWhenItGetsChanges) {
  const std::vector<std::string> both = {"after", "large"};
  const Chain c = MakeClassChain({both, both, both}, {kClass8, kClass8, kClass8 | kClass10});
  ForEachTargetThreadCountAndLargeChunk([&](int threads, uint64_t chunk) {
    WeightState s = Copy(c.states[0]);
    CompactUndo kept;
    ApplyAndCheck(c, 0, s, threads, chunk, kept);
    if (::testing::Test::HasFatalFailure()) return;
    CompactClassTotals::State* held = kept.totals.Find(c.hashes[1], chunk);
    ASSERT_NE(held, nullptr);
    CompactClassTotals::Tensor& large = held->tensors[1];
    ASSERT_GT(large.chunks.size(), 2u);
    ASSERT_GT(large.chunks[1][10], 0u);
    --large.chunks[1][10];
    ++large.chunks[2][10];
    // Delta 1 (class 8 only): held, exact (the bytes, and the totals kept
    // under the right hash: base + the apply's hash change), the wrong
    // count carried on.
    ASSERT_TRUE(Apply(c.deltas[1], s, c.hashes[1], threads, chunk, kept).ok());
    ASSERT_TRUE(SameBytes(s, c.states[2]));
    ASSERT_NE(kept.totals.Find(c.hashes[2], chunk), nullptr);
    EXPECT_EQ(kept.totals.held_applies, 1u);
    EXPECT_EQ(kept.totals.stale, 0u);
    // Delta 2 (classes 8 and 10): found stale, redone, exact (against a
    // look-back apply), its totals the state's own.
    ApplyAndCheck(c, 2, s, threads, chunk, kept);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(kept.totals.stale, 1u);
    EXPECT_EQ(kept.totals.held_applies, 1u);
  });
}

}  // namespace
}  // namespace deltasync
