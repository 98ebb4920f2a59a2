// bench: detect+encode and apply throughput on a Qwen3-0.6B-sized model at
// the demo's step-10 change rate, as ratios to memcpy of the model measured
// in the same run with the same thread count; then the codecs (bytes per
// changed element of every encoding next to the order-0 entropy, anchor
// ratio next to its ceiling) on the demo's simulated steps. Figures, never
// pass/fail.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include <unistd.h>

#include "commands.h"
#include "deltasync/changes.h"
#include "deltasync/detect_encode.h"
#include "deltasync/patch.h"
#include "deltasync/publisher.h"
#include "deltasync/safetensors.h"
#include "deltasync/simd_route.h"
#include "deltasync/state_hash.h"
#include "deltasync/weight_state.h"
#include "bench_apply.h"
#include "bench_decode_floor.h"
#include "bench_floor.h"
#include "codec_stats.h"
#include "synthetic_model.h"
#include "timing.h"

namespace deltasync::cli {
namespace {

// The demo model's change rate at step 10 (measured with `deltasync demo`).
constexpr double kChangedFraction = 0.034;

// The floor's keys into `out` (bench_decode_floor.h; docs/benchmarks.md,
// "What bounds the compact decode and apply"): each stage in ns per change
// and s per GB of model, decode_floor_gbps_per_core, apply_floor_vs_memcpy
// (against `memcpy_s`, same threads), and the library's decode (1 thread)
// and the measured apply (`apply_s`) as fractions of them.
void AddDecodeFloorJson(const DecodeFloorFigures& f, double memcpy_s, double apply_s, nlohmann::ordered_json& out) {
  const double gb = static_cast<double>(f.model_bytes) / 1e9;
  const double per_change = 1e9 / static_cast<double>(std::max<uint64_t>(1, f.changed));
  out["floor_blocks_with_change"] = f.blocks_with_change;
  out["floor_words_with_change"] = f.words_with_change;
  out["floor_read_bytes"] = f.read_bytes;
  for (const auto& [name, s] :
       {std::pair{"read", f.read_s}, std::pair{"read_threads", f.read_threads_s}, std::pair{"parse", f.parse_s},
        std::pair{"output", f.output_s}, std::pair{"hash", f.hash_s}, std::pair{"hash_streamed", f.hash_streamed_s},
        std::pair{"scatter", f.scatter_s},
        std::pair{"read_scatter", f.read_scatter_s}, std::pair{"read_scatter_threads", f.read_scatter_threads_s},
        std::pair{"digest", f.digest_s}, std::pair{"decode_library", f.decode_s}}) {
    const std::string k = name;
    out["floor_" + k + "_ns_per_change"] = s * per_change;
    out["floor_" + k + "_s_per_gb"] = s / gb;
  }
  out["floor_read_gbps"] = static_cast<double>(f.read_bytes) / 1e9 / f.read_s;
  out["floor_read_threads_gbps"] = static_cast<double>(f.read_bytes) / 1e9 / f.read_threads_s;
  out["decode_floor_gbps_per_core"] = gb / f.DecodeSeconds();
  out["decode_compact_cpu_gbps_per_core"] = gb / f.decode_s;
  out["decode_compact_vs_floor"] = f.DecodeSeconds() / f.decode_s;
  out["apply_floor_gbps"] = gb / f.ApplySeconds();
  out["apply_floor_vs_memcpy"] = memcpy_s / f.ApplySeconds();
  out["apply_compact_vs_floor"] = f.ApplySeconds() / apply_s;
}

}  // namespace

Status RunBench(const BenchArgs& args) {
  if (args.sweep) {
    SweepArgs sweep{args.scales, args.rates, args.threads, args.quick ? 2 : 3};
    DS_ASSIGN_OR_RETURN(std::vector<CompactApplyFigures> rows, RunSweep(sweep));
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    size_t i = 0;
    for (double scale : args.scales) {
      for (double rate : args.rates) {
        const CompactApplyFigures& f = rows[i++];
        const double gb = static_cast<double>(f.model_bytes) / 1e9;
        out.push_back({{"scale", scale}, {"rate", rate}, {"threads", args.threads}, {"model_bytes", f.model_bytes},
                       {"changed", f.changed}, {"delta_bytes", f.delta_bytes}, {"apply_compact_s", f.apply_s},
                       {"apply_compact_gbps", gb / f.apply_s}, {"apply_compact_vs_memcpy", f.memcpy_s / f.apply_s},
                       {"decode_compact_s", f.decode_s}, {"decode_compact_gbps_per_core", gb / f.decode_1thread_s},
                       {"memcpy_gbps", gb / f.memcpy_s}, {"simd_target", SimdRouteName()}});
        AddDecodeFloorJson(f.floor, f.memcpy_s, f.apply_s, out.back());
      }
    }
    std::printf("%s\n", out.dump().c_str());
    return Status::OK();
  }
  const int layers = args.quick ? 2 : 28;
  const uint64_t vocab = args.quick ? 16384 : 151936;
  const int threads = args.threads;
  // Published bf16 state ~N(0, 0.02), and the trainer's fp32 masters whose
  // rounding moves ~3.4% of elements by +-1 bf16 ULP (as AdamW at lr 3e-6 does).
  const BenchModel model = MakeBenchModel(layers, vocab, kChangedFraction);
  const std::vector<TensorView>& base_views = model.base;
  const std::vector<TensorView>& masters = model.masters;
  DS_ASSIGN_OR_RETURN(WeightState published, WeightState::FromViews(base_views));
  const double model_bytes = static_cast<double>(published.total_bytes());
  const int reps = args.quick ? 3 : 5;

  // memcpy of a buffer of the model's size, same threads.
  const double memcpy_s = MemcpySeconds(published.total_bytes(), threads, reps);

  // Trainer: detect (fp32 masters -> bf16, compare) + gap_delta encode, as a
  // training loop calls it: DetectAndEncodeGapDelta, the chunks writing the
  // patch's gap and value streams as they scan, into the last call's buffers
  // (detect_encode_*; before session 34 these keys timed the two calls below).
  DetectOptions detect{false, threads, nullptr};
  PatchInfo info;
  info.model_version = 11;
  info.base_version = 10;
  info.total_elements = published.total_elements();
  Status failure;
  DetectedGapDelta fused;
  const auto detect_encode = [&] {
    if (!failure.ok()) return;
    failure = DetectAndEncodeGapDelta(published, masters, detect, info, fused);
  };
  // The same delta by the two public calls, into the last call's changes and
  // patch (DetectChanges / EncodeDelta into `out`): detect_encode_separate_*.
  std::vector<TensorChanges> changes;
  EncodedPatch patch;
  const auto detect_encode_separate = [&] {
    if (!failure.ok()) return;
    failure = DetectChanges(published, masters, detect, changes);
    if (failure.ok()) failure = EncodeDelta(info, changes, patch);
  };
  double detect_s = BestSeconds(reps, detect_encode);
  double separate_s = BestSeconds(reps, detect_encode_separate);
  DS_RETURN_IF_ERROR(failure);
  const auto concat = [](const EncodedPatch& p) {
    std::vector<uint8_t> bytes;
    bytes.reserve(p.size);
    for (ByteSpan part : p.parts) bytes.insert(bytes.end(), part.begin(), part.end());
    return bytes;
  };
  if (concat(fused.patch) != concat(patch)) {
    return Status::Internal("bench: the fused and the separate detect+encode wrote different bytes");
  }
  // The same with fresh results every call (the Result-returning calls):
  // their output pages are mapped, faulted, zero-filled and unmapped each time.
  uint64_t fresh_bytes = 0;
  double detect_fresh_s = BestSeconds(reps, [&] {
    Result<std::vector<TensorChanges>> c = DetectChanges(published, masters, detect);
    if (!c.ok()) return void(failure = c.status());
    Result<EncodedPatch> p = EncodeDelta(info, *c);
    if (!p.ok()) return void(failure = p.status());
    fresh_bytes = p->size;
  });
  DS_RETURN_IF_ERROR(failure);
  if (fresh_bytes != patch.size) return Status::Internal("bench: the reused and fresh detect+encode differ in size");
  uint64_t changed = 0;
  for (const TensorChanges& c : changes) changed += c.count();

  // Replica: parse + decode + validate + state-hash update + scatter, from the
  // patch bytes in memory (no disk), applied to a copy of the state, as
  // Replica does: straight from the encoded gaps, keeping an undo log.
  Blob blob = Blob::FromVector(concat(patch));
  DS_ASSIGN_OR_RETURN(WeightState replica, WeightState::FromViews(base_views));
  StateHash hash;
  std::vector<uint8_t> undo;
  const auto apply = [&] {
    Result<SafetensorsFile> file = SafetensorsFile::Parse(blob, "bench delta");
    if (!file.ok()) return void(failure = file.status());
    Result<DecodedPatch> decoded = DecodePatch(std::move(*file), DecodePatchOptions{.keep_gaps_encoded = true});
    if (!decoded.ok()) return void(failure = decoded.status());
    Status valid = ValidateEncodedChanges(replica, decoded->encoded);
    if (!valid.ok()) return void(failure = valid);
    hash += ApplyGapChanges(replica, decoded->encoded, threads, undo);
  };
  double apply_s = BestSeconds(reps, apply);
  DS_RETURN_IF_ERROR(failure);

  // The same two stages timed in turns with memcpy of the model (memcpy,
  // stage, memcpy, stage, ...): ratios from rounds that saw the same host,
  // where the ratios above divide times taken minutes apart. The reference's
  // buffers are freed before the compact apply.
  const int rounds = 4 * reps + 1;
  PairedTimes detect_pair, separate_pair, apply_pair;
  {
    MemcpyReference reference(published.total_bytes(), threads);
    const auto copy = [&] { reference.Copy(); };
    detect_pair = PairedSeconds(rounds, copy, detect_encode);
    separate_pair = PairedSeconds(rounds, copy, detect_encode_separate);
    apply_pair = PairedSeconds(rounds, copy, apply);
  }
  // The two detect+encode routes timed in turns with each other (separate,
  // fused, ...): the median of separate / fused is the fused call's speedup.
  const PairedTimes fused_pair = PairedSeconds(rounds, detect_encode_separate, detect_encode);
  DS_RETURN_IF_ERROR(failure);

  // Replica: the whole apply of the same changes as a compact delta.
  DS_ASSIGN_OR_RETURN(CompactApplyFigures compact_apply, MeasureCompactApply(published, changes, threads, reps));

  // Publishing a compact delta from the fp32 masters into a local bucket:
  // Publisher::Publish (one fused pass: detect, code, hash and apply per
  // chunk) against the unfused route the same Publisher takes for changes
  // found elsewhere (DetectChanges, then PublishChanges: encode, hash,
  // apply). Versions alternate between the masters (timed) and the base
  // (untimed), so each timed version changes the same elements.
  // The same Publisher with gap_delta (TRL's encoding): detect and encode in
  // one pass, then apply the delta's own bytes (sync/gap_delta_publish.h).
  const std::filesystem::path bucket_dir =
      std::filesystem::temp_directory_path() / ("deltasync-bench-" + std::to_string(::getpid()));
  double fused_s = 0, unfused_s = 0, gap_publish_s = 0;
  for (IndexEncoding encoding : {IndexEncoding::kCompact, IndexEncoding::kGapDelta}) {
    std::filesystem::remove_all(bucket_dir);
    DS_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(bucket_dir.string()));
    PublisherOptions popts;
    popts.anchor_interval = 1u << 30;
    popts.threads = threads;
    popts.encoding = encoding;
    DS_ASSIGN_OR_RETURN(std::unique_ptr<Publisher> pub, Publisher::Open(store, popts));
    DS_RETURN_IF_ERROR(pub->Publish(1, base_views).status());
    uint64_t version = 1;
    auto back = [&] {
      if (failure.ok()) failure = pub->Publish(++version, base_views).status();
    };
    const double publish_s = BestSeconds(reps, [&] {
      if (failure.ok()) failure = pub->Publish(++version, masters).status();
    }, back);
    if (encoding == IndexEncoding::kGapDelta) {
      gap_publish_s = publish_s;
      continue;
    }
    fused_s = publish_s;
    unfused_s = BestSeconds(reps, [&] {
      Result<std::vector<TensorChanges>> c = DetectChanges(pub->state(), masters, detect);
      if (!c.ok()) return void(failure = c.status());
      if (failure.ok()) failure = pub->PublishChanges(++version, *c).status();
    }, back);
  }
  std::filesystem::remove_all(bucket_dir);
  DS_RETURN_IF_ERROR(failure);

