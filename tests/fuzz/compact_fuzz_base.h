// The fixed base state the compact fuzz target decodes deltas against; the
// seed corpus (tests/fuzz/corpus/compact/) is written against it by
// tests/codec/compact_test.cc (CompactSeedCorpus).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "deltasync/state_hash.h"
#include "deltasync/weight_state.h"

namespace deltasync::testing {

struct CompactFuzzBase {
  std::vector<uint8_t> a, f;
  WeightState state;
  StateHash hash;
  CompactFuzzBase() : a(2 * 64), f(4 * 8) {
    for (size_t k = 0; k < 64; ++k) {
      const uint16_t v = static_cast<uint16_t>(0x3C00 + k * 37 + (k % 3 ? 0x8000 : 0) + (k == 5 ? 0x4000 : 0));
      std::memcpy(a.data() + 2 * k, &v, 2);
    }
    for (size_t k = 0; k < f.size(); ++k) f[k] = static_cast<uint8_t>(k * 11);
    std::vector<TensorView> v{{"a", DType::kBF16, {8, 8}, a}, {"f", DType::kF32, {8}, f}};
    state = std::move(WeightState::FromViews(v)).value();
    hash = HashState(state, 1);
  }
};

}  // namespace deltasync::testing
