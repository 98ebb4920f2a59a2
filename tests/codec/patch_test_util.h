// Helpers shared by the codec tests: building changes, flattening an
// EncodedPatch, crafting raw safetensors files.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "deltasync/blob.h"
#include "deltasync/patch.h"
#include "deltasync/safetensors.h"
#include "deltasync/weight_state.h"

namespace deltasync::testing {

// A state of random bytes, tensor by tensor (1-D), for apply tests.
struct RandomBytesModel {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
  void Add(std::string name, DType dtype, uint64_t n, std::mt19937_64& rng) {
    std::vector<uint8_t> bytes(n * DTypeSize(dtype));
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    storage.push_back(std::move(bytes));
    views.push_back({std::move(name), dtype, {n}, {}});
  }
  WeightState State() {
    for (size_t i = 0; i < views.size(); ++i) views[i].data = storage[i];
    Result<WeightState> s = WeightState::FromViews(views);
    EXPECT_TRUE(s.ok());
    return std::move(s).value();
  }
};

// Every tensor's bytes, in order.
inline std::vector<std::vector<uint8_t>> Snapshot(const WeightState& s) {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& t : s.tensors()) out.push_back(t.data);
  return out;
}

// The bf16 bits of element i of tensor `name` of `s`.
inline uint16_t Bf16At(const WeightState& s, std::string_view name, uint64_t i) {
  uint16_t v;
  std::memcpy(&v, s.Find(name)->data.data() + 2 * i, 2);
  return v;
}

// bf16 changes of tensor `name` at `indices`, new value = f(old bits, index).
inline TensorChanges Bf16Changes(const WeightState& s, std::string name, std::vector<uint64_t> indices,
                                 const std::function<uint16_t(uint16_t, uint64_t)>& f) {
  TensorChanges c;
  c.name = name;
  c.dtype = DType::kBF16;
  for (uint64_t i : indices) {
    const uint16_t v = f(Bf16At(s, name, i), i);
    c.values.push_back(static_cast<uint8_t>(v));
    c.values.push_back(static_cast<uint8_t>(v >> 8));
  }
  c.indices = std::move(indices);
  return c;
}

inline std::vector<uint8_t> Flatten(const EncodedPatch& patch) {
  std::vector<uint8_t> out;
  for (ByteSpan part : patch.parts) out.insert(out.end(), part.begin(), part.end());
  EXPECT_EQ(out.size(), patch.size);
  return out;
}

inline Result<SafetensorsFile> ParseBytes(std::vector<uint8_t> bytes, std::string label = "test.safetensors") {
  return SafetensorsFile::Parse(Blob::FromVector(std::move(bytes)), std::move(label));
}

inline Result<DecodedPatch> Decode(std::vector<uint8_t> bytes, std::string label = "test.safetensors") {
  DS_ASSIGN_OR_RETURN(SafetensorsFile file, ParseBytes(std::move(bytes), std::move(label)));
  return DecodePatch(std::move(file));
}

// Little-endian bytes of `values` as T.
template <typename T, typename U>
std::vector<uint8_t> Bytes(const std::vector<U>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  for (size_t i = 0; i < values.size(); ++i) {
    T v = static_cast<T>(values[i]);
    std::memcpy(out.data() + i * sizeof(T), &v, sizeof(T));
  }
  return out;
}

// bf16 changes at `indices` whose values are derived from the index.
inline TensorChanges MakeChanges(std::string name, std::vector<uint64_t> indices) {
  TensorChanges c;
  c.name = std::move(name);
  c.dtype = DType::kBF16;
  std::vector<uint16_t> values;
  for (uint64_t i : indices) values.push_back(static_cast<uint16_t>(i * 2654435761u >> 7));
  c.values = Bytes<uint16_t>(values);
  c.indices = std::move(indices);
  return c;
}

// `count` distinct ascending positions in [0, n).
inline std::vector<uint64_t> RandomIndices(std::mt19937_64& rng, uint64_t n, size_t count) {
  std::vector<uint64_t> out;
  if (n == 0) return out;
  for (size_t i = 0; i < count; ++i) out.push_back(rng() % n);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// The TRL delta metadata, as a starting point for crafted files.
inline Metadata DeltaMetadata(std::string encoding = "gap_delta") {
  return {{"format", "sparse_weight_patch"}, {"version", "1"},        {"sparse", "True"},
          {"model_version", "5"},            {"encoding", encoding}};
}

// A crafted file: tensors whose bytes live in `storage`.
struct Crafted {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;

  void Add(std::string name, DType dtype, std::vector<uint64_t> shape, std::vector<uint8_t> bytes) {
    storage.push_back(std::move(bytes));
    views.push_back({std::move(name), dtype, std::move(shape), {}});
  }
  std::vector<uint8_t> Serialize(const Metadata& metadata) {
    for (size_t i = 0; i < views.size(); ++i) views[i].data = storage[i];
    Result<std::vector<uint8_t>> bytes = SerializeSafetensors(metadata, views);
    EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
    return bytes.ok() ? std::move(bytes).value() : std::vector<uint8_t>();
  }
};

}  // namespace deltasync::testing