  // The floor of both trainer-side figures: a bare read of the fp32 masters
  // and the published bf16 state (6 bytes per element, against memcpy's 2
  // read and 2 written), same threads.
  const double floor_s = ReadFloorSeconds(masters, published, threads, reps);

  const double gb = model_bytes / 1e9;
  nlohmann::ordered_json out;
  out["model"] = args.quick ? "qwen3-0.6b-shapes, 2 layers, 16k vocab (--quick)" : "qwen3-0.6b-shapes";
  out["threads"] = threads;
  out["simd_target"] = SimdRouteName();
  out["model_bytes"] = published.total_bytes();
  out["changed_fraction"] = static_cast<double>(changed) / static_cast<double>(published.total_elements());
  out["detect_encode_gbps"] = gb / detect_s;
  out["apply_gbps"] = gb / apply_s;
  out["memcpy_gbps"] = gb / memcpy_s;
  out["detect_encode_vs_memcpy"] = memcpy_s / detect_s;
  out["detect_encode_separate_gbps"] = gb / separate_s;
  out["detect_encode_separate_vs_memcpy"] = memcpy_s / separate_s;
  out["detect_encode_fresh_gbps"] = gb / detect_fresh_s;
  out["detect_encode_fresh_vs_memcpy"] = memcpy_s / detect_fresh_s;
  out["apply_vs_memcpy"] = memcpy_s / apply_s;
  out["paired_rounds"] = rounds;
  out["memcpy_paired_gbps"] = gb / std::min(detect_pair.ref_best, apply_pair.ref_best);
  for (const auto& [stage, pair] : {std::pair{"detect_encode", &detect_pair},
                                     std::pair{"detect_encode_separate", &separate_pair},
                                     std::pair{"apply", &apply_pair}}) {
    const std::string k = std::string(stage) + "_vs_memcpy_paired";
    out[k] = pair->ratio_median;
    out[k + "_best"] = pair->ratio_best;
    out[k + "_cpu"] = pair->cpu_ratio_median;
  }
  out["detect_encode_fused_speedup_paired"] = fused_pair.ratio_median;
  out["detect_encode_fused_speedup_paired_cpu"] = fused_pair.cpu_ratio_median;
  out["apply_compact_gbps"] = gb / compact_apply.apply_s;
  out["apply_compact_vs_memcpy"] = memcpy_s / compact_apply.apply_s;
  out["decode_compact_gbps"] = gb / compact_apply.decode_s;
  out["decode_compact_gbps_per_core"] = gb / compact_apply.decode_1thread_s;
  out["compact_delta_bytes"] = compact_apply.delta_bytes;
  AddDecodeFloorJson(compact_apply.floor, memcpy_s, compact_apply.apply_s, out);
  out["publish_compact_gbps"] = gb / fused_s;
  out["publish_compact_vs_memcpy"] = memcpy_s / fused_s;
  out["publish_read_floor_gbps"] = gb / floor_s;
  out["publish_read_floor_vs_memcpy"] = memcpy_s / floor_s;
  out["publish_compact_vs_floor"] = floor_s / fused_s;
  out["detect_encode_vs_floor"] = floor_s / detect_s;
  out["publish_gap_delta_gbps"] = gb / gap_publish_s;
  out["publish_gap_delta_vs_memcpy"] = memcpy_s / gap_publish_s;
  out["publish_compact_unfused_gbps"] = gb / unfused_s;
  out["publish_fused_speedup"] = unfused_s / fused_s;
  out["bytes_per_changed_element"] = static_cast<double>(patch.size) / static_cast<double>(changed);
  out["delta_bytes"] = patch.size;

