// DetectAndEncodeGapDelta against DetectChanges + EncodeDelta (gap_delta):
// the same patch bytes on every SIMD target, thread count and chunk size,
// for fp32 masters of bf16 weights and other dtypes carried bitwise, at every
// change rate, with gaps too wide for 16 bits at and away from chunk
// borders, into one reused output; the same errors.

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bf16/bf16_test_util.h"
#include "bf16/gap_delta_case.h"
#include "bf16/chunked.h"
#include "bf16/chunks.h"
#include "codec/patch_test_util.h"
#include "deltasync/changes.h"
#include "deltasync/detect_encode.h"
#include "deltasync/patch.h"
#include "deltasync/safetensors.h"

namespace deltasync {
namespace {

using testing::Flatten;
using testing_bf16::AddMastered;
using testing_bf16::Case;
using testing_bf16::ForEachRate;
using testing_bf16::ForEachTarget;
using testing_bf16::InfoFor;
using testing_bf16::MakeCase;
using testing_bf16::RateCase;
using testing_bf16::Separate;
using testing_bf16::Views;

TEST(DetectAndEncodeGapDeltaTest, SameBytesAsDetectThenEncode) {
  ForEachRate(3, [](const RateCase& r) {
    DetectedGapDelta out;  // reused across targets, chunk sizes and threads
    ForEachTarget([&] {
      for (uint64_t chunk : {uint64_t{333}, uint64_t{4096}, uint64_t{65536}, uint64_t{70001},
                             bf16::kDefaultChunkElements}) {
        for (int threads : {1, 2, 5}) {
          SCOPED_TRACE("chunk " + std::to_string(chunk) + " threads " + std::to_string(threads));
          Status s = bf16::DetectAndEncodeGapDeltaChunked(r.c.state, r.current, {.threads = threads}, r.info, chunk,
                                                          out);
          ASSERT_TRUE(s.ok()) << s.ToString();
          EXPECT_EQ(Flatten(out.patch), r.want);
          EXPECT_EQ(out.changed, r.want_changed);
        }
      }
    });
    // The public entry (default chunks, all cores).
    ASSERT_TRUE(DetectAndEncodeGapDelta(r.c.state, r.current, {}, r.info, out).ok());
    EXPECT_EQ(Flatten(out.patch), r.want);
  });
}

// The wide gaps do widen: U32 where a gap passes 16 bits, U16 otherwise,
// and the patch decodes to the changes DetectChanges finds.
TEST(DetectAndEncodeGapDeltaTest, WideGapsDecodeToTheDetectedChanges) {
  const Case c = MakeCase(5, 0.01);
  const std::vector<TensorView> current = Views(c.current);
  auto want = DetectChanges(c.state, current);
  ASSERT_TRUE(want.ok());
  for (uint64_t chunk : {uint64_t{4096}, bf16::kDefaultChunkElements}) {
    DetectedGapDelta out;
    ASSERT_TRUE(bf16::DetectAndEncodeGapDeltaChunked(c.state, current, {.threads = 2}, InfoFor(c.state), chunk, out).ok());
    EXPECT_EQ(out.changed_tensors, want->size());
    auto file = SafetensorsFile::Parse(Blob::FromVector(Flatten(out.patch)), "fused");
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    for (const TensorView& e : file->tensors()) {
      if (e.name == "layers.0.sparse.idx" || e.name == "layers.1.sparse.idx" || e.name == "layers.3.just_wide.idx") {
        EXPECT_EQ(e.dtype, DType::kU32) << e.name;
      } else if (e.name.ends_with(".idx")) {
        EXPECT_EQ(e.dtype, DType::kU16) << e.name;
      }
    }
    auto decoded = DecodePatch(std::move(*file));
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    testing_bf16::ExpectSameChanges(decoded->changes, *want);
  }
}

// Against a base given as views in any order (the patch lists tensors by
// name): the view overload's bytes equal DetectChanges' view overload then
// EncodeDelta.
TEST(DetectAndEncodeGapDeltaTest, ViewsInAnyOrder) {
  const Case c = MakeCase(11, 0.034);
  std::vector<TensorView> base = Views(c.published);
  std::reverse(base.begin(), base.end());
  const std::vector<TensorView> current = Views(c.current);
  const PatchInfo info = InfoFor(c.state);
  auto changes = DetectChanges(std::span<const TensorView>(base), current);
  ASSERT_TRUE(changes.ok()) << changes.status().ToString();
  auto want = EncodeDelta(info, *changes);
  ASSERT_TRUE(want.ok());
  ForEachTarget([&] {
    for (uint64_t chunk : {uint64_t{4096}, bf16::kDefaultChunkElements}) {
      DetectedGapDelta out;
      Status s = bf16::DetectAndEncodeGapDeltaChunked(std::span<const TensorView>(base), current, {.threads = 2}, info,
                                                      chunk, out);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(Flatten(out.patch), Flatten(*want)) << "chunk " << chunk;
    }
  });
}

// Tensors smaller than a block or a chunk, a state without changes (a
// patch of its header only) and one whose every element changed.
TEST(DetectAndEncodeGapDeltaTest, TinyNoneAndAllChanged) {
  std::mt19937_64 rng(9);
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    Case c;
    for (uint64_t n : {1, 2, 9, 64, 1000}) {
      AddMastered(rng, c, "t" + std::to_string(n), {n}, [&](uint64_t i) {
        return variant == 0 ? false : variant == 1 ? true : (i % 3 == 1);
      });
    }
    c.state = std::move(WeightState::FromViews(Views(c.published))).value();
    const std::vector<TensorView> current = Views(c.current);
    uint64_t want_changed = 0;
    auto want = Separate(c.state, current, {}, InfoFor(c.state), &want_changed);
    ASSERT_TRUE(want.ok());
    if (variant == 1) {
      EXPECT_EQ(want_changed, c.state.total_elements());
    }
    ForEachTarget([&] {
      for (uint64_t chunk : {uint64_t{1}, uint64_t{7}, uint64_t{64}, bf16::kDefaultChunkElements}) {
        for (int threads : {1, 2, 5}) {
          DetectedGapDelta out;
          ASSERT_TRUE(bf16::DetectAndEncodeGapDeltaChunked(c.state, current, {.threads = threads}, InfoFor(c.state),
                                                           chunk, out).ok());
          EXPECT_EQ(Flatten(out.patch), *want) << "chunk " << chunk << " threads " << threads;
          EXPECT_EQ(out.changed, want_changed);
        }
      }
    });
  }
}

// A gap past 32 bits (U64): a bf16 tensor of 2^32 + 2 elements changed at
// its first and last element (gap 2^32). Its 8 GiB base and current are
// anonymous mappings that stay on the kernel's zero pages except where
// written, so the test holds a few MiB; the scan still reads 16 GiB
// (seconds), too slow under the sanitizers, which skip it.
TEST(DetectAndEncodeGapDeltaTest, GapsPastThirtyTwoBitsWidenToU64) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "reads 16 GiB of zero pages: too slow under a sanitizer";
#else
  const uint64_t n = (uint64_t{1} << 32) + 2;
  const size_t bytes = n * 2;
  auto map = [&]() -> uint8_t* {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    madvise(p, bytes, MADV_HUGEPAGE);  // reads then map the huge zero page where the kernel has one
    return static_cast<uint8_t*>(p);
  };
  uint8_t* base = map();
  uint8_t* now = map();
  if (base == nullptr || now == nullptr) GTEST_SKIP() << "cannot map 2 x 8 GiB of address space here";
  const uint16_t one = 0x3F80;  // 1.0
  std::memcpy(now, &one, 2);
  std::memcpy(now + bytes - 2, &one, 2);
  const std::vector<TensorView> published{{"huge", DType::kBF16, {n}, ByteSpan(base, bytes)}};
  const std::vector<TensorView> current{{"huge", DType::kBF16, {n}, ByteSpan(now, bytes)}};
  PatchInfo info;
  info.model_version = 2;
  info.base_version = 1;
  info.encoding = IndexEncoding::kGapDelta;
  info.total_elements = n;

