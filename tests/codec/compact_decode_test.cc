// The compact decoder's chunked, parallel walk (src/codec/compact_decode.cc):
// for every SIMD target, thread count and chunk size the decoded changes are
// exactly the encoded ones, including chunk borders inside runs of changes,
// tensors smaller than a chunk, classes with every change and classes with
// none; and a delta whose gaps run past its base's class elements is
// refused whatever the chunking.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

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

Result<CompactDelta> Decode(const Case& c, const WeightState& base, int threads, uint64_t chunk) {
  DS_ASSIGN_OR_RETURN(SafetensorsFile f, ParseBytes(c.bytes, "chunked.safetensors"));
  return compact::DecodeCompactDeltaChunked(f, base, c.hash, threads, chunk);
}

void ExpectDecodesOnEveryTargetThreadCountAndChunkSize(const Case& c) {
  ASSERT_FALSE(c.bytes.empty());
  ForEachRouteTargetThreadCountAndChunk(c, [&](int threads, uint64_t chunk) {
    Result<CompactDelta> d = Decode(c, c.state, threads, chunk);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    ASSERT_EQ(d->changes.size(), c.changes.size());
    EXPECT_EQ(d->hash_delta, HashChanges(c.state, c.changes, 1));
    for (size_t i = 0; i < c.changes.size(); ++i) {
      EXPECT_EQ(d->changes[i].name, c.changes[i].name);
      EXPECT_EQ(d->changes[i].indices, c.changes[i].indices);
      EXPECT_EQ(d->changes[i].values, c.changes[i].values);
    }
  });
}

TEST(CompactDecode, EveryTargetThreadCountAndChunkSizeGivesTheChanges) {
  ExpectDecodesOnEveryTargetThreadCountAndChunkSize(MakeCase());
}

// Blocks with no change, blocks where only some classes have one, a class
// whose only change is in a block's last word, one that skips every block
// up to the last.
TEST(CompactDecode, SparseChangesInFewClassesGiveTheChanges) {
  ExpectDecodesOnEveryTargetThreadCountAndChunkSize(MakeSparseCase());
}

// Base values at every exponent-class edge, NaN/Inf, subnormals; a block
// with one class only; a tensor shorter than a vector.
TEST(CompactDecode, BaseValuesAtEveryClassEdgeGiveTheChanges) {
  ExpectDecodesOnEveryTargetThreadCountAndChunkSize(MakeEdgeCase());
}

TEST(CompactDecode, GapsPastTheBaseAreRefusedWhateverTheChunks) {
  const Case c = MakeCase();
  // The same tensors, but "one_class" now holds half as many class-8
  // elements: the delta's class-8 gaps run past them (the hash passed is the
  // delta's, so only the walk can tell).
  const WeightState other = ShortOfClass8(c);
  ForEachRankRoute(c, [&] {
    testing_bf16::ForEachTarget([&] {
      for (int threads : {1, 2}) {
        for (uint64_t chunk : {uint64_t{1}, uint64_t{64}, uint64_t{1000}, compact::kDecodeChunkElements}) {
          SCOPED_TRACE("threads " + std::to_string(threads) + ", chunk " + std::to_string(chunk));
          Result<CompactDelta> d = Decode(c, other, threads, chunk);
          ASSERT_FALSE(d.ok());
          EXPECT_EQ(d.status().code(), ErrorCode::kCorruption) << d.status().ToString();
          EXPECT_NE(d.status().message().find("tensor 'one_class.cmp'"), std::string::npos) << d.status().ToString();
        }
      }
    });
  });
}

}  // namespace
}  // namespace deltasync
