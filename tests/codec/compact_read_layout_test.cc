// An adversarial review of the grouped read (compact_read.cc, ReadTensors;
// session 44 H4), its layouts and buffers: the rANS pieces of many tensors
// decoded together (DecodeRansPieces) must leave each tensor exactly what a
// one-piece-at-a-time read of that stream alone gives (RefRead:
// ParseBf16StreamV3Gaps, then DecodeRansPiece per piece, then
// ParseBf16StreamV3Rest), whatever the stream order, the grouping and the
// thread count; and a caller's reused buffers carry no earlier read.
// Damage and refusals: compact_read_damage_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codec/compact_read_review_util.h"

namespace deltasync {
namespace {

using namespace testing_compact;
using namespace testing_read;

// Many small tensors (one-state and two-state single pieces), raw-mode ones
// among them, a few of several pieces (a last piece of one state: 65537
// changes), and hand-made streams of 0 changes; streams in name order,
// reversed, shuffled, and each one twice (the same bytes into two
// tensors' buffers); 1, 2, 3 and 8 threads; both rank routes.
void CheckLayouts(const std::vector<Spec>& specs, uint64_t seed) {
  const Built b = Build(specs, seed);
  ASSERT_FALSE(b.bytes.empty());
  const std::unique_ptr<Listed> l = List(b);
  const compact::V3Tables* t = l->tables ? &*l->tables : nullptr;
  ASSERT_NE(t, nullptr);
  // A stream of 0 changes (bitmap 0, no pieces, no escapes) against each
  // bf16 base that has one.
  static const std::vector<uint8_t> empty = {compact::kStreamVersion3, compact::kModeBf16, 0, 0, 0};
  std::vector<TensorView> zeros;
  std::vector<const TensorView*> zero_bases;
  for (size_t i = 0; i < l->streams.size(); i += 5) {
    if (l->bases[i]->dtype != DType::kBF16) continue;
    zeros.push_back({l->streams[i].name, DType::kU8, {empty.size()}, empty});
    zero_bases.push_back(l->bases[i]);
  }
  std::vector<const TensorView*> all, all_bases;
  for (size_t i = 0; i < l->streams.size(); ++i) {
    all.push_back(&l->streams[i]);
    all_bases.push_back(l->bases[i]);
  }
  for (size_t z = 0; z < zeros.size(); ++z) {
    const size_t at = (z * 7919) % (all.size() + 1);
    all.insert(all.begin() + at, &zeros[z]);
    all_bases.insert(all_bases.begin() + at, zero_bases[z]);
  }
  // Version-2 streams of the same changes (a delta may mix versions) among
  // them, every third tensor's.
  const Built b2 = Build(specs, seed, 2);
  const std::unique_ptr<Listed> l2 = List(b2);
  for (size_t i = 0; i < l2->streams.size(); i += 3) {
    const size_t at = (i * 104729) % (all.size() + 1);
    all.insert(all.begin() + at, &l2->streams[i]);
    all_bases.insert(all_bases.begin() + at, l2->bases[i]);
  }
  std::mt19937_64 rng(seed + 1);
  for (bool wide : {false, true}) {
    compact::ForceWideRanks(wide);
    std::vector<Ref> refs(all.size());
    for (size_t i = 0; i < all.size(); ++i) RefRead(*all[i], *all_bases[i], t, refs[i]);
    for (int order = 0; order < 4; ++order) {
      std::vector<size_t> perm(all.size());
      for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
      if (order == 1) std::reverse(perm.begin(), perm.end());
      if (order == 2) std::shuffle(perm.begin(), perm.end(), rng);
      if (order == 3) {
        std::vector<size_t> twice;
        for (size_t i : perm) twice.insert(twice.end(), {i, i});
        perm = twice;
      }
      std::vector<const TensorView*> s, bs;
      for (size_t i : perm) {
        s.push_back(all[i]);
        bs.push_back(all_bases[i]);
      }
      for (int threads : {1, 2, 3, 8}) {
        const Read r = ReadAll(s, bs, t, threads);
        for (size_t k = 0; k < s.size(); ++k) {
          ASSERT_TRUE(r.errors[k].ok()) << r.errors[k].ToString();
          ExpectAsReference(r, k, *s[k], *bs[k], t, refs[perm[k]],
                            std::string(wide ? "wide" : "narrow") + " ranks, order " + std::to_string(order) +
                                ", threads " + std::to_string(threads) + ", position " + std::to_string(k) + " (" +
                                s[k]->name + ")");
          if (::testing::Test::HasFatalFailure()) break;
        }
        if (::testing::Test::HasFatalFailure()) break;
      }
    }
  }
  compact::ForceWideRanks(false);
}

std::vector<Spec> SmallSpecs(size_t tiny) {
  std::vector<Spec> specs;
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < tiny; ++i) {
    char name[16];
    std::snprintf(name, sizeof name, "a%04zu", i);
    const size_t changes = 1 + rng() % 140;  // one state below 64 changes
    specs.push_back({name, changes + rng() % 400, changes, i % 9 == 4});
  }
  specs.push_back({"m0", 9000, 2000});
  specs.push_back({"m1", 200000, 65537});  // two pieces, the last of one change
  specs.push_back({"m2", 70000, 65536});   // one full piece
  specs.push_back({"m3", 300000, 140000});  // three pieces, the last of two states
  return specs;
}

TEST(CompactReadReview, ManyTensorsMatchTheOnePieceReferenceInAnyOrder) { CheckLayouts(SmallSpecs(300), 11); }

// One tensor of more changes than a group (8 pieces) among small ones: its
// pieces all in its own group, the small ones before and after in others.
TEST(CompactReadReview, TensorLargerThanAGroup) {
  std::vector<Spec> specs = SmallSpecs(20);
  specs.push_back({"z_big", 1200000, 600000});
  specs.push_back({"z_small", 400, 70});
  CheckLayouts(specs, 12);
}

// A caller's buffers reused from a read where slot 0 held a version-3
// bf16 stream (its rANS pieces left to the group: deferred) for a raw-mode
// stream and a version-2 one: each read as into fresh buffers.
TEST(CompactReadReview, ReusedBuffersCarryNoDeferredRead) {
  const Built b = Build({{"r0", 3000, 100}, {"r1", 300, 40, true}}, 61);
  const Built b2 = Build({{"r0", 3000, 100}, {"r1", 300, 40, true}}, 61, 2);
  const std::unique_ptr<Listed> l = List(b);
  const std::unique_ptr<Listed> l2 = List(b2);
  const compact::V3Tables* t = &*l->tables;
  for (const TensorView* next : {&l->streams[1], &l2->streams[0]}) {
    const TensorView* next_base = next == &l->streams[1] ? l->bases[1] : l2->bases[0];
    Read r;
    r.bf.resize(1);
    r.raw.resize(1);
    compact::ReadCompactStreams("delta", {&l->streams[0]}, {l->bases[0]}, t, 1, r.raw, r.bf, r.errors);
    ASSERT_TRUE(r.errors[0].ok()) << r.errors[0].ToString();
    r.bf[0].escaped.clear();  // the contract: empty
    r.bf[0].count = 0;
    r.raw[0] = TensorChanges{};
    compact::ReadCompactStreams("delta", {next}, {next_base}, t, 1, r.raw, r.bf, r.errors);
    const Read fresh = ReadAll({next}, {next_base}, t, 1);
    if (next_base->dtype == DType::kBF16) {
      ExpectSameTensor(r, 0, fresh, 0, "after a deferred read, " + next->name);
      continue;
    }
    // A raw-mode stream: its outcome and changes (bf is not its output).
    EXPECT_EQ(r.errors[0].ToString(), fresh.errors[0].ToString());
    EXPECT_EQ(r.raw[0].indices, fresh.raw[0].indices);
    EXPECT_EQ(r.raw[0].values, fresh.raw[0].values);
  }
}

}  // namespace
}  // namespace deltasync
