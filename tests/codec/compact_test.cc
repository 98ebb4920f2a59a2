// The compact delta and compressed anchor codecs (deltasync/compact.h):
// round trips against the reference scatter, base-hash refusal, corrupted
// input, determinism.
#include "deltasync/compact.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "codec/patch_test_util.h"
#include "fuzz/compact_fuzz_base.h"

namespace deltasync {
namespace {

using testing::Flatten;
using testing::ParseBytes;

struct Base {
  WeightState state;
  StateHash hash;
};

// A base with bf16 tensors "a" (4096 elems, ~N(0, 0.02)), "b" (shape 3x5),
// "e" (empty), "f" (F32, 100), "one" (1 elem).
Base MakeBase(uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
  auto add = [&](std::string name, DType dtype, std::vector<uint64_t> shape) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    std::vector<uint8_t> bytes(n * DTypeSize(dtype));
    for (uint64_t k = 0; k < n; ++k) {
      uint32_t f;
      float x = normal(rng);
      std::memcpy(&f, &x, 4);
      if (dtype == DType::kBF16) {
        uint16_t b = Fp32ToBf16(f);
        std::memcpy(bytes.data() + 2 * k, &b, 2);
      } else {
        std::memcpy(bytes.data() + 4 * k, &f, 4);
      }
    }
    storage.push_back(std::move(bytes));
    views.push_back({std::move(name), dtype, std::move(shape), {}});
  };
  add("a", DType::kBF16, {4096});
  add("b", DType::kBF16, {3, 5});
  add("e", DType::kBF16, {0});
  add("f", DType::kF32, {100});
  add("one", DType::kBF16, {1});
  for (size_t i = 0; i < views.size(); ++i) views[i].data = storage[i];
  Base b{std::move(WeightState::FromViews(views)).value(), {}};
  b.hash = HashState(b.state, 1);
  return b;
}

PatchInfo Info() {
  PatchInfo info;
  info.model_version = 8;
  info.base_version = 7;
  return info;
}

std::vector<uint8_t> Encode(const Base& b, const std::vector<TensorChanges>& changes,
                            int stream_version = kDefaultCompactStreamVersion,
                            int container = kDefaultCompactContainer) {
  Result<EncodedPatch> e = EncodeCompactDelta(Info(), b.hash, b.state, changes, 0, stream_version, container);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? Flatten(*e) : std::vector<uint8_t>();
}

Result<CompactDelta> DecodeBytes(std::vector<uint8_t> bytes, const Base& b, int threads = 0) {
  DS_ASSIGN_OR_RETURN(SafetensorsFile f, ParseBytes(std::move(bytes), "compact.safetensors"));
  return DecodeCompactDelta(f, b.state, b.hash, threads);
}

void ExpectRoundTripIn(const Base& b, std::vector<TensorChanges> changes, int stream_version, int container) {
  SCOPED_TRACE("stream version " + std::to_string(stream_version) + ", container " + std::to_string(container));
  std::vector<uint8_t> bytes = Encode(b, changes, stream_version, container);
  Result<CompactDelta> d = DecodeBytes(bytes, b);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  std::sort(changes.begin(), changes.end(), [](auto& x, auto& y) { return x.name < y.name; });
  ASSERT_EQ(d->changes.size(), changes.size());
  uint64_t total = 0;
  for (size_t i = 0; i < changes.size(); ++i) {
    EXPECT_EQ(d->changes[i].name, changes[i].name);
    EXPECT_EQ(d->changes[i].dtype, changes[i].dtype);
    EXPECT_EQ(d->changes[i].indices, changes[i].indices);
    EXPECT_EQ(d->changes[i].values, changes[i].values);
    total += changes[i].count();
  }
  EXPECT_EQ(d->info.model_version, 8u);
  EXPECT_EQ(d->info.base_version, std::optional<uint64_t>(7));
  EXPECT_EQ(d->info.total_changed_elements, total);
  EXPECT_EQ(d->info.total_elements, b.state.total_elements());
  EXPECT_TRUE(d->base_hash == b.hash);
  EXPECT_EQ(d->hash_delta, HashChanges(b.state, changes, 1));  // bf16 and other dtypes
  EXPECT_TRUE(ValidateChanges(b.state, d->changes).ok());
  // Deterministic.
  EXPECT_EQ(Encode(b, changes, stream_version, container), bytes);
  // The file says which container it is; its streams are the same in both.
  Result<SafetensorsFile> f = ParseBytes(bytes, "compact.safetensors");
  ASSERT_TRUE(f.ok());
  const int written = f->metadata().contains("deltasync_compact_container") ? 2 : 1;
  if (container != kCompactContainerAuto) EXPECT_EQ(written, container);
  container = written;
  EXPECT_EQ(f->tensors().size(), container == 2 ? 1u : changes.size());
  Result<CompactStreamSizes> sizes = MeasureCompactDelta(*f);
  ASSERT_TRUE(sizes.ok()) << sizes.status().ToString();
  EXPECT_EQ(sizes->container, container);
  EXPECT_EQ(sizes->changed, total);
  ASSERT_EQ(sizes->changed_tensors.size(), changes.size());
  for (size_t i = 0; i < changes.size(); ++i) {
    const CompactStreamSizes::Tensor& t = sizes->changed_tensors[i];
    EXPECT_EQ(t.changed, changes[i].count());
    if (container == 1) {
      EXPECT_EQ(t.name, changes[i].name);
      EXPECT_FALSE(t.base_index);
    } else {
      EXPECT_EQ(t.name, "");
      ASSERT_TRUE(t.base_index);
      ASSERT_LT(*t.base_index, b.state.tensors().size());
      EXPECT_EQ(b.state.tensors()[*t.base_index].name, changes[i].name);
    }
  }
}

// Every stream version in both containers: the same changes decode from
// each, and the automatic container is the smaller one.
void ExpectRoundTrip(const Base& b, std::vector<TensorChanges> changes) {
  for (int stream_version : {2, 3}) {
    ExpectRoundTripIn(b, changes, stream_version, 1);
    ExpectRoundTripIn(b, changes, stream_version, 2);
    ExpectRoundTripIn(b, changes, stream_version, kCompactContainerAuto);
    EXPECT_EQ(Encode(b, changes, stream_version, kCompactContainerAuto).size(),
              std::min(Encode(b, changes, stream_version, 1).size(), Encode(b, changes, stream_version, 2).size()));
  }
  ExpectRoundTripIn(b, changes, kCompactStreamAuto, kDefaultCompactContainer);
}

TEST(CompactDelta, PlusMinusOneUlp) {
  Base b = MakeBase();
  std::vector<uint64_t> idx;
  for (uint64_t i = 0; i < 4096; i += 3) idx.push_back(i);
  ExpectRoundTrip(b, {testing::Bf16Changes(b.state, "a", idx, [](uint16_t o, uint64_t i) {
                    return static_cast<uint16_t>(o + ((i & 4) ? 1 : -1));
                  })});
}

TEST(CompactDelta, RandomValuesAndPatterns) {
  Base b = MakeBase();
  std::mt19937_64 rng(7);
  for (int round = 0; round < 20; ++round) {
    std::vector<uint64_t> idx = testing::RandomIndices(rng, 4096, rng() % 3000);
    const int kind = round % 4;
    ExpectRoundTrip(b, {testing::Bf16Changes(b.state, "a", idx, [&](uint16_t o, uint64_t) -> uint16_t {
                      if (kind == 0) return static_cast<uint16_t>(rng());                   // anything
                      if (kind == 1) return static_cast<uint16_t>(o + (rng() % 255) - 127);  // near
                      if (kind == 2) return static_cast<uint16_t>(o + (rng() % 4000) - 2000);  // far
                      return static_cast<uint16_t>(o ^ 0x8000);                               // sign flip
                    })});
  }
}

TEST(CompactDelta, SignFlipsNanInfAndAllChanged) {
  Base b = MakeBase();
  std::vector<uint64_t> all(4096);
  for (uint64_t i = 0; i < all.size(); ++i) all[i] = i;
  const uint16_t specials[] = {0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x0000, 0x8000, 0x0001, 0x807F, 0x7F7F};
  ExpectRoundTrip(b, {testing::Bf16Changes(b.state, "a", all, [&](uint16_t o, uint64_t i) -> uint16_t {
                    return i % 2 ? specials[i % 9] : static_cast<uint16_t>(o ^ 0x8000);
                  })});
  // From a NaN/Inf base: every change escapes.
  std::vector<uint8_t> bytes(8);
  const uint16_t base_vals[] = {0x7F80, 0xFFC0, 0x3F80, 0x0000};
  std::memcpy(bytes.data(), base_vals, 8);
  std::vector<TensorView> v{{"x", DType::kBF16, {4}, bytes}};
  Base nb{std::move(WeightState::FromViews(v)).value(), {}};
  nb.hash = HashState(nb.state, 1);
  ExpectRoundTrip(nb, {testing::Bf16Changes(nb.state, "x", {0, 1, 2, 3}, [](uint16_t o, uint64_t) {
                     return static_cast<uint16_t>(o + 1);
                   })});
}

TEST(CompactDelta, EmptyOneElementNonBf16AndLargeGaps) {
  Base b = MakeBase();
  TensorChanges f;
  f.name = "f";
  f.dtype = DType::kF32;
  f.indices = {0, 17, 99};
  f.values = testing::Bytes<float>(std::vector<float>{1.5f, -2.0f, NAN});
  TensorChanges e;
  e.name = "e";
  ExpectRoundTrip(b, {testing::Bf16Changes(b.state, "one", {0}, [](uint16_t o, uint64_t) { return static_cast<uint16_t>(o + 1); }),
                      f, e, testing::Bf16Changes(b.state, "a", {0, 4095}, [](uint16_t, uint64_t) { return uint16_t{0x3F80}; })});
  ExpectRoundTrip(b, {});
}

TEST(CompactDelta, ParallelDecodeMatches) {
  Base b = MakeBase();
  std::mt19937_64 rng(3);
  std::vector<TensorChanges> changes{
      testing::Bf16Changes(b.state, "a", testing::RandomIndices(rng, 4096, 2000), [](uint16_t o, uint64_t) { return static_cast<uint16_t>(o + 1); }),
      testing::Bf16Changes(b.state, "b", {1, 2, 14}, [](uint16_t o, uint64_t) { return static_cast<uint16_t>(o - 1); })};
  std::vector<uint8_t> bytes = Encode(b, changes);
  Result<CompactDelta> one = DecodeBytes(bytes, b, 1);
  Result<CompactDelta> four = DecodeBytes(bytes, b, 4);
  ASSERT_TRUE(one.ok() && four.ok());
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(one->changes[i].values, four->changes[i].values);
}

TEST(CompactDelta, EncoderRefusesBadInput) {
  Base b = MakeBase();
  auto enc = [&](std::vector<TensorChanges> c, PatchInfo info = Info()) {
    return EncodeCompactDelta(info, b.hash, b.state, c).status().code();
  };
  auto inc = [](uint16_t o, uint64_t) { return static_cast<uint16_t>(o + 1); };
  EXPECT_EQ(enc({testing::Bf16Changes(b.state, "a", {5, 5}, inc)}), ErrorCode::kInvalidArgument);
  TensorChanges out_of_range = testing::MakeChanges("b", {15});  // b has 15 elements
  EXPECT_EQ(enc({out_of_range}), ErrorCode::kInvalidArgument);
  TensorChanges missing = testing::MakeChanges("zz", {1});
  EXPECT_EQ(enc({missing}), ErrorCode::kInvalidArgument);
  EXPECT_EQ(enc({testing::Bf16Changes(b.state, "a", {1}, inc), testing::Bf16Changes(b.state, "a", {2}, inc)}), ErrorCode::kInvalidArgument);
  PatchInfo no_base = Info();
  no_base.base_version.reset();
  EXPECT_EQ(enc({}, no_base), ErrorCode::kInvalidArgument);
}

TEST(CompactDelta, WrongBaseHashRefused) {
  Base b = MakeBase();
  std::vector<uint8_t> bytes = Encode(b, {testing::Bf16Changes(b.state, "a", {1, 2}, [](uint16_t o, uint64_t) {
                                           return static_cast<uint16_t>(o + 1);
                                         })});
  Result<SafetensorsFile> f = ParseBytes(bytes, "x.safetensors");
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(IsCompactDelta(*f));
  StateHash other = b.hash;
  other.lo ^= 1;
  Result<CompactDelta> d = DecodeCompactDelta(*f, b.state, other);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(d.status().message().find(b.hash.Hex()), std::string::npos) << d.status().message();
  EXPECT_NE(d.status().message().find(other.Hex()), std::string::npos) << d.status().message();
  // A TRL reader refuses it too (unknown encoding), rather than misreading.
  EXPECT_FALSE(DecodePatch(std::move(*f)).ok());
}

// Every single-byte corruption and every truncation of a small patch: never
// a crash; whatever decodes is still valid for the base.
TEST(CompactDelta, CorruptedAndTruncatedNeverCrash) {
  Base b = MakeBase();
  std::mt19937_64 rng(5);
  TensorChanges f;
  f.name = "f";
  f.dtype = DType::kF32;
  f.indices = {3, 40};
  f.values = testing::Bytes<float>(std::vector<float>{1.0f, 2.0f});
  std::vector<uint8_t> bytes = Encode(b, {testing::Bf16Changes(b.state, "a", testing::RandomIndices(rng, 4096, 60),
                                                  [&](uint16_t o, uint64_t i) {
                                                    return static_cast<uint16_t>(i % 7 ? o + 1 : o ^ 0x8000);
                                                  }),
                                          f});
  ASSERT_FALSE(bytes.empty());
  int decoded = 0;
  for (size_t pos = 0; pos < bytes.size(); ++pos) {
    for (uint8_t x : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      std::vector<uint8_t> c = bytes;
      c[pos] ^= x;
      Result<CompactDelta> d = DecodeBytes(c, b, 1);
      if (d.ok()) {
        ++decoded;
        EXPECT_TRUE(ValidateChanges(b.state, d->changes).ok());
      }
    }
  }
  for (size_t len = 0; len < bytes.size(); ++len) {
    EXPECT_FALSE(DecodeBytes(std::vector<uint8_t>(bytes.begin(), bytes.begin() + len), b, 1).ok()) << len;
  }
  SUCCEED() << decoded << " corrupted variants decoded";
}

TEST(CompressedAnchor, RoundTripBitExact) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
  auto add = [&](std::string name, DType dtype, std::vector<uint64_t> shape, bool random_bits) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    std::vector<uint8_t> bytes(n * DTypeSize(dtype));
    if (random_bits) {
      for (uint8_t& x : bytes) x = static_cast<uint8_t>(rng());
    } else {
      for (uint64_t k = 0; k < n; ++k) {
        float x = normal(rng);
        uint32_t u;
        std::memcpy(&u, &x, 4);
        uint16_t h = Fp32ToBf16(u);
        std::memcpy(bytes.data() + 2 * k, &h, 2);
      }
    }
    storage.push_back(std::move(bytes));
    views.push_back({std::move(name), dtype, std::move(shape), {}});
  };
  add("w", DType::kBF16, {1100, 1000}, false);  // > 1 chunk
  add("r", DType::kBF16, {333}, true);           // NaN/Inf/subnormals included
  add("z", DType::kBF16, {0}, false);
  add("i", DType::kI64, {7, 3}, true);
  add("g", DType::kF32, {2, 2, 2}, true);
  for (size_t i = 0; i < views.size(); ++i) views[i].data = storage[i];

  Result<EncodedPatch> e = EncodeCompressedAnchor(3, views, 2);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  std::vector<uint8_t> bytes = Flatten(*e);
  Result<EncodedPatch> again = EncodeCompressedAnchor(3, views, 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(Flatten(*again), bytes);
  EXPECT_LT(bytes.size(), 1100u * 1000 * 2 * 3 / 4);  // the exponent plane compresses

  Result<SafetensorsFile> f = ParseBytes(bytes, "anchor.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(IsCompressedAnchor(*f));
  EXPECT_FALSE(IsCompactDelta(*f));
  Result<DecodedAnchor> d = DecodeCompressedAnchor(*f, 3);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->model_version, 3u);
  ASSERT_EQ(d->tensors.size(), views.size());
  std::vector<TensorView> sorted = views;
  std::sort(sorted.begin(), sorted.end(), [](auto& x, auto& y) { return x.name < y.name; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    EXPECT_EQ(d->tensors[i].name, sorted[i].name);
    EXPECT_EQ(d->tensors[i].dtype, sorted[i].dtype);
    EXPECT_EQ(d->tensors[i].shape, sorted[i].shape);
    EXPECT_TRUE(std::equal(d->tensors[i].data.begin(), d->tensors[i].data.end(), sorted[i].data.begin(),
                           sorted[i].data.end()))
        << sorted[i].name;
  }
}

TEST(CompressedAnchor, CorruptedNeverCrashes) {
  std::vector<uint8_t> w(2 * 300), x(16);
  for (size_t k = 0; k < w.size(); ++k) w[k] = static_cast<uint8_t>(k % 2 ? 0x3C : k * 7);
  for (size_t k = 0; k < x.size(); ++k) x[k] = static_cast<uint8_t>(k);
  std::vector<TensorView> views{{"w", DType::kBF16, {300}, w}, {"x", DType::kF32, {4}, x}};
  Result<EncodedPatch> e = EncodeCompressedAnchor(1, views, 1);
  ASSERT_TRUE(e.ok());
  std::vector<uint8_t> bytes = Flatten(*e);
  for (size_t pos = 0; pos < bytes.size(); ++pos) {
    std::vector<uint8_t> c = bytes;
    c[pos] ^= 0x41;
    Result<SafetensorsFile> f = ParseBytes(c);
    if (f.ok()) (void)DecodeCompressedAnchor(*f, 1);
  }
  for (size_t len = 0; len < bytes.size(); ++len) {
    Result<SafetensorsFile> f = ParseBytes(std::vector<uint8_t>(bytes.begin(), bytes.begin() + len));
    if (f.ok()) EXPECT_FALSE(DecodeCompressedAnchor(*f, 1).ok()) << len;
  }
}

}  // namespace
}  // namespace deltasync

