// The value domain through every library route, on every SIMD target
// (session 51, helper h3): special bf16 bit patterns (+-0, NaN payloads and
// signs, signalling NaNs, +-Inf, subnormals, the largest finite, every
// exponent class), fp32 masters (ties, values that round to Inf, NaN), other
// dtypes beside bf16 (F16, F64, I64, BOOL, U8, F8), scalars, 0-element
// tensors and sizes around the 1024-gap block and 65,536-element chunk, each
// change only at the first or last element or at every one. Each case goes
// current -> change detection -> an encoding -> decode -> apply on the base,
// and the result must be the expected state byte for byte with its state hash:
//   raw and gap_delta from DetectChanges (gap_delta applied from its gaps as
//   a replica does), gap_delta from the fused DetectAndEncodeGapDelta, and
//   compact stream versions 2 and 3 in containers 1 and 2.

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "bf16/bf16_test_util.h"
#include "codec/patch_test_util.h"
#include "deltasync/changes.h"
#include "deltasync/compact.h"
#include "deltasync/detect_encode.h"
#include "deltasync/patch.h"
#include "deltasync/state_hash.h"
#include "deltasync/weight_state.h"

namespace deltasync {
namespace {

using testing::Flatten;
using testing::ParseBytes;
using testing_bf16::ForEachTarget;
using testing_bf16::ReferenceFp32ToBf16;

// +0, -0, quiet NaNs of other payloads and signs, signalling NaNs, +-Inf,
// subnormals, the largest finite of each sign, 1, -1, the smallest normal,
// the edges of the compact exponent classes (exponents 112, 113, 126, 127,
// 142, 254).
const std::vector<uint16_t> kSpecials = {0x0000, 0x8000, 0x7FC0, 0x7FC1, 0xFFC0, 0xFFFF, 0x7F81, 0xFF81, 0x7F80,
                                         0xFF80, 0x0001, 0x8001, 0x007F, 0x807F, 0x7F7F, 0xFF7F, 0x3F80, 0xBF80,
                                         0x0080, 0x3800, 0x3880, 0x3F00, 0x3F7F, 0x4700, 0x7F00};

// One tensor on both sides: the base's bytes (published dtype), the
// trainer's current bytes (F32 masters for a bf16 base), and the state
// expected after the delta (published dtype).
struct Side {
  std::string name;
  DType base_dtype;
  DType current_dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> base, current, want;
};

struct ValueCase {
  std::string label;
  std::vector<Side> sides;
};

template <typename T>
std::vector<uint8_t> AsBytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

Side Bf16Side(std::string name, const std::vector<uint16_t>& base, const std::vector<uint16_t>& now) {
  return {std::move(name), DType::kBF16, DType::kBF16, {base.size()}, AsBytes(base), AsBytes(now), AsBytes(now)};
}

// Bytes of `n` elements of `size` bytes, pseudo-random (every bit pattern).
std::vector<uint8_t> Pattern(uint64_t n, size_t size, uint64_t seed) {
  std::vector<uint8_t> out(n * size);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint8_t& b : out) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<uint8_t>(x >> 32);
  }
  return out;
}

