#include "synthetic_model.h"

#include "deltasync/changes.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

namespace deltasync::cli {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// An approximately standard normal number from one 64-bit hash: the sum of
// four 16-bit uniforms (Irwin-Hall, n=4), centred and scaled. Cheap enough to
// draw hundreds of millions per step; the tails are bounded at ~3.46 sigma,
// which does not matter for a change-pattern demo.
float Gauss(uint64_t key) {
  uint64_t r = SplitMix64(key);
  float s = static_cast<float>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
  constexpr float kMean = 2.0f * 65535.0f;
  constexpr float kInvSd = 1.7320508f / 65535.0f;  // sd of the sum = 65535 * sqrt(4/12)
  return (s - kMean) * kInvSd;
}

constexpr size_t kChunk = 1 << 20;

}  // namespace

float SyntheticGauss(uint64_t key) { return Gauss(key); }

std::vector<std::pair<std::string, std::vector<uint64_t>>> Qwen3Shapes(int layers, uint64_t vocab) {
  const uint64_t hidden = 1024, heads = 16, kv_heads = 8, head_dim = 128, inter = 3072;
  std::vector<std::pair<std::string, std::vector<uint64_t>>> out;
  auto add = [&](std::string name, std::vector<uint64_t> shape) { out.emplace_back(std::move(name), std::move(shape)); };
  add("model.embed_tokens.weight", {vocab, hidden});
  for (int l = 0; l < layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {hidden});
    add(p + "post_attention_layernorm.weight", {hidden});
    add(p + "self_attn.q_proj.weight", {heads * head_dim, hidden});
    add(p + "self_attn.k_proj.weight", {kv_heads * head_dim, hidden});
    add(p + "self_attn.v_proj.weight", {kv_heads * head_dim, hidden});
    add(p + "self_attn.o_proj.weight", {hidden, heads * head_dim});
    add(p + "self_attn.q_norm.weight", {head_dim});
    add(p + "self_attn.k_norm.weight", {head_dim});
    add(p + "mlp.gate_proj.weight", {inter, hidden});
    add(p + "mlp.up_proj.weight", {inter, hidden});
    add(p + "mlp.down_proj.weight", {hidden, inter});
  }
  add("model.norm.weight", {hidden});
  return out;
}

SyntheticTrainer::SyntheticTrainer(const SyntheticModelOptions& options) : options_(options) {
  for (auto& [name, shape] : Qwen3Shapes(options.layers, options.vocab)) {
    params_.push_back(Param{name, shape, {}, {}, {}, {}});
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    uint64_t n = 1;
    for (uint64_t d : p.shape) n *= d;
    num_elements_ += n;
    p.w.resize(n);
    p.m.assign(n, 0.0f);
    p.v.assign(n, 0.0f);
    // Gradient magnitudes differ by orders of magnitude between rows (tokens
    // seen or not, heads, channels): log-normal per-row scales.
    uint64_t rows = p.shape.size() == 2 ? p.shape[0] : 1;
    p.row_scale.resize(rows);
    for (uint64_t r = 0; r < rows; ++r) {
      p.row_scale[r] = 1e-3f * std::exp(1.5f * Gauss(options.seed ^ (i << 40) ^ (r * 0x51ED27ull) ^ 0xABCDEFull));
    }
  }
  ForChunks([&](Param& p, size_t b, size_t e, uint64_t salt) {
    bool norm = p.shape.size() == 1;
    for (size_t k = b; k < e; ++k) p.w[k] = norm ? 1.0f : 0.02f * Gauss(options_.seed * 0x9E37ull ^ salt ^ k);
  });
}

