// The compact walk's prefetch of the chunk a thread walks next
// (src/codec/compact_walk.cc, ChunkWalker::AheadOf): while chunk k is placed,
// the base elements of chunk k + ahead (the walk's thread count), whichever
// tensor that chunk belongs to; none past the last chunk or with ahead 0.
// Walk(k, next) prefetches BaseOf(next) instead, the chunk the thread
// walks next (the decoder hands chunks out one ahead: ParallelForAhead).
// A prefetch changes no result (the decode and apply tests cover those on
// 1-3 threads); this checks that it reads the chunk it means to.
// AddClassMoves (the class moves a fused apply adds to the held class
// totals) against its definition: each class's count among the new values
// less its count among the old ones.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "codec/compact_walk.h"

namespace deltasync {
namespace {

using compact::Bf16Tensor;
using compact::Chunk;
using compact::ChunkWalker;

TEST(CompactWalk, AheadOfIsTheChunkAheadAcrossTensorsAndNonePastTheLast) {
  // Two bf16 tensors of 10 and 5 elements in chunks of 4: [0,4) [4,8) [8,10)
  // of the first, [0,4) [4,5) of the second.
  std::vector<uint16_t> a(10), b(5);
  TensorView va{"a", DType::kBF16, {10}, ByteSpan(reinterpret_cast<const uint8_t*>(a.data()), 2 * a.size())};
  TensorView vb{"b", DType::kBF16, {5}, ByteSpan(reinterpret_cast<const uint8_t*>(b.data()), 2 * b.size())};
  Bf16Tensor ta, tb;
  ta.base = &va;
  tb.base = &vb;
  const std::vector<Bf16Tensor*> tensors{&ta, &tb};
  const std::vector<Chunk> chunks{{0, 0, 4, false}, {0, 4, 8, false}, {0, 8, 10, true}, {1, 0, 4, false},
                                  {1, 4, 5, true}};
  const std::string label = "walk";
  const std::vector<const uint16_t*> begin{a.data(), a.data() + 4, a.data() + 8, b.data(), b.data() + 4};
  const std::vector<size_t> size{4, 4, 2, 4, 1};
  for (size_t ahead : {1, 2, 4}) {
    SCOPED_TRACE("ahead " + std::to_string(ahead));
    const ChunkWalker walker(label, tensors, chunks, nullptr, ahead);
    for (size_t k = 0; k < chunks.size(); ++k) {
      SCOPED_TRACE("chunk " + std::to_string(k));
      const std::span<const uint16_t> got = walker.AheadOf(k);
      if (k + ahead < chunks.size()) {
        EXPECT_EQ(got.data(), begin[k + ahead]);
        EXPECT_EQ(got.size(), size[k + ahead]);
      } else {
        EXPECT_TRUE(got.empty());
      }
    }
    EXPECT_TRUE(walker.AheadOf(chunks.size()).empty());
  }
  const ChunkWalker none(label, tensors, chunks, nullptr, 0);
  for (size_t k = 0; k < chunks.size(); ++k) EXPECT_TRUE(none.AheadOf(k).empty());
  // BaseOf(k): chunk k's own base, the prefetch of Walk(j, k) (the chunk a
  // thread walks next, ParallelForAhead), whatever the walker's `ahead`.
  for (size_t k = 0; k < chunks.size(); ++k) {
    SCOPED_TRACE("base of chunk " + std::to_string(k));
    EXPECT_EQ(none.BaseOf(k).data(), begin[k]);
    EXPECT_EQ(none.BaseOf(k).size(), size[k]);
  }
  EXPECT_TRUE(none.BaseOf(chunks.size()).empty());
  EXPECT_TRUE(none.BaseOf(chunks.size() + 7).empty());
}

// The class counts of the new values less those of the old ones, whatever
// the values: with few exponent changes (most groups of 32 skipped by one
// test), exponent changes only at a group's first or last change or in the
// tail past the last whole group, and every change an exponent change;
// changes of sign or mantissa only move nothing.
TEST(CompactWalk, ClassMovesAreTheNewValuesClassCountsLessTheOldOnes) {
  std::mt19937_64 rng(43);
  const auto reference = [](const std::vector<uint16_t>& o, const std::vector<uint16_t>& v) {
    std::array<int32_t, compact::kClasses> want{};
    for (size_t j = 0; j < o.size(); ++j) {
      --want[compact::ClassOf(o[j])];
      ++want[compact::ClassOf(v[j])];
    }
    return want;
  };
  for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{63}, size_t{64}, size_t{65},
                   size_t{100}, size_t{1000}, size_t{4099}}) {
    // 0: no exponent change; 1: one in a hundred; 2: at positions 0, 31, 32,
    // 63 and the last; 3: every change; 4: one in a hundred, each of the
    // exponent's lowest bit only (the edge of the test's mask).
    for (int pattern = 0; pattern < 5; ++pattern) {
      SCOPED_TRACE("n " + std::to_string(n) + ", pattern " + std::to_string(pattern));
      std::vector<uint16_t> o(n), v(n);
      for (size_t j = 0; j < n; ++j) {
        o[j] = static_cast<uint16_t>(rng());
        v[j] = static_cast<uint16_t>(o[j] ^ (rng() & 0x807F));  // sign and mantissa only
        bool exponent = pattern == 3 || ((pattern == 1 || pattern == 4) && rng() % 100 == 0);
        if (pattern == 2) exponent = j == 0 || j == 31 || j == 32 || j == 63 || j + 1 == n;
        const unsigned bit = pattern == 4 ? 7 : pattern == 2 ? (j % 2 == 0 ? 7 : 14) : 7 + rng() % 8;
        if (exponent) v[j] = static_cast<uint16_t>(v[j] ^ (uint16_t{1} << bit));
      }
      std::array<int32_t, compact::kClasses> got{};
      got[3] = 5;  // added to, not overwritten
      compact::AddClassMoves(o.data(), v.data(), n, got);
      std::array<int32_t, compact::kClasses> want = reference(o, v);
      want[3] += 5;
      EXPECT_EQ(got, want);
    }
  }
}

}  // namespace
}  // namespace deltasync