namespace deltasync {
namespace {

// The compact fuzzer's seed corpus, against its fixed base. Disabled: run once
// after a format change with
//   codec_tests --gtest_also_run_disabled_tests --gtest_filter='CompactSeedCorpus.*'
// and check the files in. The enabled test checks that the checked-in seeds
// still decode.
const std::filesystem::path kCompactCorpus = std::filesystem::path(DS_SOURCE_DIR) / "tests/fuzz/corpus/compact";

std::vector<std::pair<std::string, std::vector<uint8_t>>> CompactSeeds() {
  testing::CompactFuzzBase base;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> seeds;
  PatchInfo info;
  info.model_version = 2;
  info.base_version = 1;
  // Each delta in stream version 3 and, as "v2_<name>", in version 2 (still
  // read); in container 1 and, as "c2_<name>", in container 2.
  auto delta = [&](std::string name, std::vector<TensorChanges> changes) {
    for (int container : {1, 2}) {
      for (int version : {3, 2}) {
        Result<EncodedPatch> e = EncodeCompactDelta(info, base.hash, base.state, changes, 1, version, container);
        EXPECT_TRUE(e.ok()) << name << ": " << e.status().ToString();
        if (e.ok()) {
          seeds.emplace_back(std::string(container == 2 ? "c2_" : "") + (version == 2 ? "v2_" : "") + name,
                             Flatten(*e));
        }
      }
    }
  };
  auto bf16 = [](std::vector<uint16_t> v) {
    std::vector<uint8_t> b(v.size() * 2);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  const WeightState::Tensor& a = *base.state.Find("a");
  auto at = [&](uint64_t i) {
    uint16_t v;
    std::memcpy(&v, a.data.data() + 2 * i, 2);
    return v;
  };
  delta("empty", {});
  delta("ulp", {{"a", DType::kBF16, {0, 3, 4, 40, 63},
                 bf16({uint16_t(at(0) + 1), uint16_t(at(3) - 1), uint16_t(at(4) + 1), uint16_t(at(40) + 2),
                       uint16_t(at(63) - 1)})}});
  std::vector<uint64_t> every(64);
  std::vector<uint16_t> moved(64);
  for (uint64_t i = 0; i < 64; ++i) {
    every[i] = i;
    moved[i] = static_cast<uint16_t>(at(i) + (i % 2 ? 1 : -1));
  }
  delta("all_changed", {{"a", DType::kBF16, every, bf16(moved)}});
  delta("escapes_f32", {{"a", DType::kBF16, {1, 2, 5}, bf16({uint16_t(at(1) ^ 0x8000), 0x7FC0, 0x7F80})},
                        {"f", DType::kF32, {0, 7}, std::vector<uint8_t>(8, 0x42)}});
  TensorView anchor_view{"a", DType::kBF16, {8, 8}, a.data};
  Result<EncodedPatch> anchor = EncodeCompressedAnchor(3, std::span<const TensorView>(&anchor_view, 1), 1);
  EXPECT_TRUE(anchor.ok());
  if (anchor.ok()) seeds.emplace_back("anchor", Flatten(*anchor));
  return seeds;
}

TEST(CompactSeedCorpus, DISABLED_Write) {
  std::filesystem::create_directories(kCompactCorpus);
  for (const auto& [name, bytes] : CompactSeeds()) {
    std::ofstream out(kCompactCorpus / (name + ".safetensors"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
}

TEST(CompactSeedCorpus, CheckedInSeedsAreCurrentAndDecode) {
  testing::CompactFuzzBase base;
  for (const auto& [name, bytes] : CompactSeeds()) {
    std::ifstream in(kCompactCorpus / (name + ".safetensors"), std::ios::binary);
    ASSERT_TRUE(in) << name << " is missing; regenerate the corpus (see above)";
    std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(file, bytes) << name << " is stale; regenerate the corpus (see above)";
    Result<SafetensorsFile> parsed = ParseBytes(file, name);
    ASSERT_TRUE(parsed.ok()) << name;
    if (IsCompressedAnchor(*parsed)) {
      EXPECT_TRUE(DecodeCompressedAnchor(*parsed, 1).ok()) << name;
    } else {
      Result<CompactDelta> d = DecodeCompactDelta(*parsed, base.state, base.hash, 1);
      EXPECT_TRUE(d.ok()) << name << ": " << d.status().ToString();
    }
  }
}

}  // namespace
}  // namespace deltasync