  // Codecs on the demo's own simulated steps (SyntheticTrainer, AdamW lr
  // 3e-6): the delta from step 9 to step 10 and the anchor of step 9.
  SyntheticModelOptions sim;
  sim.layers = layers;
  sim.vocab = vocab;
  sim.threads = threads;
  const int sim_steps = 10;
  SyntheticTrainer trainer(sim);
  for (int s = 1; s < sim_steps; ++s) trainer.Step();
  DS_ASSIGN_OR_RETURN(WeightState sim_base, ToPublishedState(trainer.MasterViews()));
  trainer.Step();
  DS_ASSIGN_OR_RETURN(std::vector<TensorChanges> sim_changes, DetectChanges(sim_base, trainer.MasterViews()));
  DS_ASSIGN_OR_RETURN(DeltaFigures codecs, MeasureDeltaCodecs(sim_base, sim_changes, sim_steps, reps));
  DS_ASSIGN_OR_RETURN(AnchorFigures anchor, MeasureAnchorCodec(sim_base, sim_steps, reps));
  out["codec_changed_fraction"] = static_cast<double>(codecs.changed) / static_cast<double>(sim_base.total_elements());
  out["raw_bytes_per_changed"] = codecs.raw;
  out["gap_delta_bytes_per_changed"] = codecs.gap_delta;
  out["gap_delta_zstd_bytes_per_changed"] = codecs.gap_delta_zstd;
  out["compact_bytes_per_changed"] = codecs.compact;
  out["entropy_bytes_per_changed"] = codecs.entropy;
  out["context_entropy_bytes_per_changed"] = codecs.context_entropy;
  out["compact_vs_entropy"] = codecs.compact / codecs.entropy;
  out["compact_encode_gbps_1thread"] = codecs.encode_gbps_1t;
  out["compact_decode_gbps_1thread"] = codecs.decode_gbps_1t;
  out["compact_stream_version"] = 3;  // kCompactStreamAuto on a delta this size
  for (const auto& [key, v] : {std::pair{"v2", codecs.v2}, std::pair{"v3", codecs.v3}}) {
    const std::string k = key;
    out["compact_" + k + "_bytes_per_changed"] = v.bytes_per_changed;
    out["compact_" + k + "_vs_entropy"] = v.bytes_per_changed / codecs.entropy;
    out["compact_" + k + "_decode_gbps_1thread"] = v.decode_gbps_1t;
    out["compact_" + k + "_encode_gbps_1thread"] = v.encode_gbps_1t;
  }
  out["anchor_compression_ratio"] = anchor.ratio;
  out["anchor_ceiling_ratio"] = anchor.ceiling;
  out["anchor_vs_ceiling"] = anchor.ratio / anchor.ceiling;
  out["anchor_decode_gbps_1thread"] = anchor.decode_gbps_1t;
  out["anchor_bit_exact"] = anchor.exact;
  if (!anchor.exact) return Status::Internal("the compressed anchor did not decode bit-exactly");

