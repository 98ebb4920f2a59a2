// A small random model that evolves like a trainer's weights, for tests.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "deltasync/tensor.h"

namespace deltasync::testing {

// Tensors: several bf16 matrices and vectors plus one F32 tensor (a router
// bias, carried bytewise). Step() changes a random fraction of elements.
class RandomModel {
 public:
  explicit RandomModel(uint64_t seed, bool with_fp32 = true);

  // Changes about `fraction` of the bf16 elements by +-1 ULP (sometimes
  // more), and, with probability 1/3, a few elements of the F32 tensor.
  void Step(double fraction);

  std::vector<TensorView> Views() const;
  uint64_t num_elements() const;

  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> data;
  };
  std::vector<Tensor>& tensors() { return tensors_; }

 private:
  std::mt19937_64 rng_;
  std::vector<Tensor> tensors_;
};

}  // namespace deltasync::testing
