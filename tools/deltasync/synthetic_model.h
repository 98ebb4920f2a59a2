// A synthetic trainer for the demo and the benchmark: Qwen3-0.6B's tensor
// names and shapes, fp32 masters ~N(0, 0.02) (norm weights 1.0), and AdamW
// steps driven by synthetic gradients with per-row scales, so the bf16 change
// pattern between versions looks like an RL run's. Deterministic for a seed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "deltasync/tensor.h"

namespace deltasync::cli {

struct SyntheticModelOptions {
  int layers = 28;          // Qwen3-0.6B: 28 decoder layers
  uint64_t vocab = 151936;  // Qwen3 vocabulary (embedding rows)
  double lr = 3e-6;
  double weight_decay = 0.01;
  uint64_t seed = 1234;
  int threads = 2;
};

// Qwen3-0.6B's tensor names and shapes with `layers` decoder layers (the
// embedding is tied, so there is no separate lm_head).
std::vector<std::pair<std::string, std::vector<uint64_t>>> Qwen3Shapes(int layers, uint64_t vocab = 151936);

// An approximately standard normal number derived from a 64-bit key.
float SyntheticGauss(uint64_t key);

// The benchmarks' one-step model: a published bf16 state ~N(0, 0.02) (norm
// weights 1.0) over Qwen3Shapes(layers, vocab), and fp32 masters whose
// rounding moves about `changed_fraction` of the elements by one bf16 ULP
// (as AdamW at lr 3e-6 does at the demo's step 10); the other masters lie
// inside their element's rounding interval. Deterministic.
struct BenchModel {
  std::vector<std::pair<std::string, std::vector<uint64_t>>> shapes;
  std::vector<std::vector<uint16_t>> base_data;
  std::vector<std::vector<uint32_t>> master_data;
  std::vector<TensorView> base, masters;  // views of the two, in shape order
};
BenchModel MakeBenchModel(int layers, uint64_t vocab, double changed_fraction);

class SyntheticTrainer {
 public:
  explicit SyntheticTrainer(const SyntheticModelOptions& options);

  // One AdamW step with fresh synthetic gradients.
  void Step();

  // fp32 master weights, valid until the trainer is destroyed.
  std::vector<TensorView> MasterViews() const;
  uint64_t num_elements() const { return num_elements_; }
  uint64_t steps_taken() const { return step_; }

 private:
  struct Param {
    std::string name;
    std::vector<uint64_t> shape;
    std::vector<float> w, m, v;
    std::vector<float> row_scale;  // gradient scale per output row
  };
  void ForChunks(const std::function<void(Param&, size_t begin, size_t end, uint64_t salt)>& fn);

  SyntheticModelOptions options_;
  std::vector<Param> params_;
  uint64_t num_elements_ = 0;
  uint64_t step_ = 0;
};

}  // namespace deltasync::cli