std::vector<ValueCase> Cases() {
  std::vector<ValueCase> cases;
  {  // every ordered pair (old, new) of specials, the unchanged ones included
    std::vector<uint16_t> old, now;
    for (uint16_t a : kSpecials) {
      for (uint16_t b : kSpecials) old.push_back(a), now.push_back(b);
    }
    std::vector<uint16_t> flipped;  // every element changes, by its sign bit alone
    for (uint16_t b : now) flipped.push_back(static_cast<uint16_t>(b ^ 0x8000));
    cases.push_back({"special pairs", {Bf16Side("w", old, now)}});
    cases.push_back({"every sign flips", {Bf16Side("w", now, flipped)}});
  }
  {  // fp32 masters: ties both ways, just off a tie, rounding to +-Inf, +-Inf, subnormals, NaNs
    const std::vector<uint32_t> masters = {
        0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF, 0x3F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF,
        0xFF7F8000, 0x7F800000, 0xFF800000, 0x00008000, 0x00018000, 0x80008000, 0x807FFFFF, 0x00000001,
        0x80000000, 0x00000000, 0x477FFFFF, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FC12345, 0xFF800001};
    std::vector<uint32_t> current;
    for (int r = 0; r < 61; ++r) current.insert(current.end(), masters.begin(), masters.end());  // body and tail
    std::vector<uint16_t> want;
    for (uint32_t m : current) want.push_back(ReferenceFp32ToBf16(m));
    cases.push_back({"fp32 masters",
                     {{"w", DType::kBF16, DType::kF32, {current.size()},
                       AsBytes(std::vector<uint16_t>(current.size(), 0x3C00)), AsBytes(current), AsBytes(want)}}});
  }
  for (uint64_t n : {1023, 1024, 1025, 65535, 65536, 65537}) {  // block and chunk borders
    const std::vector<uint8_t> bytes = Pattern(n, 2, n);
    std::vector<uint16_t> base(n);
    std::memcpy(base.data(), bytes.data(), bytes.size());
    for (const char* where : {"first", "last", "all"}) {
      std::vector<uint16_t> now = base;
      if (where[0] == 'f') now.front() ^= 1;
      if (where[0] == 'l') now.back() ^= 1;
      if (where[0] == 'a') {
        for (uint16_t& v : now) v ^= 1;
      }
      cases.push_back({std::to_string(n) + " " + where, {Bf16Side("w", base, now)}});
    }
  }
  {  // other dtypes beside bf16, scalars and a 0-element tensor
    ValueCase c{"dtypes", {Bf16Side("a", {0x3F80, 0x0000}, {0x3F80, 0x8000})}};
    const DType dtypes[] = {DType::kF16, DType::kF64, DType::kI64, DType::kI32, DType::kBool,
                            DType::kU8,  DType::kI8,  DType::kF8_E4M3, DType::kF8_E5M2, DType::kU64};
    uint64_t seed = 7;
    for (DType d : dtypes) {
      for (uint64_t n : {0, 1, 1025}) {
        const size_t size = DTypeSize(d);
        std::vector<uint8_t> base = Pattern(n, size, ++seed), now = base;
        if (n > 0) now.front() ^= 1, now.back() ^= 0x80, now[now.size() / 2] ^= 0x10;
        if (d == DType::kBool) {  // 0 and 1 only
          for (uint8_t& b : base) b &= 1;
          for (size_t i = 0; i < now.size(); ++i) now[i] = static_cast<uint8_t>(base[i] ^ (i == 0 || i + 1 == n));
        }
        c.sides.push_back({std::string(DTypeName(d)) + "." + std::to_string(n), d, d, {n}, base, now, now});
      }
      c.sides.push_back({std::string(DTypeName(d)) + ".scalar", d, d, {}, Pattern(1, DTypeSize(d), 1),
                         Pattern(1, DTypeSize(d), 2), Pattern(1, DTypeSize(d), 2)});
    }
    c.sides.push_back({"empty", DType::kBF16, DType::kBF16, {0, 4}, {}, {}, {}});
    cases.push_back(std::move(c));
  }
  return cases;
}

std::vector<TensorView> Views(const std::vector<Side>& sides, std::vector<uint8_t> Side::*bytes, DType Side::*dtype) {
  std::vector<TensorView> out;
  for (const Side& s : sides) out.push_back({s.name, s.*dtype, s.shape, s.*bytes});
  return out;
}

WeightState Base(const ValueCase& c) {
  return std::move(WeightState::FromViews(Views(c.sides, &Side::base, &Side::base_dtype))).value();
}

