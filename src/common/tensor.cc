#include "deltasync/tensor.h"

#include <array>

namespace deltasync {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, 15> kDTypes = {{
    {DType::kBool, "BOOL", 1},       {DType::kU8, "U8", 1},
    {DType::kI8, "I8", 1},           {DType::kF8_E4M3, "F8_E4M3", 1},
    {DType::kF8_E5M2, "F8_E5M2", 1}, {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},         {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},       {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},         {DType::kF32, "F32", 4},
    {DType::kI64, "I64", 8},         {DType::kU64, "U64", 8},
    {DType::kF64, "F64", 8},
}};

const DTypeInfo& Info(DType dtype) { return kDTypes[static_cast<size_t>(dtype)]; }

}  // namespace

std::string_view DTypeName(DType dtype) { return Info(dtype).name; }
size_t DTypeSize(DType dtype) { return Info(dtype).size; }

std::optional<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

std::optional<uint64_t> CheckedElementCount(std::span<const uint64_t> shape) {
  uint64_t count = 1;
  for (uint64_t dim : shape) {
    if (__builtin_mul_overflow(count, dim, &count)) return std::nullopt;
  }
  return count;
}

std::string ShapeToString(std::span<const uint64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace deltasync
