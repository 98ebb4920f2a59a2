// Measures the compact delta codec and compressed anchors on a synthetic
// Qwen3-0.6B-shaped model (embedding 151936x1024 + --layers layers): fp32
// masters ~N(0, 0.02) (norms 1.0), AdamW steps at lr 3e-6 on noise gradients
// with log-normal per-row scales (tools/deltasync/synthetic_model.cc), and
// the per-step delta at the last step. Prints figures, never pass/fail.
// `deltasync bench` reports the same figures (tools/deltasync/codec_stats.h).
//
//   compact_bench [--layers 2] [--steps 10] [--vocab 151936] [--reps 3]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "codec_stats.h"
#include "deltasync/changes.h"
#include "synthetic_model.h"

int main(int argc, char** argv) {
  using namespace deltasync;
  int layers = 2, steps = 10, reps = 3;
  uint64_t vocab = 151936;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--layers") layers = std::atoi(argv[i + 1]);
    else if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--vocab") vocab = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
  }
  // The demo's trainer, so the change pattern is the one `deltasync demo` measures.
  cli::SyntheticModelOptions model;
  model.layers = layers;
  model.vocab = vocab;
  cli::SyntheticTrainer trainer(model);
  for (int s = 1; s < steps; ++s) trainer.Step();
  WeightState base = std::move(ToPublishedState(trainer.MasterViews())).value();
  trainer.Step();
  std::vector<TensorChanges> changes = std::move(DetectChanges(base, trainer.MasterViews())).value();
  Result<cli::DeltaFigures> d = cli::MeasureDeltaCodecs(base, changes, steps, reps);
  Result<cli::AnchorFigures> a = cli::MeasureAnchorCodec(base, steps, reps);
  if (!d.ok() || !a.ok()) {
    std::fprintf(stderr, "compact_bench: %s\n", (!d.ok() ? d.status() : a.status()).ToString().c_str());
    return 1;
  }
  std::printf("model: %d layers, %.1fM bf16 elements (%.0f MB); step %d changes %.2fM elements (%.2f%%)\n", layers,
              base.total_elements() / 1e6, base.total_bytes() / 1e6, steps, d->changed / 1e6,
              100.0 * d->changed / base.total_elements());
  std::printf("bytes per changed element (whole file incl. header):\n");
  std::printf("  raw                 %.3f\n", d->raw);
  std::printf("  gap_delta           %.3f\n", d->gap_delta);
  std::printf("  gap_delta + zstd-3  %.3f\n", d->gap_delta_zstd);
  std::printf("  compact v2          %.3f   (%.3f x entropy)\n", d->v2.bytes_per_changed, d->v2.bytes_per_changed / d->entropy);
  std::printf("  compact v3          %.3f   (%.3f x entropy; %.3f x v2)\n", d->v3.bytes_per_changed,
              d->v3.bytes_per_changed / d->entropy, d->v3.bytes_per_changed / d->v2.bytes_per_changed);
  for (const auto& [name, v] : {std::pair{"v2", d->v2}, std::pair{"v3", d->v3}}) {
    std::printf("    %s parts: header %.4f, gaps %.4f, diffs %.4f, escapes+other values %.4f\n", name, v.header, v.gaps,
                v.diffs, v.escapes);
  }
  std::printf("  order-0 entropy of (gap, ULP diff), reference        %.3f   (compact / entropy = %.3f)\n", d->entropy,
              d->compact / d->entropy);
  std::printf("  base-exponent context entropy (flag|exp + diff|exp)  %.3f   (model cost excluded)\n",
              d->context_entropy);
  std::printf("    parts, B per changed: H0(gap) %.3f, H0(diff) %.3f, H(flag|exp) %.3f, H(diff|exp) %.3f\n", d->h0_gap,
              d->h0_diff, d->ctx_flag, d->ctx_diff);
  for (const auto& [name, v] : {std::pair{"v2", d->v2}, std::pair{"v3", d->v3}}) {
    std::printf("compact %s throughput, GB/s of bf16 model: encode %.2f (1 thread), decode %.2f (1 thread), decode %.2f "
                "(%u threads)\n",
                name, v.encode_gbps_1t, v.decode_gbps_1t, v.decode_gbps_all, std::thread::hardware_concurrency());
  }
  std::printf("anchor: H(exponent) = %.3f bits; ratio %.4f vs order-0 ceiling %.4f = %.3f of ceiling; bit-exact %s\n",
              a->exponent_entropy_bits, a->ratio, a->ceiling, a->ratio / a->ceiling, a->exact ? "yes" : "NO");
  std::printf("anchor throughput, GB/s of bf16 model: encode %.2f (all threads), decode %.2f (1 thread)\n",
              a->encode_gbps, a->decode_gbps_1t);
  return a->exact ? 0 : 1;
}
