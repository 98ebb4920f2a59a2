// Element types and non-owning tensor views shared by every stage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deltasync {

using ByteSpan = std::span<const uint8_t>;
using MutableByteSpan = std::span<uint8_t>;

// The safetensors dtypes deltasync knows. Every one has a whole number of
// bytes per element (1, 2, 4 or 8); sub-byte types are refused by the reader.
enum class DType : uint8_t {
  kBool, kU8, kI8, kF8_E4M3, kF8_E5M2,
  kI16, kU16, kF16, kBF16,
  kI32, kU32, kF32,
  kI64, kU64, kF64,
};

// The safetensors spelling: "BF16", "F32", "U16", ...
std::string_view DTypeName(DType dtype);
// Inverse of DTypeName; nullopt for names deltasync does not know.
std::optional<DType> ParseDType(std::string_view name);
// Bytes per element: 1, 2, 4 or 8.
size_t DTypeSize(DType dtype);

// Product of `shape`, or nullopt when it overflows uint64.
std::optional<uint64_t> CheckedElementCount(std::span<const uint64_t> shape);

// A named tensor whose bytes live elsewhere (an mmap'd file, a replica's
// buffer, a trainer's memory). Data is little-endian, row-major, contiguous,
// and data.size() == num_elements() * DTypeSize(dtype).
// The view does not own the bytes: the owner must outlive it.
struct TensorView {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;
  ByteSpan data;

  uint64_t num_elements() const { return data.size() / DTypeSize(dtype); }
};

// "[2, 3, 4]"
std::string ShapeToString(std::span<const uint64_t> shape);

}  // namespace deltasync
