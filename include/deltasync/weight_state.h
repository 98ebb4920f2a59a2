// WeightState: a full set of named tensors owned in memory (a replica's
// weights, the publisher's last published bf16 snapshot).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "deltasync/status.h"
#include "deltasync/tensor.h"

namespace deltasync {

class WeightState {
 public:
  struct Tensor {
    std::string name;
    DType dtype = DType::kU8;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> data;  // num_elements * DTypeSize(dtype) bytes

    TensorView view() const { return {name, dtype, shape, data}; }
    uint64_t num_elements() const { return data.size() / DTypeSize(dtype); }
  };

  WeightState() = default;
  WeightState(WeightState&&) = default;
  WeightState& operator=(WeightState&&) = default;
  WeightState(const WeightState&) = delete;
  WeightState& operator=(const WeightState&) = delete;

  // Copies the tensors (sorted by name). kInvalidArgument on duplicate names
  // or data sizes that disagree with shape x dtype.
  static Result<WeightState> FromViews(std::span<const TensorView> tensors);
  // The same, taking ownership of `tensors` (no copy of their bytes).
  static Result<WeightState> FromTensors(std::vector<Tensor> tensors);

  // Sorted by name.
  const std::vector<Tensor>& tensors() const { return tensors_; }
  std::vector<Tensor>& mutable_tensors() { return tensors_; }
  std::vector<TensorView> views() const;
  // nullptr when absent.
  const Tensor* Find(std::string_view name) const;
  Tensor* FindMutable(std::string_view name);

  uint64_t total_elements() const;
  uint64_t total_bytes() const;

 private:
  std::vector<Tensor> tensors_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace deltasync
