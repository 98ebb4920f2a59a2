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

// c decoded on `threads` threads in chunks of `chunk` gives c's changes.
void ExpectDecodesTo(const Case& c, int threads, uint64_t chunk) {
  Result<CompactDelta> d = Decode(c, c.state, threads, chunk);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_EQ(d->changes.size(), c.changes.size());
  EXPECT_EQ(d->hash_delta, HashChanges(c.state, c.changes, 1));
  for (size_t i = 0; i < c.changes.size(); ++i) {
    EXPECT_EQ(d->changes[i].name, c.changes[i].name);
    EXPECT_EQ(d->changes[i].indices, c.changes[i].indices);
    EXPECT_EQ(d->changes[i].values, c.changes[i].values);
  }
}

void ExpectDecodesOnEveryTargetThreadCountAndChunkSize(const Case& c) {
  ASSERT_FALSE(c.bytes.empty());
  ForEachRouteTargetThreadCountAndChunk(c, [&](int threads, uint64_t chunk) { ExpectDecodesTo(c, threads, chunk); });
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

// A case the decoder walks on every thread it is given (above
// kParallelWalkMin; the other cases walk on one thread whatever `threads`
// says), in chunks whose class totals come from the counting pass (more
// than one thread) or, on one thread, from the walk itself
// (compact_walk.cc), with chunks past the last change.
TEST(CompactDecode, ALargeCaseWalkedOnEveryThreadCountGivesTheChanges) {
  const Case c = MakeLargeCase();
  ASSERT_FALSE(c.bytes.empty());
  ForEachTargetThreadCountAndLargeChunk([&](int threads, uint64_t chunk) { ExpectDecodesTo(c, threads, chunk); });
}

// A CompactDelta holding junk: more entries than any case, of another
// dtype, larger and smaller than the cases' entries, and info and hashes
// that no decode gives.
CompactDelta Junk() {
  CompactDelta d;
  d.info.kind = PatchKind::kAnchor;
  d.info.encoding = IndexEncoding::kRaw;
  d.info.model_version = 99;
  d.info.base_version = 98;
  d.info.total_elements = 7;
  d.info.total_changed_elements = 7;
  d.info.num_changed_params = 7;
  d.base_hash = StateHash{1, 2};
  d.hash_delta = StateHash{3, 4};
  for (size_t k = 0; k < 6; ++k) {
    TensorChanges c;
    c.name = "junk" + std::to_string(k);
    c.dtype = DType::kF32;
    c.indices.assign(k % 2 ? 9000 : 3, ~uint64_t{0});
    c.values.assign(k % 2 ? 36000 : 12, 0xAB);
    d.changes.push_back(std::move(c));
  }
  return d;
}

// `d` (a decode of c into reused outputs) holds exactly what a fresh decode
// of c does.
void ExpectSameAsFresh(const Case& c, int threads, uint64_t chunk, const CompactDelta& d) {
  Result<CompactDelta> fresh = Decode(c, c.state, threads, chunk);
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  ASSERT_EQ(fresh->changes.size(), c.changes.size());
  ASSERT_EQ(d.changes.size(), c.changes.size());
  EXPECT_EQ(d.hash_delta, HashChanges(c.state, c.changes, 1));
  EXPECT_EQ(d.hash_delta, fresh->hash_delta);
  EXPECT_EQ(d.base_hash, fresh->base_hash);
  EXPECT_EQ(d.info.kind, fresh->info.kind);
  EXPECT_EQ(d.info.model_version, fresh->info.model_version);
  EXPECT_EQ(d.info.encoding, fresh->info.encoding);
  EXPECT_EQ(d.info.base_version, fresh->info.base_version);
  EXPECT_EQ(d.info.total_elements, fresh->info.total_elements);
  EXPECT_EQ(d.info.total_changed_elements, fresh->info.total_changed_elements);
  EXPECT_EQ(d.info.num_changed_params, fresh->info.num_changed_params);
  for (size_t i = 0; i < c.changes.size(); ++i) {
    EXPECT_EQ(d.changes[i].name, c.changes[i].name);
    EXPECT_EQ(d.changes[i].dtype, c.changes[i].dtype);
    EXPECT_EQ(d.changes[i].indices, c.changes[i].indices);
    EXPECT_EQ(d.changes[i].values, c.changes[i].values);
  }
}

// The mixed case (a raw-mode F32 tensor beside a bf16 one), encoded.
Case MakeEncodedMixedCase() {
  MixedCase m = MakeMixedCase();
  Case c{std::move(m.state), {}, std::move(m.changes), {}};
  c.hash = HashState(c.state, 1);
  c.bytes = EncodeBytes(c.state, c.hash, c.changes, kCompactStreamAuto);
  return c;
}

// One CompactDelta, holding junk at first, decoded into again and again:
// cases of 4, 1, 2, 4 and 2 tensors (entries grow, shrink, change name and
// dtype, a raw-mode one among them), on every route, target, thread count
// and chunk size; each time it holds what a fresh decode gives.
TEST(CompactDecode, IntoReusedOutputsGivesWhatAFreshDecodeGives) {
  const Case cases[] = {MakeCase(), MakeSparseCase(), MakeEdgeCase(), MakeCase(), MakeEncodedMixedCase()};
  CompactDelta out = Junk();
  for (const Case& c : cases) {
    ForEachRouteTargetThreadCountAndChunk(c, [&](int threads, uint64_t chunk) {
      Result<SafetensorsFile> f = ParseBytes(c.bytes, "reused.safetensors");
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      const std::vector<TensorView> views = c.state.views();
      const Status s = compact::DecodeCompactDeltaChunked(*f, views, c.hash, threads, chunk, out);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ExpectSameAsFresh(c, threads, chunk, out);
    });
    if (::testing::Test::HasFatalFailure()) return;
  }
  // The public call (the decoder's own chunk size) too.
  const Case& c = cases[0];
  Result<SafetensorsFile> f = ParseBytes(c.bytes, "reused.safetensors");
  ASSERT_TRUE(f.ok());
  const std::vector<TensorView> views = c.state.views();
  out = Junk();
  ASSERT_TRUE(DecodeCompactDelta(*f, views, c.hash, 2, out).ok());
  ExpectSameAsFresh(c, 2, compact::DecodeChunkElements(), out);
}

// Entry k keeps its memory: decoding the same delta again leaves every
// entry's buffers where they were, and a delta of fewer changes (the sparse
// case after the full one) keeps the larger capacity.
TEST(CompactDecode, IntoReusedOutputsKeepsTheirMemory) {
  const Case full = MakeCase();
  const Case sparse = MakeSparseCase();
  Result<SafetensorsFile> ff = ParseBytes(full.bytes, "full.safetensors");
  Result<SafetensorsFile> fs = ParseBytes(sparse.bytes, "sparse.safetensors");
  ASSERT_TRUE(ff.ok() && fs.ok());
  const std::vector<TensorView> full_views = full.state.views(), sparse_views = sparse.state.views();
  CompactDelta out;
  ASSERT_TRUE(DecodeCompactDelta(*ff, full_views, full.hash, 1, out).ok());
  ASSERT_EQ(out.changes.size(), 4u);
  std::vector<const uint64_t*> indices;
  std::vector<const uint8_t*> values;
  for (const TensorChanges& c : out.changes) {
    indices.push_back(c.indices.data());
    values.push_back(c.values.data());
  }
  const size_t big = out.changes[0].indices.size();
  ASSERT_GT(big, sparse.changes[0].indices.size());
  for (int threads : {1, 2}) {
    ASSERT_TRUE(DecodeCompactDelta(*ff, full_views, full.hash, threads, out).ok());
    ExpectSameAsFresh(full, threads, compact::DecodeChunkElements(), out);
    for (size_t k = 0; k < out.changes.size(); ++k) {
      EXPECT_EQ(out.changes[k].indices.data(), indices[k]) << k;
      EXPECT_EQ(out.changes[k].values.data(), values[k]) << k;
    }
  }
  ASSERT_TRUE(DecodeCompactDelta(*fs, sparse_views, sparse.hash, 1, out).ok());
  ExpectSameAsFresh(sparse, 1, compact::DecodeChunkElements(), out);
  EXPECT_GE(out.changes[0].indices.capacity(), big);
  EXPECT_GE(out.changes[0].values.capacity(), 2 * big);
  EXPECT_EQ(out.changes[0].indices.data(), indices[0]);
}

// A decode into reused outputs that fails returns the fresh decode's error
// and leaves a default CompactDelta.
TEST(CompactDecode, IntoReusedOutputsIsEmptyAfterAnError) {
  const Case c = MakeCase();
  const WeightState other = ShortOfClass8(c);
  const std::vector<TensorView> views = other.views();
  for (int threads : {1, 2}) {
    Result<SafetensorsFile> f = ParseBytes(c.bytes, "bad.safetensors");
    ASSERT_TRUE(f.ok());
    CompactDelta out = Junk();
    const Status s = DecodeCompactDelta(*f, views, c.hash, threads, out);
    const Result<CompactDelta> fresh = DecodeCompactDelta(*f, views, c.hash, threads);
    ASSERT_FALSE(s.ok());
    ASSERT_FALSE(fresh.ok());
    EXPECT_EQ(s.ToString(), fresh.status().ToString());
    EXPECT_TRUE(out.changes.empty());
    EXPECT_EQ(out.info.model_version, 0u);
    EXPECT_FALSE(out.info.base_version.has_value());
    EXPECT_EQ(out.hash_delta, StateHash{});
    // Refused before any tensor is read (another base's hash): the same.
    out = Junk();
    const Status h = DecodeCompactDelta(*f, views, StateHash{5, 6}, threads, out);
    EXPECT_EQ(h.code(), ErrorCode::kFailedPrecondition) << h.ToString();
    EXPECT_TRUE(out.changes.empty());
  }
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
        for (uint64_t chunk : {uint64_t{1}, uint64_t{64}, uint64_t{1000}, compact::DecodeChunkElements()}) {
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
