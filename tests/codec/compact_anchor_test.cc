// EncodeCompressedAnchor's reused buffers (compact_anchor.cc): the planes
// split into per-thread buffers, zstd's output in a per-thread buffer
// (PutBlock), the chunks' buffers kept as the file's parts. Many tensors of
// every length class around a vector, a block's 32-byte minimum and the
// 2^20-element chunk, on 1 to 8 threads whose buffers last held a larger
// anchor's chunks, give byte for byte what one fresh thread gives; the
// parts own their bytes (another encode, which writes over every thread's
// buffers, leaves them as they were); every SIMD target gives those bytes;
// the file decodes to the tensors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bf16/bf16_test_util.h"
#include "codec/patch_test_util.h"
#include "deltasync/compact.h"

namespace deltasync {
namespace {

using testing::Flatten;
using testing::ParseBytes;

constexpr uint64_t kChunk = uint64_t{1} << 20;  // compact_anchor.cc's chunk

struct Tensors {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
  // A tensor of `n` elements: bf16 of a narrow normal spread (the exponent
  // plane compresses), every bit random (it does not: stored), or one value
  // repeated (zstd's RLE); other dtypes' bytes random or repeated.
  enum class Fill { kNormal, kRandom, kConstant };
  void Add(std::mt19937_64& rng, std::string name, DType dtype, uint64_t n, Fill fill) {
    std::vector<uint8_t> bytes(n * DTypeSize(dtype));
    std::normal_distribution<float> normal(0.0f, 0.02f);
    const auto constant = static_cast<uint8_t>(rng());
    for (uint64_t k = 0; k < n; ++k) {
      if (dtype == DType::kBF16 && fill == Fill::kNormal) {
        const float x = normal(rng);
        uint32_t u;
        std::memcpy(&u, &x, 4);
        const auto h = static_cast<uint16_t>(u >> 16);
        std::memcpy(bytes.data() + 2 * k, &h, 2);
        continue;
      }
      for (size_t b = 0; b < DTypeSize(dtype); ++b) {
        bytes[k * DTypeSize(dtype) + b] = fill == Fill::kConstant ? constant : static_cast<uint8_t>(rng());
      }
    }
    storage.push_back(std::move(bytes));
    views.push_back({std::move(name), dtype, {n}, {}});
  }
  void Seal() {
    for (size_t i = 0; i < views.size(); ++i) views[i].data = storage[i];
  }
};

// Every length class of bf16 tensor (empty, shorter than a vector, around
// the 32-byte block minimum, around the chunk, several chunks and a tail)
// in the three fills, blocks too short for zstd right after ones it shrank,
// and other dtypes.
Tensors ManyTensors() {
  std::mt19937_64 rng(42);
  Tensors t;
  const std::vector<uint64_t> lengths = {0, 1, 15, 31, 32, 33, 63, 64, 65, 1000, kChunk - 1, kChunk, kChunk + 1,
                                         2 * kChunk + 17};
  using Fill = Tensors::Fill;
  // Named in the order added (one thread encodes them in name order).
  int k = 0;
  auto add = [&](DType dtype, uint64_t n, Fill fill) {
    char name[32];
    std::snprintf(name, sizeof(name), "layers.%03d", k++);
    t.Add(rng, name, dtype, n, fill);
  };
  for (size_t i = 0; i < lengths.size(); ++i) {
    for (Fill fill : {Fill::kNormal, Fill::kRandom, Fill::kConstant}) {
      // The big ones in one fill each (in turn), to keep the test short.
      if (lengths[i] >= kChunk - 1 && static_cast<size_t>(fill) != i % 3) continue;
      add(DType::kBF16, lengths[i], fill);
    }
  }
  // A block under 32 bytes (stored, zstd not tried) right after one that
  // zstd shrank to fewer bytes than it holds.
  for (uint64_t n : {1, 15, 31}) {
    add(DType::kBF16, 1000, Fill::kConstant);
    add(DType::kBF16, n, Fill::kRandom);
  }
  add(DType::kF32, 100, Fill::kConstant);
  add(DType::kU8, 20, Fill::kRandom);
  add(DType::kF32, 1001, Fill::kRandom);
  add(DType::kF32, kChunk + 3, Fill::kConstant);
  add(DType::kI64, 7, Fill::kRandom);
  add(DType::kF16, 40, Fill::kRandom);
  add(DType::kU8, 33, Fill::kConstant);
  t.Seal();
  return t;
}

// A larger anchor (longer chunks of other bytes): encoded first, it leaves
// every thread's plane and zstd buffers longer than any chunk above needs,
// holding its own bytes.
Tensors LargerTensors() {
  std::mt19937_64 rng(7);
  Tensors t;
  for (int i = 0; i < 6; ++i) t.Add(rng, "big." + std::to_string(i), DType::kBF16, 3 * kChunk + 5, Tensors::Fill::kRandom);
  t.Seal();
  return t;
}

TEST(CompressedAnchor, ManyTensorsOnReusedThreadsGiveWhatAFreshThreadGives) {
  const Tensors many = ManyTensors();
  ASSERT_EQ(many.views.size(), 47u);
  const Tensors larger = LargerTensors();
  // The reference: one thread of its own (threads = 1 runs on the calling
  // thread), its buffers fresh.
  std::vector<uint8_t> want;
  std::thread([&] {
    Result<EncodedPatch> e = EncodeCompressedAnchor(5, many.views, 1);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    want = Flatten(*e);
  }).join();
  ASSERT_FALSE(want.empty());

  for (int threads : {1, 2, 3, 8}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    ASSERT_TRUE(EncodeCompressedAnchor(6, larger.views, threads).ok());
    Result<EncodedPatch> e = EncodeCompressedAnchor(5, many.views, threads);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(Flatten(*e), want);
    // The parts are the patch's own: encoding another anchor on the same
    // threads writes over their buffers, not over these bytes.
    ASSERT_TRUE(EncodeCompressedAnchor(6, larger.views, threads).ok());
    EXPECT_EQ(Flatten(*e), want);
    uint64_t size = 0;
    for (ByteSpan p : e->parts) size += p.size();
    EXPECT_EQ(size, e->size);
  }

  // Every SIMD target's split (the planes' kernel) gives the same bytes.
  testing_bf16::ForEachTarget([&] {
    Result<EncodedPatch> e = EncodeCompressedAnchor(5, many.views, 2);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(Flatten(*e), want);
  });

  Result<SafetensorsFile> f = ParseBytes(want, "many.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::vector<TensorView> sorted = many.views;
  std::sort(sorted.begin(), sorted.end(), [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  for (int threads : {1, 3}) {
    Result<DecodedAnchor> d = DecodeCompressedAnchor(*f, threads);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    ASSERT_EQ(d->tensors.size(), sorted.size());
    for (size_t i = 0; i < sorted.size(); ++i) {
      EXPECT_EQ(d->tensors[i].name, sorted[i].name);
      EXPECT_EQ(d->tensors[i].dtype, sorted[i].dtype);
      EXPECT_TRUE(std::equal(d->tensors[i].data.begin(), d->tensors[i].data.end(), sorted[i].data.begin(),
                             sorted[i].data.end()))
          << sorted[i].name;
    }
  }
}

// Names where one is another's prefix followed by a byte that sorts below
// the stream suffix's (".zan"): "m" < "m-c" < "m.b", but "m-c.zan" <
// "m.b.zan" < "m.zan". The decoded tensors are in the names' order, as a
// parted anchor's blocks are checked against the layout's (sync/replay.cc).
TEST(CompressedAnchor, DecodedInTheOrderOfTheNamesNotOfTheStreams) {
  std::mt19937_64 rng(1);
  Tensors t;
  for (const char* name : {"m", "m.b", "m-c", "m.a.zzz", "m_d", "x"}) t.Add(rng, name, DType::kBF16, 40, Tensors::Fill::kRandom);
  t.Seal();
  Result<EncodedPatch> e = EncodeCompressedAnchor(1, t.views, 1);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  Result<SafetensorsFile> f = ParseBytes(Flatten(*e));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  Result<DecodedAnchor> d = DecodeCompressedAnchor(*f, 1);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  std::vector<std::string> names;
  for (const WeightState::Tensor& x : d->tensors) names.push_back(x.name);
  EXPECT_EQ(names, (std::vector<std::string>{"m", "m-c", "m.a.zzz", "m.b", "m_d", "x"}));
  for (const WeightState::Tensor& x : d->tensors) {
    const auto it = std::find_if(t.views.begin(), t.views.end(), [&](const TensorView& v) { return v.name == x.name; });
    ASSERT_NE(it, t.views.end());
    EXPECT_TRUE(std::equal(x.data.begin(), x.data.end(), it->data.begin(), it->data.end())) << x.name;
  }
}

}  // namespace
}  // namespace deltasync
