#include "testing/random_model.h"

#include <cstring>

namespace deltasync::testing {

RandomModel::RandomModel(uint64_t seed, bool with_fp32) : rng_(seed) {
  std::normal_distribution<float> normal(0.0f, 0.02f);
  auto add_bf16 = [&](std::string name, std::vector<uint64_t> shape, bool ones) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    Tensor t{std::move(name), DType::kBF16, std::move(shape), std::vector<uint8_t>(n * 2)};
    for (uint64_t i = 0; i < n; ++i) {
      float w = ones ? 1.0f : normal(rng_);
      uint32_t bits;
      std::memcpy(&bits, &w, 4);
      uint16_t bf = static_cast<uint16_t>(bits >> 16);
      std::memcpy(&t.data[i * 2], &bf, 2);
    }
    tensors_.push_back(std::move(t));
  };
  add_bf16("model.embed_tokens.weight", {97, 64}, false);
  add_bf16("model.layers.0.self_attn.q_proj.weight", {64, 64}, false);
  add_bf16("model.layers.0.mlp.up_proj.weight", {128, 64}, false);
  add_bf16("model.layers.0.input_layernorm.weight", {64}, true);
  add_bf16("model.norm.weight", {64}, true);
  if (with_fp32) {
    Tensor bias{"model.layers.0.mlp.gate.e_score_correction_bias", DType::kF32, {8}, std::vector<uint8_t>(32)};
    for (int i = 0; i < 8; ++i) {
      float v = normal(rng_);
      std::memcpy(&bias.data[i * 4], &v, 4);
    }
    tensors_.push_back(std::move(bias));
  }
}

void RandomModel::Step(double fraction) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (Tensor& t : tensors_) {
    if (t.dtype == DType::kBF16) {
      uint64_t n = t.data.size() / 2;
      for (uint64_t i = 0; i < n; ++i) {
        if (u(rng_) >= fraction) continue;
        uint16_t bf;
        std::memcpy(&bf, &t.data[i * 2], 2);
        int step = u(rng_) < 0.9 ? 1 : 3;
        bf = static_cast<uint16_t>(u(rng_) < 0.5 ? bf + step : bf - step);
        if ((bf & 0x7F80) == 0x7F80) bf ^= 0x0100;  // keep it finite
        std::memcpy(&t.data[i * 2], &bf, 2);
      }
    } else if (u(rng_) < 1.0 / 3) {
      float v;
      size_t i = rng_() % (t.data.size() / 4);
      std::memcpy(&v, &t.data[i * 4], 4);
      v += 1e-3f;
      std::memcpy(&t.data[i * 4], &v, 4);
    }
  }
}

std::vector<TensorView> RandomModel::Views() const {
  std::vector<TensorView> out;
  for (const Tensor& t : tensors_) out.push_back({t.name, t.dtype, t.shape, t.data});
  return out;
}

uint64_t RandomModel::num_elements() const {
  uint64_t n = 0;
  for (const Tensor& t : tensors_) n += t.data.size() / DTypeSize(t.dtype);
  return n;
}

}  // namespace deltasync::testing