void SyntheticTrainer::ForChunks(const std::function<void(Param&, size_t, size_t, uint64_t)>& fn) {
  struct Task {
    size_t param, begin, end;
  };
  std::vector<Task> tasks;
  for (size_t i = 0; i < params_.size(); ++i) {
    for (size_t b = 0; b < params_[i].w.size(); b += kChunk) {
      tasks.push_back({i, b, std::min(params_[i].w.size(), b + kChunk)});
    }
  }
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t t = next++; t < tasks.size(); t = next++) {
      fn(params_[tasks[t].param], tasks[t].begin, tasks[t].end, static_cast<uint64_t>(tasks[t].param) << 44);
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < options_.threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

void SyntheticTrainer::Step() {
  ++step_;
  const float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  const float lr = static_cast<float>(options_.lr), wd = static_cast<float>(options_.weight_decay);
  const float c1 = 1.0f - std::pow(b1, static_cast<float>(step_));
  const float c2 = 1.0f - std::pow(b2, static_cast<float>(step_));
  const uint64_t step_key = SplitMix64(options_.seed + step_ * 0x632BE59BD9B4E019ull);
  ForChunks([&](Param& p, size_t b, size_t e, uint64_t salt) {
    const uint64_t cols = p.shape.size() == 2 ? p.shape[1] : p.w.size();
    for (size_t k = b; k < e; ++k) {
      float g = p.row_scale[k / cols] * Gauss(step_key ^ salt ^ k);
      float m = b1 * p.m[k] + (1 - b1) * g;
      float v = b2 * p.v[k] + (1 - b2) * g * g;
      p.m[k] = m;
      p.v[k] = v;
      float update = (m / c1) / (std::sqrt(v / c2) + eps);
      p.w[k] -= lr * (update + wd * p.w[k]);
    }
  });
}

std::vector<TensorView> SyntheticTrainer::MasterViews() const {
  std::vector<TensorView> out;
  out.reserve(params_.size());
  for (const Param& p : params_) {
    out.push_back(TensorView{p.name, DType::kF32, p.shape,
                             ByteSpan(reinterpret_cast<const uint8_t*>(p.w.data()), p.w.size() * sizeof(float))});
  }
  return out;
}

BenchModel MakeBenchModel(int layers, uint64_t vocab, double changed_fraction) {
  BenchModel out;
  out.shapes = Qwen3Shapes(layers, vocab);
  uint64_t key = 0x5EED;
  for (const auto& [name, shape] : out.shapes) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    std::vector<uint16_t> b(n);
    std::vector<uint32_t> m(n);
    for (uint64_t i = 0; i < n; ++i, ++key) {
      const float w = shape.size() == 1 ? 1.0f : 0.02f * SyntheticGauss(key);
      uint32_t bits;
      std::memcpy(&bits, &w, 4);
      const uint16_t bf = Fp32ToBf16(bits);
      b[i] = bf;
      uint64_t r = key * 0x9E3779B97F4A7C15ull;
      r ^= r >> 29;
      r *= 0xBF58476D1CE4E5B9ull;
      r ^= r >> 32;
      uint16_t moved = bf;
      // Flipping the lowest mantissa bit moves the value by one ULP up or
      // down and can never make a finite value non-finite.
      if (static_cast<double>(r & 0xFFFFFF) < changed_fraction * 0x1000000) moved ^= 1;
      m[i] = (static_cast<uint32_t>(moved) << 16) | static_cast<uint32_t>((r >> 44) & 0x7FFF);
    }
    out.base_data.push_back(std::move(b));
    out.master_data.push_back(std::move(m));
  }
  for (size_t i = 0; i < out.shapes.size(); ++i) {
    const auto& [name, shape] = out.shapes[i];
    out.base.push_back({name, DType::kBF16, shape,
                        ByteSpan(reinterpret_cast<const uint8_t*>(out.base_data[i].data()), out.base_data[i].size() * 2)});
    out.masters.push_back({name, DType::kF32, shape,
                           ByteSpan(reinterpret_cast<const uint8_t*>(out.master_data[i].data()),
                                    out.master_data[i].size() * 4)});
  }
  return out;
}

}  // namespace deltasync::cli
