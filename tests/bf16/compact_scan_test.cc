// CompactScan (publishing's fused pass) against the unfused route it
// replaces: DetectChanges -> EncodeCompactDelta -> HashChanges ->
// ApplyChanges must give the same delta bytes, hash and state, on every SIMD
// target, chunk size and thread count; errors and Undo leave the state as
// it was.

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bf16/bf16_test_util.h"
#include "bf16/compact_scan.h"
#include "codec/compact_bf16.h"
#include "deltasync/blob.h"
#include "deltasync/changes.h"
#include "deltasync/compact.h"
#include "deltasync/patch.h"
#include "deltasync/safetensors.h"
#include "deltasync/state_hash.h"

namespace deltasync {
namespace {

using testing_bf16::ElementBits;
using testing_bf16::ExpectSameChanges;
using testing_bf16::ForEachTarget;
using testing_bf16::Mutate;
using testing_bf16::OwnedTensor;
using testing_bf16::RandomFiniteBf16;
using testing_bf16::RandomTensor;
using testing_bf16::SetElementBits;
using testing_bf16::Views;

WeightState StateOf(std::span<const TensorView> views) {
  auto state = WeightState::FromViews(views);
  EXPECT_TRUE(state.ok()) << state.status().ToString();
  return std::move(state).value();
}

WeightState Copy(const WeightState& s) {
  std::vector<TensorView> views = s.views();
  return StateOf(views);
}

std::vector<uint8_t> Bytes(const EncodedPatch& p) {
  std::vector<uint8_t> out;
  for (ByteSpan part : p.parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

bool SameBytes(const WeightState& a, const WeightState& b) {
  if (a.tensors().size() != b.tensors().size()) return false;
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    if (a.tensors()[i].data != b.tensors()[i].data) return false;
  }
  return true;
}

// A trainer's tensors: fp32 masters of bf16 weights (odd sizes), bf16
// weights given as bf16, a kept-fp32 bias and other dtypes.
struct Model {
  std::vector<OwnedTensor> current;
  WeightState published;
};

Model MakeModel(std::mt19937_64& rng) {
  Model m;
  m.current = {
      RandomTensor(rng, "a.scalar", DType::kBF16, {}),
      RandomTensor(rng, "layers.0.attn.q_proj.weight", DType::kF32, {67, 129}),
      RandomTensor(rng, "layers.0.embed", DType::kF32, {70001}),
      RandomTensor(rng, "layers.0.empty", DType::kF32, {0, 5}),
      RandomTensor(rng, "layers.0.f16", DType::kF16, {77}),
      RandomTensor(rng, "layers.0.mlp.down_proj.weight", DType::kBF16, {3001}),
      RandomTensor(rng, "layers.0.norm.weight", DType::kBF16, {7}),
      RandomTensor(rng, "layers.0.steps", DType::kI64, {9}),
      RandomTensor(rng, "layers.0.router.e_score_correction_bias", DType::kF32, {131}),
  };
  // Weight-like fp32 masters: small magnitudes across many exponents.
  for (OwnedTensor& t : m.current) {
    if (t.dtype != DType::kF32 || t.name.find("bias") != std::string::npos) continue;
    std::normal_distribution<float> w(0.0f, 0.02f);
    for (uint64_t i = 0; i < t.elements(); ++i) {
      float v = w(rng);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      SetElementBits(t.data.data(), 4, i, bits);
    }
  }
  DetectOptions keep;
  keep.keep_fp32 = [](std::string_view name) { return name.ends_with("bias"); };
  auto state = ToPublishedState(Views(m.current), keep);
  EXPECT_TRUE(state.ok()) << state.status().ToString();
  m.published = std::move(state).value();
  return m;
}

// Moves fp32 masters like an optimizer step (some cross a bf16 boundary),
// and bf16 weights by small ULP steps, sign flips and arbitrary new values.
void Step(std::mt19937_64& rng, Model& m, double rate) {
  std::bernoulli_distribution pick(rate);
  for (OwnedTensor& t : m.current) {
    if (t.dtype == DType::kF32 && t.name.find("bias") == std::string::npos) {
      std::normal_distribution<float> move(0.0f, 1e-4f);
      for (uint64_t i = 0; i < t.elements(); ++i) {
        if (!pick(rng)) continue;
        float v;
        uint32_t bits = static_cast<uint32_t>(ElementBits(t.data.data(), 4, i));
        std::memcpy(&v, &bits, 4);
        v += move(rng);
        std::memcpy(&bits, &v, 4);
        SetElementBits(t.data.data(), 4, i, bits);
      }
    } else if (t.dtype == DType::kBF16) {
      for (uint64_t i = 0; i < t.elements(); ++i) {
        if (!pick(rng)) continue;
        const uint64_t old = ElementBits(t.data.data(), 2, i);
        const uint64_t r = rng() % 8;
        const uint64_t now = r < 5 ? old + (r % 2 ? 1 : -1) : r == 5 ? old ^ 0x8000 : RandomFiniteBf16(rng);
        SetElementBits(t.data.data(), 2, i, now & 0xFFFF);
      }
    } else {
      Mutate(rng, t, rate);
    }
  }
}

struct Reference {
  std::vector<uint8_t> delta;     // stream version 3 (the default)
  std::vector<uint8_t> delta_v2;  // stream version 2
  StateHash next_hash;
  WeightState next;
  std::vector<TensorChanges> bf16_changes;
  std::vector<TensorChanges> changes;
};

PatchInfo Info() {
  PatchInfo info;
  info.kind = PatchKind::kDelta;
  info.model_version = 8;
  info.base_version = 7;
  return info;
}

Reference Unfused(const WeightState& published, std::span<const TensorView> current, const DetectOptions& options) {
  Reference ref;
  auto changes = DetectChanges(published, current, options);
  EXPECT_TRUE(changes.ok()) << changes.status().ToString();
  const StateHash hash = HashState(published);
  auto delta = EncodeCompactDelta(Info(), hash, published, *changes);
  EXPECT_TRUE(delta.ok()) << delta.status().ToString();
  ref.delta = Bytes(*delta);
  auto delta2 = EncodeCompactDelta(Info(), hash, published, *changes, 0, 2);
  EXPECT_TRUE(delta2.ok()) << delta2.status().ToString();
  ref.delta_v2 = Bytes(*delta2);
  ref.next_hash = hash + HashChanges(published, *changes);
  ref.next = Copy(published);
  ApplyChanges(ref.next, *changes);
  for (const TensorChanges& c : *changes) {
    if (c.dtype == DType::kBF16) ref.bf16_changes.push_back(c);
  }
  ref.changes = std::move(*changes);
  return ref;
}

// Runs the fused pass on a copy of `published` and checks it against `ref`;
// then Undo must restore the copy.
void ExpectFusedMatches(const WeightState& published, std::span<const TensorView> current,
                        const DetectOptions& options, const Reference& ref, uint64_t chunk) {
  const StateHash hash = HashState(published);
  WeightState state = Copy(published);
  bf16::CompactScan scan;
  ASSERT_TRUE(scan.Run(state, current, options, chunk).ok());
  auto delta = EncodeScannedCompactDelta(Info(), hash, state, scan, scan.other_changes(), options.threads);
  ASSERT_TRUE(delta.ok()) << delta.status().ToString();
  EXPECT_EQ(Bytes(*delta), ref.delta);
  // Stream version 2 too (the scan's streams are the same; only the writer differs).
  auto delta2 = EncodeScannedCompactDelta(Info(), hash, state, scan, scan.other_changes(), options.threads, 2);
  ASSERT_TRUE(delta2.ok()) << delta2.status().ToString();
  EXPECT_EQ(Bytes(*delta2), ref.delta_v2);
  // And the decoder (its class walk runs on the same SIMD target) gets the
  // changes back from the base.
  auto file = SafetensorsFile::Parse(Blob::FromVector(Bytes(*delta)), "fused delta");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto decoded = DecodeCompactDelta(*file, published, hash, options.threads);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ExpectSameChanges(decoded->changes, ref.changes);
  EXPECT_EQ(hash + scan.bf16_hash_delta() + HashChanges(state, scan.other_changes()), ref.next_hash);
  ExpectSameChanges(scan.AppliedChanges(), ref.bf16_changes);
  // bf16 tensors are applied, the others not yet.
  WeightState applied = Copy(state);
  ApplyChanges(applied, scan.other_changes());
  EXPECT_TRUE(SameBytes(applied, ref.next));
  scan.Undo(options.threads);
  EXPECT_TRUE(SameBytes(state, published));
}

TEST(CompactScanTest, SameBytesHashAndStateAsTheUnfusedRoute) {
  for (double rate : {0.0, 0.001, 0.034, 0.3, 1.0}) {
    SCOPED_TRACE("rate " + std::to_string(rate));
    std::mt19937_64 rng(static_cast<uint64_t>(rate * 1000) + 7);
    Model m = MakeModel(rng);
    Step(rng, m, rate);
    const std::vector<TensorView> current = Views(m.current);
    DetectOptions options;
    options.threads = 2;
    const Reference ref = Unfused(m.published, current, options);
    ForEachTarget([&] { ExpectFusedMatches(m.published, current, options, ref, bf16::kDefaultChunkElements); });
  }
}

// Chunk boundaries anywhere (a class's gap then spans chunks) and any thread
// count give the same bytes.
TEST(CompactScanTest, ChunkSizeAndThreadsDoNotMatter) {
  std::mt19937_64 rng(21);
  Model m = MakeModel(rng);
  Step(rng, m, 0.02);
  const std::vector<TensorView> current = Views(m.current);
  const Reference ref = Unfused(m.published, current, {});
  for (uint64_t chunk : {uint64_t{1}, uint64_t{3}, uint64_t{64}, uint64_t{1000}, uint64_t{1025}, uint64_t{70000}}) {
    for (int threads : {1, 3}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk) + " threads " + std::to_string(threads));
      DetectOptions options;
      options.threads = threads;
      ExpectFusedMatches(m.published, current, options, ref, chunk);
    }
  }
}

// Sparse changes far apart in rare classes: gaps longer than a chunk, and a
// gap above 2^16 within one tensor.
TEST(CompactScanTest, LongGapsAcrossManyChunks) {
  std::mt19937_64 rng(5);
  Model m = MakeModel(rng);
  for (OwnedTensor& t : m.current) {
    if (t.name != "layers.0.embed") continue;
    for (uint64_t i : {uint64_t{3}, uint64_t{69000}, uint64_t{70000}}) {
      float v;
      uint32_t bits = static_cast<uint32_t>(ElementBits(t.data.data(), 4, i));
      std::memcpy(&v, &bits, 4);
      v = -v * 3;
      std::memcpy(&bits, &v, 4);
      SetElementBits(t.data.data(), 4, i, bits);
    }
  }
  const std::vector<TensorView> current = Views(m.current);
  const Reference ref = Unfused(m.published, current, {});
  for (uint64_t chunk : {uint64_t{100}, uint64_t{4096}, bf16::kDefaultChunkElements}) {
    ExpectFusedMatches(m.published, current, {}, ref, chunk);
  }
}

// NaN/Inf: allowed ones travel as escapes; refused ones leave the state as
// it was, even when other chunks were already applied, with DetectChanges'
// error.
TEST(CompactScanTest, NonFiniteValuesEscapedOrRefusedWithTheStateUntouched) {
  std::mt19937_64 rng(9);
  Model m = MakeModel(rng);
  Step(rng, m, 0.05);
  OwnedTensor& mlp = m.current[5];
  ASSERT_EQ(mlp.name, "layers.0.mlp.down_proj.weight");
  SetElementBits(mlp.data.data(), 2, 2900, 0x7FC0);  // NaN
  SetElementBits(mlp.data.data(), 2, 17, 0xFF80);    // -Inf
  const std::vector<TensorView> current = Views(m.current);

  DetectOptions allow;
  allow.allow_nonfinite = true;
  const Reference ref = Unfused(m.published, current, allow);
  ForEachTarget([&] { ExpectFusedMatches(m.published, current, allow, ref, 256); });

  for (uint64_t chunk : {uint64_t{256}, bf16::kDefaultChunkElements}) {
    for (int threads : {1, 2}) {
      DetectOptions refuse;
      refuse.threads = threads;
      WeightState state = Copy(m.published);
      bf16::CompactScan scan;
      Status s = scan.Run(state, current, refuse, chunk);
      auto want = DetectChanges(m.published, current, refuse);
      ASSERT_FALSE(want.ok());
      EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(s.message(), want.status().message());
      EXPECT_TRUE(SameBytes(state, m.published)) << "chunk " << chunk << " threads " << threads;
    }
  }
}

TEST(CompactScanTest, MismatchedTensorsAreRefusedLikeDetectChanges) {
  std::mt19937_64 rng(2);
  Model m = MakeModel(rng);
  std::vector<TensorView> current = Views(m.current);
  current.pop_back();
  WeightState state = Copy(m.published);
  bf16::CompactScan scan;
  Status s = scan.Run(state, current, {});
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(s.message(), DetectChanges(m.published, current).status().message());
  EXPECT_TRUE(SameBytes(state, m.published));
}

// One scan object reused for successive versions (its buffers are kept).
TEST(CompactScanTest, ReusedAcrossVersions) {
  std::mt19937_64 rng(13);
  Model m = MakeModel(rng);
  bf16::CompactScan scan;
  WeightState state = Copy(m.published);
  for (int v = 0; v < 4; ++v) {
    Step(rng, m, v % 2 ? 0.2 : 0.01);
    const std::vector<TensorView> current = Views(m.current);
    const Reference ref = Unfused(state, current, {});
    const StateHash hash = HashState(state);
    ASSERT_TRUE(scan.Run(state, current, {}, 5000).ok());
    auto delta = EncodeScannedCompactDelta(Info(), hash, state, scan, scan.other_changes(), 0);
    ASSERT_TRUE(delta.ok());
    EXPECT_EQ(Bytes(*delta), ref.delta) << "version " << v;
    ApplyChanges(state, scan.other_changes());
    EXPECT_TRUE(SameBytes(state, ref.next));
    EXPECT_EQ(HashState(state), ref.next_hash);
  }
}

}  // namespace
}  // namespace deltasync
