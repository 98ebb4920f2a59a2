// Test data shared by the unit tests: reproducible byte patterns, and bf16
// tensors that own their bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "deltasync/blob.h"
#include "deltasync/tensor.h"

namespace deltasync::testing {

// n pseudo-random bytes from `seed` (xorshift32), as any container of
// chars or bytes (std::string, std::vector<uint8_t>).
template <class Bytes>
Bytes Pattern(size_t n, uint32_t seed) {
  Bytes out(n, 0);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    out[i] = static_cast<typename Bytes::value_type>(x);
  }
  return out;
}

// A string's bytes as a ByteSpan (no copy); a Blob's bytes as a string.
inline ByteSpan Span(std::string_view s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }
inline std::string Str(const Blob& b) { return {reinterpret_cast<const char*>(b.bytes().data()), b.size()}; }

// A bf16 tensor that owns its bytes.
struct OwnedBf16 {
  std::string name;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
  TensorView view() const { return {name, DType::kBF16, shape, bytes}; }
};

// A bf16 tensor of `shape` whose byte i is fill(i).
template <class Fill>
OwnedBf16 MakeBf16(std::string name, std::vector<uint64_t> shape, Fill fill) {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  OwnedBf16 t{std::move(name), std::move(shape), std::vector<uint8_t>(2 * n)};
  for (size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = fill(i);
  return t;
}

}  // namespace deltasync::testing