  DetectedGapDelta out;
  Status s = DetectAndEncodeGapDelta(published, current, {.threads = 2}, info, out);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(out.changed, 2u);
  std::vector<uint8_t> got = Flatten(out.patch);
  auto changes = DetectChanges(published, current, {.threads = 2});
  ASSERT_TRUE(changes.ok()) << changes.status().ToString();
  auto want = EncodeDelta(info, *changes);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  EXPECT_EQ(got, Flatten(*want));
  munmap(base, bytes);
  munmap(now, bytes);

  auto file = SafetensorsFile::Parse(Blob::FromVector(std::move(got)), "fused");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  bool saw_idx = false;
  for (const TensorView& e : file->tensors()) {
    if (e.name != "huge.idx") continue;
    saw_idx = true;
    EXPECT_EQ(e.dtype, DType::kU64);
  }
  EXPECT_TRUE(saw_idx);
  auto decoded = DecodePatch(std::move(*file));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->changes.size(), 1u);
  ASSERT_EQ(decoded->changes[0].count(), 2u);
  EXPECT_EQ(decoded->changes[0].indices[0], 0u);
  EXPECT_EQ(decoded->changes[0].indices[1], n - 1);
#endif
}

// The same refusals as the two calls: a NaN master (the detect's message),
// the encode's checks of the PatchInfo; and gap_delta only. An error leaves
// no patch, and the next call fills it again.
TEST(DetectAndEncodeGapDeltaTest, SameErrorsAndNoPatchAfterOne) {
  Case c = MakeCase(7, 0.034);
  const PatchInfo info = InfoFor(c.state);
  DetectedGapDelta out;
  ASSERT_TRUE(DetectAndEncodeGapDelta(c.state, Views(c.current), {.threads = 2}, info, out).ok());
  ASSERT_GT(out.patch.size, 0u);
  uint64_t unused = 0;
  auto expect_same_error = [&](const std::vector<TensorView>& current, const PatchInfo& i) {
    auto want = Separate(c.state, current, {.threads = 2}, i, &unused);
    ASSERT_FALSE(want.ok());
    Status got = bf16::DetectAndEncodeGapDeltaChunked(c.state, current, {.threads = 2}, i, 4096, out);
    EXPECT_EQ(got.code(), want.status().code());
    EXPECT_EQ(got.message(), want.status().message());
    EXPECT_TRUE(out.patch.parts.empty());
    EXPECT_EQ(out.patch.size, 0u);
  };
  // NaN masters: one in the middle of a wide tensor, then an earlier one.
  for (uint64_t at : {uint64_t{120000}, uint64_t{5}}) {
    const uint32_t nan = 0x7FC00001;
    std::memcpy(c.current[0].data.data() + 4 * at, &nan, 4);
    expect_same_error(Views(c.current), info);
  }
  PatchInfo small = info;
  small.total_elements = 10;
  c = MakeCase(7, 0.034);
  expect_same_error(Views(c.current), small);
  PatchInfo same_base = info;
  same_base.base_version = info.model_version;
  expect_same_error(Views(c.current), same_base);
  // A missing tensor.
  std::vector<TensorView> fewer = Views(c.current);
  fewer.pop_back();
  expect_same_error(fewer, info);

  PatchInfo raw = info;
  raw.encoding = IndexEncoding::kRaw;
  Status refused = DetectAndEncodeGapDelta(c.state, Views(c.current), {}, raw, out);
  EXPECT_EQ(refused.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(out.patch.parts.empty());

  uint64_t changed = 0;
  auto want = Separate(c.state, Views(c.current), {}, info, &changed);
  ASSERT_TRUE(want.ok());
  ASSERT_TRUE(DetectAndEncodeGapDelta(c.state, Views(c.current), {.threads = 2}, info, out).ok());
  EXPECT_EQ(Flatten(out.patch), *want);
}

}  // namespace
}  // namespace deltasync
