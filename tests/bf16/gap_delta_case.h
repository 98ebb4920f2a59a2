// The gap_delta detect tests' case (shared by detect_encode_test.cc and
// detect_encode_apply_test.cc): a published state and the trainer's tensors
// against it, with gaps too wide for 16 bits at and away from chunk borders,
// and what DetectChanges + EncodeDelta give for it (ForEachRate: at each
// change rate the tests run at).
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bf16/bf16_test_util.h"
#include "codec/patch_test_util.h"
#include "deltasync/changes.h"
#include "deltasync/patch.h"
#include "deltasync/weight_state.h"

namespace deltasync::testing_bf16 {

// A published state and the trainer's tensors against it: bf16 weights
// whose current form is fp32 masters (rounding to the published value, or
// to a neighbour where changed), and other dtypes compared bitwise.
struct Case {
  std::vector<OwnedTensor> published;
  std::vector<OwnedTensor> current;
  WeightState state;
};

// A bf16 tensor of `n` elements and its fp32 masters; `changed(i)` says
// which masters round to another bf16 value than the published one.
template <typename Changed>
void AddMastered(std::mt19937_64& rng, Case& c, std::string name, std::vector<uint64_t> shape, Changed changed) {
  OwnedTensor pub = RandomTensor(rng, name, DType::kBF16, shape);
  OwnedTensor cur{name, DType::kF32, shape, std::vector<uint8_t>(pub.elements() * 4)};
  for (uint64_t i = 0; i < pub.elements(); ++i) {
    uint16_t p;
    std::memcpy(&p, pub.data.data() + 2 * i, 2);
    // The low half below 0x8000 rounds down to the high half; flipping the
    // lowest mantissa bit keeps the exponent, so the value stays finite.
    const uint16_t high = changed(i) ? static_cast<uint16_t>(p ^ 1) : p;
    const uint32_t bits = (uint32_t{high} << 16) | static_cast<uint32_t>(rng() & 0x7FFF);
    std::memcpy(cur.data.data() + 4 * i, &bits, 4);
  }
  c.published.push_back(std::move(pub));
  c.current.push_back(std::move(cur));
}

inline Case MakeCase(uint64_t seed, double rate) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution pick(rate);
  Case c;
  auto at_rate = [&](uint64_t) { return pick(rng); };
  AddMastered(rng, c, "model.embed_tokens.weight", {150, 1001}, at_rate);
  AddMastered(rng, c, "layers.0.mlp.down_proj.weight", {70001}, at_rate);
  AddMastered(rng, c, "layers.0.norm.weight", {7}, at_rate);
  AddMastered(rng, c, "layers.0.empty", {0, 5}, at_rate);
  AddMastered(rng, c, "a.scalar", {}, at_rate);
  // Gaps past 16 bits (U32): the first change far from the start, a run
  // across a border of 16 Ki elements (the scan's blocks; also a chunk border
  // at 4096), a wide gap away from the start, then rate-picked changes (at
  // rate 0 the tensor keeps only the fixed ones).
  AddMastered(rng, c, "layers.0.sparse", {240000}, [&](uint64_t i) {
    return i == 70000 || i == 70001 || (i >= 81915 && i < 81925) || i == 150000 || i == 239999 ||
           (i > 160000 && pick(rng));
  });
  // A wide gap after a change at the very start.
  AddMastered(rng, c, "layers.1.sparse", {90000}, [](uint64_t i) { return i == 0 || i == 89999; });
  // The widest gap 16 bits hold (U16), and the first one past it (U32).
  AddMastered(rng, c, "layers.2.fits", {70000}, [](uint64_t i) { return i == 0 || i == 65536; });
  AddMastered(rng, c, "layers.3.just_wide", {70000}, [](uint64_t i) { return i == 65536; });
  for (auto [name, dtype, n] : {std::tuple{"layers.0.router.bias", DType::kF32, uint64_t{131}},
                                std::tuple{"layers.0.f16", DType::kF16, uint64_t{77}},
                                std::tuple{"layers.0.f64", DType::kF64, uint64_t{45}},
                                std::tuple{"layers.0.ids", DType::kI32, uint64_t{65}},
                                std::tuple{"layers.0.mask", DType::kBool, uint64_t{200}},
                                std::tuple{"layers.0.fp8", DType::kF8_E4M3, uint64_t{333}}}) {
    OwnedTensor pub = RandomTensor(rng, name, dtype, {n});
    OwnedTensor cur = pub;
    Mutate(rng, cur, rate);
    c.published.push_back(std::move(pub));
    c.current.push_back(std::move(cur));
  }
  auto state = WeightState::FromViews(Views(c.published));
  EXPECT_TRUE(state.ok()) << state.status().ToString();
  c.state = std::move(state).value();
  return c;
}

inline PatchInfo InfoFor(const WeightState& state) {
  PatchInfo info;
  info.model_version = 12;
  info.base_version = 11;
  info.encoding = IndexEncoding::kGapDelta;
  info.total_elements = state.total_elements();
  return info;
}

// What DetectChanges then EncodeDelta write, or their error.
inline Result<std::vector<uint8_t>> Separate(const WeightState& state, std::span<const TensorView> current,
                                      const DetectOptions& options, const PatchInfo& info, uint64_t* changed) {
  DS_ASSIGN_OR_RETURN(std::vector<TensorChanges> changes, DetectChanges(state, current, options));
  *changed = 0;
  for (const TensorChanges& c : changes) *changed += c.count();
  DS_ASSIGN_OR_RETURN(EncodedPatch patch, EncodeDelta(info, changes));
  return testing::Flatten(patch);
}

// One rate's case and what DetectChanges then EncodeDelta give for it: the
// patch every route must write, and its change count.
struct RateCase {
  Case c;
  std::vector<TensorView> current;  // views of c.current
  PatchInfo info;
  std::vector<uint8_t> want;
  uint64_t want_changed = 0;
};

// For each rate the gap_delta tests run at (0%, 0.1%, 3.4%, 50%, 100% changed),
// under a trace of it: MakeCase(seed + rate * 1000, rate) and the separate
// route's patch, to body(const RateCase&).
template <typename Body>
void ForEachRate(uint64_t seed, Body body) {
  for (double rate : {0.0, 0.001, 0.034, 0.5, 1.0}) {
    SCOPED_TRACE("rate " + std::to_string(rate));
    RateCase r;
    r.c = MakeCase(static_cast<uint64_t>(rate * 1000) + seed, rate);
    r.current = Views(r.c.current);
    r.info = InfoFor(r.c.state);
    Result<std::vector<uint8_t>> want = Separate(r.c.state, r.current, {.threads = 1}, r.info, &r.want_changed);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    r.want = std::move(*want);
    body(std::as_const(r));
  }
}

}  // namespace deltasync::testing_bf16
