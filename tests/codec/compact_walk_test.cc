// The compact walk's prefetch of the chunk a thread walks next
// (src/codec/compact_walk.cc, ChunkWalker::AheadOf): while chunk k is placed,
// the base elements of chunk k + ahead (the walk's thread count), whichever
// tensor that chunk belongs to; none past the last chunk or with ahead 0.
// Walk(k, next) prefetches BaseOf(next) instead, the chunk the thread
// walks next (the decoder hands chunks out one ahead: ParallelForAhead).
// A prefetch changes no result (the decode and apply tests cover those on
// 1-3 threads); this checks that it reads the chunk it means to.
#include <gtest/gtest.h>

#include <cstdint>
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

}  // namespace
}  // namespace deltasync