// The state after the delta holds `want`, byte for byte, with its hash.
void ExpectWant(const ValueCase& c, const WeightState& state, const std::string& route) {
  SCOPED_TRACE(route);
  for (const Side& s : c.sides) {
    const WeightState::Tensor* t = state.Find(s.name);
    ASSERT_NE(t, nullptr) << s.name;
    EXPECT_EQ(t->dtype, s.base_dtype) << s.name;
    EXPECT_TRUE(t->data == s.want) << s.name << ": bytes differ";
  }
  EXPECT_EQ(HashState(state).Hex(), HashTensors(Views(c.sides, &Side::want, &Side::base_dtype)).Hex());
}

PatchInfo DeltaInfo(const WeightState& base, IndexEncoding encoding) {
  PatchInfo info;
  info.kind = PatchKind::kDelta;
  info.model_version = 3;
  info.base_version = 2;
  info.encoding = encoding;
  info.total_elements = base.total_elements();
  return info;
}

// A TRL delta's bytes applied as `deltasync apply` does: gap_delta from its
// gaps (the replica's path), raw from its decoded changes.
void ApplyTrl(const ValueCase& c, std::vector<uint8_t> bytes, const std::string& route) {
  WeightState state = Base(c);
  Result<SafetensorsFile> file = ParseBytes(std::move(bytes));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  Result<DecodedPatch> patch = DecodePatch(std::move(*file), {.keep_gaps_encoded = true});
  ASSERT_TRUE(patch.ok()) << patch.status().ToString();
  if (!patch->encoded.empty()) {
    ASSERT_TRUE(ValidateEncodedChanges(state, patch->encoded).ok());
    std::vector<uint8_t> undo;
    ApplyGapChanges(state, patch->encoded, 2, undo);
  } else {
    ASSERT_TRUE(ValidateChanges(state, patch->changes).ok());
    ApplyChanges(state, patch->changes);
  }
  ExpectWant(c, state, route);
}

TEST(ValueDomain, EveryRouteShipsEveryValueBitForBit) {
  const DetectOptions allow{.allow_nonfinite = true};
  for (const ValueCase& c : Cases()) {
    SCOPED_TRACE(c.label);
    const WeightState base = Base(c);
    const std::vector<TensorView> current = Views(c.sides, &Side::current, &Side::current_dtype);
    ForEachTarget([&] {
      Result<std::vector<TensorChanges>> changes = DetectChanges(base, current, allow);
      ASSERT_TRUE(changes.ok()) << changes.status().ToString();
      for (IndexEncoding encoding : {IndexEncoding::kRaw, IndexEncoding::kGapDelta}) {
        Result<EncodedPatch> patch = EncodeDelta(DeltaInfo(base, encoding), *changes);
        ASSERT_TRUE(patch.ok()) << patch.status().ToString();
        ApplyTrl(c, Flatten(*patch), encoding == IndexEncoding::kRaw ? "raw" : "gap_delta");
      }
      DetectedGapDelta fused;
      Status s = DetectAndEncodeGapDelta(base, current, allow, DeltaInfo(base, IndexEncoding::kGapDelta), fused);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ApplyTrl(c, Flatten(fused.patch), "fused gap_delta");
      const StateHash base_hash = HashState(base);
      for (int version : {2, 3}) {
        for (int container : {1, 2}) {
          const std::string route = "compact v" + std::to_string(version) + " c" + std::to_string(container);
          Result<EncodedPatch> patch = EncodeCompactDelta(DeltaInfo(base, IndexEncoding::kCompact), base_hash, base,
                                                          *changes, 2, version, container);
          ASSERT_TRUE(patch.ok()) << route << ": " << patch.status().ToString();
          Result<SafetensorsFile> file = ParseBytes(Flatten(*patch));
          ASSERT_TRUE(file.ok()) << file.status().ToString();
          Result<CompactDelta> delta = DecodeCompactDelta(*file, base, base_hash, 2);
          ASSERT_TRUE(delta.ok()) << route << ": " << delta.status().ToString();
          WeightState state = Base(c);
          ASSERT_TRUE(ValidateChanges(state, delta->changes).ok()) << route;
          ApplyChanges(state, delta->changes);
          ExpectWant(c, state, route);
        }
      }
    });
  }
}

}  // namespace
}  // namespace deltasync
