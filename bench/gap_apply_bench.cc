// gap_apply_bench: a replica's apply of a gap_delta delta, in the phases
// `deltasync bench`'s apply_gbps times together (parse + decode of the patch
// keeping the gaps encoded, validate, ApplyGapChanges: gaps decoded, old
// values logged, new values scattered, state-hash terms summed), on the
// Qwen3-0.6B shapes at the demo's step-10 change rate (3.4%), each as a ratio
// to memcpy of the model measured in the same run with the same threads.
// The state and the changes are generated directly (random bf16 bits,
// geometric gaps): no fp32 masters, so it starts in seconds. Also the floor
// under any in-place apply with an undo log (scatter_floor: read the old
// value into the log, write the new one, nothing else). Figures, never
// pass/fail.
//
//   gap_apply_bench [--threads N] [--reps N] [--scale X] [--rate R]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "bench_apply.h"
#include "common/parallel.h"
#include "deltasync/changes.h"
#include "deltasync/patch.h"
#include "deltasync/safetensors.h"
#include "deltasync/weight_state.h"
#include "synthetic_model.h"
#include "timing.h"

using namespace deltasync;

int main(int argc, char** argv) {
  int threads = 2, reps = 5;
  double scale = 1.0, rate = 0.034;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--scale") scale = std::atof(argv[i + 1]);
    else if (a == "--rate") rate = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: gap_apply_bench [--threads N] [--reps N] [--scale X] [--rate R]\n");
      return 2;
    }
  }
  const int layers = std::max(1, static_cast<int>(std::lround(28 * scale)));
  const uint64_t vocab = std::max<uint64_t>(1024, static_cast<uint64_t>(std::llround(151936 * scale)));
  const auto shapes = cli::Qwen3Shapes(layers, vocab);

  // bf16 state: random bits with the exponent of N(0, 0.02)-ish values.
  std::vector<std::vector<uint8_t>> data(shapes.size());
  std::vector<TensorChanges> changes(shapes.size());
  ParallelFor(shapes.size(), threads, [&](size_t t) {
    uint64_t n = 1;
    for (uint64_t d : shapes[t].second) n *= d;
    data[t].resize(2 * n);
    std::mt19937_64 rng(0x6A9 + t);
    uint16_t* v = reinterpret_cast<uint16_t*>(data[t].data());
    for (uint64_t k = 0; k < n; ++k) v[k] = static_cast<uint16_t>(0x3C00 | (rng() & 0x81FF));
    // Changed elements: independent with probability `rate` (geometric gaps),
    // each moved by one ULP.
    TensorChanges& c = changes[t];
    c.name = shapes[t].first;
    c.dtype = DType::kBF16;
    if (rate <= 0) return;
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const double log_q = std::log1p(-std::min(rate, 0.999999));
    uint64_t at = 0;
    for (;;) {
      at += static_cast<uint64_t>(std::floor(std::log(1.0 - u(rng)) / log_q));
      if (at >= n) break;
      c.indices.push_back(at);
      const uint16_t nv = static_cast<uint16_t>(v[at] ^ 1);
      c.values.insert(c.values.end(), reinterpret_cast<const uint8_t*>(&nv), reinterpret_cast<const uint8_t*>(&nv) + 2);
      ++at;
    }
  });
  std::vector<TensorView> views;
  for (size_t t = 0; t < shapes.size(); ++t) views.push_back({shapes[t].first, DType::kBF16, shapes[t].second, data[t]});
  std::erase_if(changes, [](const TensorChanges& c) { return c.indices.empty(); });
  Result<WeightState> replica = WeightState::FromViews(views);
  if (!replica.ok()) return std::fprintf(stderr, "%s\n", replica.status().ToString().c_str()), 1;
  PatchInfo info;
  info.model_version = 11;
  info.base_version = 10;
  info.total_elements = replica->total_elements();
  Result<EncodedPatch> patch = EncodeDelta(info, changes);
  if (!patch.ok()) return std::fprintf(stderr, "%s\n", patch.status().ToString().c_str()), 1;
  std::vector<uint8_t> bytes;
  for (ByteSpan part : patch->parts) bytes.insert(bytes.end(), part.begin(), part.end());
  Blob blob = Blob::FromVector(std::move(bytes));
  uint64_t changed = 0;
  for (const TensorChanges& c : changes) changed += c.indices.size();

  const uint64_t model_bytes = replica->total_bytes();
  const double memcpy_s = cli::MemcpySeconds(model_bytes, threads, reps);
  Status failure;
  std::vector<uint8_t> undo;
  StateHash hash;
  // Parse and decode alone (the gaps stay encoded; chunk starts computed).
  const double decode_s = cli::BestSeconds(reps, [&] {
    Result<SafetensorsFile> file = SafetensorsFile::Parse(blob, "bench delta");
    if (!file.ok()) return void(failure = file.status());
    Result<DecodedPatch> decoded = DecodePatch(std::move(*file), DecodePatchOptions{.keep_gaps_encoded = true});
    if (!decoded.ok()) return void(failure = decoded.status());
  });
  // The whole apply, as `deltasync bench` times it.
  const auto apply = [&] {
    Result<SafetensorsFile> file = SafetensorsFile::Parse(blob, "bench delta");
    if (!file.ok()) return void(failure = file.status());
    Result<DecodedPatch> decoded = DecodePatch(std::move(*file), DecodePatchOptions{.keep_gaps_encoded = true});
    if (!decoded.ok()) return void(failure = decoded.status());
    Status valid = ValidateEncodedChanges(*replica, decoded->encoded);
    if (!valid.ok()) return void(failure = valid);
    hash += ApplyGapChanges(*replica, decoded->encoded, threads, undo);
  };
  const double apply_s = cli::BestSeconds(reps, apply);
  // The same in turns with memcpy (memcpy, apply, ...: `deltasync bench`'s
  // apply_vs_memcpy_paired), 4 reps + 1 rounds.
  cli::PairedTimes paired;
  {
    cli::MemcpyReference reference(model_bytes, threads);
    paired = cli::PairedSeconds(4 * reps + 1, [&] { reference.Copy(); }, apply);
  }
  // ApplyGapChanges alone, on the decoded patch.
  Result<SafetensorsFile> file = SafetensorsFile::Parse(blob, "bench delta");
  if (!file.ok()) return std::fprintf(stderr, "%s\n", file.status().ToString().c_str()), 1;
  Result<DecodedPatch> decoded = DecodePatch(std::move(*file), DecodePatchOptions{.keep_gaps_encoded = true});
  if (!decoded.ok()) return std::fprintf(stderr, "%s\n", decoded.status().ToString().c_str()), 1;
  const double scatter_s =
      cli::BestSeconds(reps, [&] { hash += ApplyGapChanges(*replica, decoded->encoded, threads, undo); });
  // The same on one thread in its CPU time: steadier on a shared machine.
  const double one_thread_cpu_s =
      cli::BestThreadSeconds(reps, [&] { hash += ApplyGapChanges(*replica, decoded->encoded, 1, undo); });
  // The floor under any apply that keeps an undo log: a bare loop over the
  // decoded positions (64-bit, decoded before timing) that only reads each
  // old value into the log and writes the new one, no gap decode, no hash,
  // split into the same 2^16-change tasks over the threads.
  const std::vector<TensorChanges> plain = DecodeGapChanges(decoded->encoded);
  struct Span {
    const TensorChanges* c;
    uint16_t* data;
    size_t begin, end, log;
  };
  std::vector<Span> spans;
  size_t logged = 0;
  for (const TensorChanges& c : plain) {
    uint16_t* data = reinterpret_cast<uint16_t*>(replica->FindMutable(c.name)->data.data());
    for (size_t b = 0; b < c.indices.size(); b += EncodedChanges::kGapChunk) {
      spans.push_back({&c, data, b, std::min(c.indices.size(), b + EncodedChanges::kGapChunk), logged + b});
    }
    logged += c.indices.size();
  }
  std::vector<uint16_t> log(logged);
  const double floor_s = cli::BestSeconds(reps, [&] {
    ParallelFor(spans.size(), threads, [&](size_t i) {
      const Span& sp = spans[i];
      const uint64_t* idx = sp.c->indices.data();
      const uint8_t* in = sp.c->values.data();
      for (size_t k = sp.begin; k < sp.end; ++k) {
        log[sp.log + k - sp.begin] = sp.data[idx[k]];
        std::memcpy(sp.data + idx[k], in + 2 * k, 2);
      }
    });
  });
  if (!failure.ok()) return std::fprintf(stderr, "%s\n", failure.ToString().c_str()), 1;

  const double gb = static_cast<double>(model_bytes) / 1e9;
  nlohmann::ordered_json out;
  out["threads"] = threads;
  out["scale"] = scale;
  out["model_bytes"] = model_bytes;
  out["changed"] = changed;
  out["changed_fraction"] = static_cast<double>(changed) / static_cast<double>(replica->total_elements());
  out["delta_bytes"] = patch->size;
  out["memcpy_gbps"] = gb / memcpy_s;
  out["apply_gbps"] = gb / apply_s;
  out["apply_vs_memcpy"] = memcpy_s / apply_s;
  out["apply_vs_memcpy_paired"] = paired.ratio_median;
  out["apply_vs_memcpy_paired_best"] = paired.ratio_best;
  out["apply_vs_memcpy_paired_cpu"] = paired.cpu_ratio_median;
  out["decode_vs_memcpy"] = memcpy_s / decode_s;
  out["apply_gap_changes_vs_memcpy"] = memcpy_s / scatter_s;
  out["scatter_floor_vs_memcpy"] = memcpy_s / floor_s;
  out["memcpy_s"] = memcpy_s;
  out["apply_s"] = apply_s;
  out["decode_s"] = decode_s;
  out["apply_gap_changes_s"] = scatter_s;
  out["scatter_floor_s"] = floor_s;
  out["apply_gap_changes_1thread_cpu_s"] = one_thread_cpu_s;
  out["hash"] = hash.Hex();  // the same across builds: the terms are bit-exact
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