  if (!args.json) {
    std::printf("model: %s, %.1f MB bf16, %d threads, %.3f%% changed\n", out["model"].get<std::string>().c_str(),
                model_bytes / 1e6, threads, 100.0 * out["changed_fraction"].get<double>());
    std::printf("memcpy of the model:        %7.2f GB/s (baseline)\n", gb / memcpy_s);
    std::printf("detect+encode (fp32 in):    %7.2f GB/s = %.2f x memcpy (one fused call into the last call's buffers; "
                "DetectChanges + EncodeDelta into the last call's: %.2f GB/s = %.2f x memcpy, fresh results every "
                "call: %.2f GB/s = %.2f x memcpy; fused / separate timed in turns: %.2f x)\n",
                gb / detect_s, memcpy_s / detect_s, gb / separate_s, memcpy_s / separate_s, gb / detect_fresh_s,
                memcpy_s / detect_fresh_s, fused_pair.ratio_median);
    std::printf("apply (decode+verify+scatter): %4.2f GB/s = %.2f x memcpy\n", gb / apply_s, memcpy_s / apply_s);
    std::printf("timed in turns with memcpy, %d rounds (median of the rounds' ratios; best against best): "
                "detect+encode %.2f (%.2f) x memcpy, apply %.2f (%.2f) x memcpy; in process CPU time: "
                "detect+encode %.2f, apply %.2f x memcpy\n",
                rounds, detect_pair.ratio_median, detect_pair.ratio_best, apply_pair.ratio_median,
                apply_pair.ratio_best, detect_pair.cpu_ratio_median, apply_pair.cpu_ratio_median);
    std::printf("apply compact (digest, decode, hash check, scatter): %.2f GB/s = %.2f x memcpy; decode alone %.2f GB/s "
                "(%d threads), %.2f GB/s per core (1 thread)\n",
                gb / compact_apply.apply_s, memcpy_s / compact_apply.apply_s, gb / compact_apply.decode_s, threads,
                gb / compact_apply.decode_1thread_s);
    PrintDecodeFloor(compact_apply.floor, memcpy_s, compact_apply.apply_s);
    std::printf("publish compact (fp32 in, fused pass, local bucket): %.2f GB/s = %.2f x memcpy; "
                "%.2f x the unfused detect, encode, hash, apply (%.2f GB/s)\n",
                gb / fused_s, memcpy_s / fused_s, unfused_s / fused_s, gb / unfused_s);
    std::printf("publish gap_delta (fp32 in, detect and apply in one pass, local bucket): %.2f GB/s = %.2f x memcpy\n",
                gb / gap_publish_s, memcpy_s / gap_publish_s);
    std::printf("read floor (fp32 masters + bf16 state read, nothing else): %.2f GB/s = %.2f x memcpy; publish "
                "compact = %.2f x the floor, detect+encode = %.2f x the floor\n",
                gb / floor_s, memcpy_s / floor_s, floor_s / fused_s, floor_s / detect_s);
    std::printf("gap_delta patch: %.2f MB, %.3f bytes per changed element\n", patch.size / 1e6,
                out["bytes_per_changed_element"].get<double>());
    std::printf("codecs on the demo's simulated step %d (%.3f%% changed), bytes per changed element:\n", sim_steps,
                100.0 * out["codec_changed_fraction"].get<double>());
    std::printf("  raw %.3f, gap_delta %.3f, gap_delta+zstd %.3f, compact %.3f\n", codecs.raw, codecs.gap_delta,
                codecs.gap_delta_zstd, codecs.compact);
    std::printf("  order-0 entropy %.3f (compact = %.3f x entropy), base-exponent context entropy %.3f\n",
                codecs.entropy, codecs.compact / codecs.entropy, codecs.context_entropy);
    for (const auto& [key, v] : {std::pair{"v2", codecs.v2}, std::pair{"v3", codecs.v3}}) {
      std::printf("  compact stream %s: %.3f B per changed (%.3f x entropy), encode %.2f GB/s, decode %.2f GB/s of "
                  "model bytes (1 thread)\n",
                  key, v.bytes_per_changed, v.bytes_per_changed / codecs.entropy, v.encode_gbps_1t, v.decode_gbps_1t);
    }
    std::printf("compressed anchor: ratio %.4f vs order-0 ceiling %.4f = %.3f of ceiling, decode %.2f GB/s (1 "
                "thread), bit-exact\n",
                anchor.ratio, anchor.ceiling, anchor.ratio / anchor.ceiling, anchor.decode_gbps_1t);
  }
  std::printf("%s\n", out.dump().c_str());
  return Status::OK();
}

}  // namespace deltasync::cli
