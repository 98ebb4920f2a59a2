// detect_bench: change detection and state-hash throughput on a model-sized
// state, against a memcpy of the same bytes measured in the same run.
//
//   detect_bench [--small] [--threads N] [--reps R] [--rate P] [--target T]
//
// Builds a Qwen3-0.6B-shaped state (596M parameters; --small: ~96M) as fp32
// masters, publishes it (rounded to bf16), changes a fraction P (default
// 3.4%) of the masters by one bf16 step, then times:
//   detect fp32  DetectChanges with the fp32 masters as input
//   detect bf16  DetectChanges with bf16 weights as input
//   hash full    HashState of the published bf16 state
//   hash delta   HashDelta over every detected change (single thread)
//   memcpy       copying the bf16 model's bytes, same threads
// Rates are in GB/s of the bf16 model (2 bytes per parameter), so each is
// directly comparable with memcpy; the best of R repetitions is reported.
// --target restricts the SIMD kernels to one target (AVX3, AVX2, SSE4, ...)
// to see what CPUs without AVX-512 get.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bf16/simd_kernels.h"
#include "common/parallel.h"
#include "deltasync/changes.h"
#include "deltasync/state_hash.h"
#include "deltasync/weight_state.h"

namespace {

using deltasync::DType;
using deltasync::TensorView;

struct Options {
  bool small = false;
  int threads = 2;
  int reps = 3;
  double rate = 0.034;
  std::string target;
};

struct Shape {
  std::string name;
  std::vector<uint64_t> dims;
  bool norm = false;  // initialised near 1.0 rather than near 0
};

// Qwen3-0.6B: hidden 1024, 28 layers, 16 query heads and 8 kv heads of 128,
// MLP 3072, vocab 151936, tied embeddings.
std::vector<Shape> ModelShapes(bool small) {
  const uint64_t hidden = 1024, q = 2048, kv = 1024, mlp = 3072, head = 128;
  const uint64_t vocab = small ? 32768 : 151936;
  const int layers = small ? 4 : 28;
  std::vector<Shape> shapes = {{"model.embed_tokens.weight", {vocab, hidden}},
                               {"model.norm.weight", {hidden}, true}};
  for (int l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    shapes.push_back({p + "self_attn.q_proj.weight", {q, hidden}});
    shapes.push_back({p + "self_attn.k_proj.weight", {kv, hidden}});
    shapes.push_back({p + "self_attn.v_proj.weight", {kv, hidden}});
    shapes.push_back({p + "self_attn.o_proj.weight", {hidden, q}});
    shapes.push_back({p + "self_attn.q_norm.weight", {head}, true});
    shapes.push_back({p + "self_attn.k_norm.weight", {head}, true});
    shapes.push_back({p + "mlp.gate_proj.weight", {mlp, hidden}});
    shapes.push_back({p + "mlp.up_proj.weight", {mlp, hidden}});
    shapes.push_back({p + "mlp.down_proj.weight", {hidden, mlp}});
    shapes.push_back({p + "input_layernorm.weight", {hidden}, true});
    shapes.push_back({p + "post_attention_layernorm.weight", {hidden}, true});
  }
  return shapes;
}

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Runs fn(tensor, begin, end) over 1 Mi-element pieces of every tensor.
void ForEachPiece(const std::vector<uint64_t>& sizes, int threads,
                  const std::function<void(size_t, uint64_t, uint64_t)>& fn) {
  struct Piece {
    size_t t;
    uint64_t b, e;
  };
  std::vector<Piece> pieces;
  for (size_t t = 0; t < sizes.size(); ++t) {
    for (uint64_t b = 0; b < sizes[t]; b += 1 << 20)
      pieces.push_back({t, b, std::min(sizes[t], b + (1 << 20))});
  }
  deltasync::ParallelFor(pieces.size(), threads,
                         [&](size_t i) { fn(pieces[i].t, pieces[i].b, pieces[i].e); });
}

double Seconds(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Best(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) best = std::min(best, Seconds(fn));
  return best;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "detect_bench: error: %s\n", what.c_str());
  std::exit(1);
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--small") {
      o.small = true;
    } else if (a == "--threads") {
      o.threads = std::atoi(next());
    } else if (a == "--reps") {
      o.reps = std::max(1, std::atoi(next()));
    } else if (a == "--rate") {
      o.rate = std::atof(next());
    } else if (a == "--target") {
      o.target = next();
    } else {
      Die("unknown argument " + a + " (use --small, --threads N, --reps R, --rate P, --target T)");
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = ParseArgs(argc, argv);
  if (!opt.target.empty() && !deltasync::kernels::UseOnlyTarget(opt.target)) {
    std::string known;
    for (const std::string& t : deltasync::kernels::SupportedTargetNames()) known += " " + t;
    Die("unknown or unsupported target " + opt.target + " (this CPU:" + known + ")");
  }
  const std::vector<Shape> shapes = ModelShapes(opt.small);
  std::vector<uint64_t> sizes;
  uint64_t params = 0;
  for (const Shape& s : shapes) {
    uint64_t n = 1;
    for (uint64_t d : s.dims) n *= d;
    sizes.push_back(n);
    params += n;
  }
  const double model_gb = 2.0 * static_cast<double>(params) / 1e9;
  std::printf("model: %s, %zu tensors, %.1fM parameters, %.3f GB as bf16\n",
              opt.small ? "Qwen3-0.6B-shaped (small)" : "Qwen3-0.6B-shaped", shapes.size(),
              static_cast<double>(params) / 1e6, model_gb);
  std::printf("threads: %d, SIMD target: %s, change rate: %.2f%%, best of %d\n", opt.threads,
              deltasync::kernels::ActiveTargetName().c_str(), 100 * opt.rate, opt.reps);

  // fp32 masters: small random weights, norms near 1.
  std::vector<std::vector<float>> masters(shapes.size());
  for (size_t t = 0; t < shapes.size(); ++t) masters[t].resize(sizes[t]);
  ForEachPiece(sizes, opt.threads, [&](size_t t, uint64_t b, uint64_t e) {
    uint64_t rng = t * 0x1000003ull + b;
    for (uint64_t i = b; i < e; ++i) {
      const double u = static_cast<double>(SplitMix(rng) >> 11) * 0x1.0p-53 - 0.5;
      masters[t][i] = static_cast<float>(shapes[t].norm ? 1.0 + 0.1 * u : 0.08 * u);
    }
  });
  auto views_of_masters = [&] {
    std::vector<TensorView> v;
    for (size_t t = 0; t < shapes.size(); ++t) {
      v.push_back({shapes[t].name,
                   DType::kF32,
                   shapes[t].dims,
                   {reinterpret_cast<const uint8_t*>(masters[t].data()), sizes[t] * 4}});
    }
    return v;
  };
  auto published_or = deltasync::ToPublishedState(views_of_masters(), {.threads = opt.threads});
  if (!published_or.ok()) Die(published_or.status().ToString());
  deltasync::WeightState published = std::move(published_or).value();

  // One optimizer step: a fraction `rate` of the masters moves by one bf16
  // step (adding 2^16 to the fp32 pattern moves the rounded value by one).
  const uint64_t threshold = static_cast<uint64_t>(opt.rate * 18446744073709551615.0);
  ForEachPiece(sizes, opt.threads, [&](size_t t, uint64_t b, uint64_t e) {
    uint64_t rng = ~(t * 0x1000003ull + b);
    for (uint64_t i = b; i < e; ++i) {
      if (SplitMix(rng) >= threshold) continue;
      uint32_t bits;
      std::memcpy(&bits, &masters[t][i], 4);
      bits += 0x10000;
      std::memcpy(&masters[t][i], &bits, 4);
    }
  });
  // The same step as bf16 weights (what a bf16-only trainer would hand us).
  std::vector<std::vector<uint16_t>> current_bf16(shapes.size());
  for (size_t t = 0; t < shapes.size(); ++t) current_bf16[t].resize(sizes[t]);
  ForEachPiece(sizes, opt.threads, [&](size_t t, uint64_t b, uint64_t e) {
    deltasync::ConvertFp32ToBf16(masters[t].data() + b, current_bf16[t].data() + b, e - b);
  });
  std::vector<TensorView> fp32_views = views_of_masters(), bf16_views;
  for (size_t t = 0; t < shapes.size(); ++t) {
    bf16_views.push_back(
        {shapes[t].name,
         DType::kBF16,
         shapes[t].dims,
         {reinterpret_cast<const uint8_t*>(current_bf16[t].data()), sizes[t] * 2}});
  }

  // Baseline: copy the bf16 model's bytes with the same threads (the
  // destination is touched first so page faults are not timed).
  std::vector<uint8_t> copy(2 * params, 1);
  std::vector<uint64_t> offsets(shapes.size() + 1, 0);
  for (size_t t = 0; t < shapes.size(); ++t) offsets[t + 1] = offsets[t] + 2 * sizes[t];
  const double t_memcpy = Best(opt.reps, [&] {
    ForEachPiece(sizes, opt.threads, [&](size_t t, uint64_t b, uint64_t e) {
      std::memcpy(copy.data() + offsets[t] + 2 * b, current_bf16[t].data() + b, 2 * (e - b));
    });
  });
  copy = {};

  std::vector<deltasync::TensorChanges> changes;
  auto detect = [&](const std::vector<TensorView>& current) {
    auto r = deltasync::DetectChanges(published, current, {.threads = opt.threads});
    if (!r.ok()) Die(r.status().ToString());
    changes = std::move(r).value();
  };
  const double t_detect_fp32 = Best(opt.reps, [&] { detect(fp32_views); });
  const double t_detect_bf16 = Best(opt.reps, [&] { detect(bf16_views); });
  uint64_t changed = 0;
  for (const auto& tc : changes) changed += tc.count();

  deltasync::StateHash before;
  const double t_hash =
      Best(opt.reps, [&] { before = deltasync::HashState(published, opt.threads); });
  deltasync::StateHash delta;
  const double t_delta = Best(opt.reps, [&] {
    delta = {};
    for (const auto& tc : changes)
      delta += deltasync::HashDelta(published.Find(tc.name)->view(), tc);
  });

  // Sanity: apply the changes; the incremental hash must equal a full one.
  for (const auto& tc : changes) {
    deltasync::WeightState::Tensor* t = published.FindMutable(tc.name);
    for (size_t k = 0; k < tc.count(); ++k) {
      std::memcpy(t->data.data() + 2 * tc.indices[k], tc.values.data() + 2 * k, 2);
    }
  }
  const bool consistent = before + delta == deltasync::HashState(published, opt.threads);

  const double memcpy_gbs = model_gb / t_memcpy;
  auto row = [&](const char* what, double seconds) {
    const double gbs = model_gb / seconds;
    std::printf("  %-14s %8.1f ms  %7.2f GB/s  %5.2fx memcpy time\n", what, 1e3 * seconds, gbs,
                memcpy_gbs / gbs);
  };
  std::printf("changed: %llu of %llu bf16 elements (%.3f%%)\n",
              static_cast<unsigned long long>(changed), static_cast<unsigned long long>(params),
              100.0 * static_cast<double>(changed) / static_cast<double>(params));
  row("memcpy", t_memcpy);
  row("detect fp32", t_detect_fp32);
  row("detect bf16", t_detect_bf16);
  row("hash full", t_hash);
  std::printf("  %-14s %8.1f ms  %7.1f M changes/s  %5.1f ns/change (1 thread)\n", "hash delta",
              1e3 * t_delta, static_cast<double>(changed) / t_delta / 1e6,
              1e9 * t_delta / static_cast<double>(std::max<uint64_t>(changed, 1)));
  std::printf("incremental hash == full hash after applying: %s\n", consistent ? "yes" : "NO");
  return consistent ? 0 : 1;
}
