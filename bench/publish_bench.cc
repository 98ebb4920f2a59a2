// publish_bench: the trainer side alone, for profiling. The same model,
// masters and change rate as `deltasync bench` (Qwen3-0.6B shapes, ~3.4% of
// elements move by one bf16 ULP), and the same two figures:
//   detect+encode  DetectChanges (fp32 masters) + EncodeDelta (gap_delta),
//                  and the same delta by DetectAndEncodeGapDelta ("fused")
//   publish        Publisher::Publish of a compact delta into a local bucket
//                  (the fused scan), alternating with the base (untimed)
// each as a ratio to a memcpy of the bf16 model with the same threads.
//
// --rate F: the fraction of elements that change (default 0.034, the
// demo's step-10 rate; the Python publish bench's lr 3e-6 gives ~0.081).
// The scan row gives its changes, so that two rates separate the cost per
// element from the cost per change; the publish row splits its best run
// into detect+encode (scan and stream writing) and upload (objects and
// manifest, written and synced).
//
// --encoding gap_delta|raw: the publish row's Publisher encodes that instead
// (gap_delta: detected and encoded in one pass, then applied from the
// delta's bytes; raw: detected into its kept change list, then encoded).
//
// --target T: the SIMD kernels restricted to one target (AVX3, AVX3-no-raw,
// AVX2, ...; kernels::SupportedTargetNames()), to compare routes in one binary.
//
//   publish_bench [--quick] [--threads N] [--reps R] [--rate F] [--only floor|detect|stages|publish]
//                 [--encoding compact|gap_delta|raw] [--target T]
#include <cstdio>
#include <ctime>
#include <functional>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "bench_apply.h"
#include "bench_floor.h"
#include "common/parallel.h"
#include "bf16/compact_scan.h"
#include "bf16/simd_kernels.h"
#include "codec/compact_bf16.h"
#include "codec/stream_buffers.h"
#include "deltasync/changes.h"
#include "deltasync/detect_encode.h"
#include "deltasync/patch.h"
#include "deltasync/publisher.h"
#include "deltasync/weight_state.h"
#include "synthetic_model.h"
#include "timing.h"

using namespace deltasync;

namespace {

// CPU seconds of the whole process (all threads): on a loaded machine the
// work done, where wall time also counts waiting for a core.
double CpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Best wall and best CPU seconds of `reps` calls of fn (between: untimed).
struct Timing {
  double wall = 1e30, cpu = 1e30;
};
Timing Best(int reps, const std::function<void()>& fn, const std::function<void()>& between = {}) {
  Timing t;
  // Marks where setup ends, for `perf record -p` attached from outside.
  std::fprintf(stderr, "publish_bench: timing\n");
  std::fflush(stderr);
  for (int r = 0; r < reps; ++r) {
    const double c0 = CpuSeconds();
    t.wall = std::min(t.wall, cli::Seconds(fn));
    t.cpu = std::min(t.cpu, CpuSeconds() - c0);
    if (between) between();
  }
  return t;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "publish_bench: error: %s\n", what.c_str());
  std::exit(1);
}

void Check(const Status& s) {
  if (!s.ok()) Die(s.ToString());
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int threads = 2, reps = 5;
  double rate = 0.034;
  std::string only, target;
  IndexEncoding encoding = IndexEncoding::kCompact;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--quick") {
      quick = true;
    } else if (a == "--threads") {
      threads = std::atoi(next());
    } else if (a == "--reps") {
      reps = std::max(1, std::atoi(next()));
    } else if (a == "--rate") {
      rate = std::atof(next());
      if (!(rate > 0 && rate < 1)) Die("--rate needs a fraction in (0, 1)");
    } else if (a == "--only") {
      only = next();
    } else if (a == "--encoding") {
      Result<IndexEncoding> e = ParseEncoding(next());
      Check(e.status());
      encoding = *e;
    } else if (a == "--target") {
      target = next();
    } else {
      Die("unknown argument " + a +
          " (use --quick, --threads N, --reps R, --rate F, --only floor|detect|stages|publish, --encoding E, --target T)");
    }
  }
  if (!target.empty() && !kernels::UseOnlyTarget(target)) {
    std::string known;
    for (const std::string& t : kernels::SupportedTargetNames()) known += " " + t;
    Die("unknown or unsupported target " + target + " (this CPU:" + known + ")");
  }
  // As `deltasync bench`: base ~N(0, 0.02), norms 1, masters rounding to a
  // neighbour of the base for a fraction `rate` of elements.
  const cli::BenchModel model = cli::MakeBenchModel(quick ? 2 : 28, quick ? 16384 : 151936, rate);
  const std::vector<TensorView>& base_views = model.base;
  const std::vector<TensorView>& masters = model.masters;
  Result<WeightState> published = WeightState::FromViews(base_views);
  Check(published.status());
  const double gb = static_cast<double>(published->total_bytes()) / 1e9;
  Timing copy;
  {
    const uint64_t bytes = published->total_bytes();
    std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
    const uint64_t per = (bytes + threads - 1) / threads;
    copy = Best(reps, [&] {
      ParallelFor(static_cast<size_t>(threads), threads, [&](size_t t) {
        const uint64_t b = std::min(bytes, per * t), e = std::min(bytes, b + per);
        std::memcpy(dst.data() + b, src.data() + b, e - b);
      });
    });
  }
  std::printf("model %.3f GB bf16, %d threads, best of %d; memcpy %.1f GB/s (%.1f ms, %.1f ms CPU)\n", gb, threads,
              reps, gb / copy.wall, 1e3 * copy.wall, 1e3 * copy.cpu);
  auto row = [&](const char* what, const Timing& t, const char* extra) {
    std::printf("%-26s %7.1f ms %6.2f GB/s %.3fx memcpy | CPU %7.1f ms, %.3fx memcpy's CPU %s\n", what,
                1e3 * t.wall, gb / t.wall, copy.wall / t.wall, 1e3 * t.cpu, copy.cpu / t.cpu, extra);
  };

  if (only.empty() || only == "floor") {
    // What any detect or publish from the masters must read: the fp32
    // masters and the bf16 state, nothing else (timed in wall seconds only).
    Timing floor;
    const double c0 = CpuSeconds();
    floor.wall = cli::ReadFloorSeconds(masters, *published, threads, reps);
    floor.cpu = (CpuSeconds() - c0) / (reps + 1);  // reps + 1 passes (one warm-up)
    row("read floor (fp32 + bf16)", floor, "(CPU: mean of the passes)");
  }
  if (only.empty() || only == "detect") {
    PatchInfo info;
    info.model_version = 11;
    info.base_version = 10;
    info.total_elements = published->total_elements();
    Status failure;
    uint64_t bytes = 0;
    const Timing t = Best(reps, [&] {
      Result<std::vector<TensorChanges>> c = DetectChanges(*published, masters, DetectOptions{false, threads, nullptr});
      if (!c.ok()) return void(failure = c.status());
      Result<EncodedPatch> p = EncodeDelta(info, *c);
      if (!p.ok()) return void(failure = p.status());
      bytes = p->size;
    });
    Check(failure);
    row("detect+encode (gap_delta)", t, ("(" + std::to_string(bytes) + " bytes; fresh results)").c_str());
    // As a training loop calls them: into the last call's changes and patch.
    std::vector<TensorChanges> changes;
    EncodedPatch patch;
    const Timing reused = Best(reps, [&] {
      if (failure.ok()) failure = DetectChanges(*published, masters, DetectOptions{false, threads, nullptr}, changes);
      if (failure.ok()) failure = EncodeDelta(info, changes, patch);
    });
    Check(failure);
    row("detect+encode, reused", reused, ("(" + std::to_string(patch.size) + " bytes; into the last call's)").c_str());
    // Its two calls apart: the detect (the compare kernel, then the copy of
    // each chunk's changes into `changes`) and the gap_delta encode.
    const Timing detect_only = Best(reps, [&] {
      if (failure.ok()) failure = DetectChanges(*published, masters, DetectOptions{false, threads, nullptr}, changes);
    });
    const Timing encode_only = Best(reps, [&] {
      if (failure.ok()) failure = EncodeDelta(info, changes, patch);
    });
    Check(failure);
    row("  of which detect", detect_only, "(DetectChanges into the last call's)");
    row("  of which encode", encode_only, "(EncodeDelta into the last call's)");
    // The same delta in one call (DetectAndEncodeGapDelta), into the last
    // call's buffers: the chunks write the gap and value streams as they scan.
    DetectedGapDelta fused;
    const Timing fused_t = Best(reps, [&] {
      if (failure.ok()) {
        failure = DetectAndEncodeGapDelta(*published, masters, DetectOptions{false, threads, nullptr}, info, fused);
      }
    });
    Check(failure);
    row("detect+encode, fused", fused_t,
        ("(" + std::to_string(fused.patch.size) + " bytes; DetectAndEncodeGapDelta into the last call's)").c_str());
    // The two routes in turns (reused, fused, reused, ...): their ratio from
    // rounds that saw the same host.
    const int rounds = 4 * reps + 1;
    const cli::PairedTimes turns = cli::PairedSeconds(
        rounds,
        [&] {
          if (failure.ok()) failure = DetectChanges(*published, masters, DetectOptions{false, threads, nullptr}, changes);
          if (failure.ok()) failure = EncodeDelta(info, changes, patch);
        },
        [&] {
          if (failure.ok()) {
            failure = DetectAndEncodeGapDelta(*published, masters, DetectOptions{false, threads, nullptr}, info, fused);
          }
        });
    Check(failure);
    std::printf("fused in turns with reused, %d rounds: reused / fused = %.3f wall (median), %.3f best against best, "
                "%.3f process CPU (median)\n",
                rounds, turns.ratio_median, turns.ratio_best, turns.cpu_ratio_median);
  }
  if (only.empty() || only == "stages") {
    // The fused publish's two stages alone: the scan (detect, code, hash,
    // apply) and the stream writing; the scan is undone after each.
    bf16::CompactScan scan;
    PatchInfo info;
    info.kind = PatchKind::kDelta;
    info.model_version = 11;
    info.base_version = 10;
    const DetectOptions detect{false, threads, nullptr};
    const Timing run = Best(reps, [&] { Check(scan.Run(*published, masters, detect)); }, [&] { scan.Undo(threads); });
    Check(scan.Run(*published, masters, detect));
    const uint64_t changes = scan.bf16_changed();
    // As a Publisher writes them: into the last delta's buffers, given back
    // once written (codec/stream_buffers.h).
    compact::StreamBuffers buffers;
    const Timing write = Best(reps, [&] {
      Result<EncodedPatch> p = EncodeScannedCompactDelta(info, StateHash{}, *published, scan, {}, threads,
                                                         kCompactStreamAuto, kDefaultCompactContainer, &buffers);
      Check(p.status());
      buffers.Give(std::move(p->owned), p->size);
    });
    scan.Undo(threads);
    const double elements = static_cast<double>(published->total_elements());
    char scan_extra[160];
    std::snprintf(scan_extra, sizeof scan_extra, "(%llu changes, %.2f%%; CPU %.2f ns per element)",
                  static_cast<unsigned long long>(changes), 100.0 * static_cast<double>(changes) / elements,
                  1e9 * run.cpu / elements);
    row("  scan", run, scan_extra);
    row("  write streams", write, "");
  }
  if (only.empty() || only == "publish") {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("deltasync-publish-bench-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    Result<std::shared_ptr<Store>> store = OpenStore(dir.string());
    Check(store.status());
    PublisherOptions popts;
    popts.anchor_interval = 1u << 30;
    popts.threads = threads;
    popts.encoding = encoding;
    Result<std::unique_ptr<Publisher>> pub = Publisher::Open(*store, popts);
    Check(pub.status());
    Check((*pub)->Publish(1, base_views).status());
    uint64_t version = 1;
    Status failure;
    uint64_t bytes = 0;
    double best_wall = 1e30, detect_ms = 0, upload_ms = 0;
    const Timing t = Best(
        reps,
        [&] {
          Result<PublishStats> st = Status::Internal("not run");
          const double wall = cli::Seconds([&] { st = (*pub)->Publish(++version, masters); });
          if (!st.ok()) return void(failure = st.status());
          bytes = st->delta_bytes;
          if (wall < best_wall) {
            best_wall = wall;
            detect_ms = st->detect_encode_ms;
            upload_ms = st->upload_ms;
          }
        },
        [&] {
          if (failure.ok()) failure = (*pub)->Publish(++version, base_views).status();
        });
    std::filesystem::remove_all(dir);
    Check(failure);
    char publish_extra[160];
    std::snprintf(publish_extra, sizeof publish_extra, "(%llu bytes; best run: detect+encode %.1f ms, upload %.1f ms)",
                  static_cast<unsigned long long>(bytes), detect_ms, upload_ms);
    row(encoding == IndexEncoding::kCompact ? "publish (compact, fused)"
        : encoding == IndexEncoding::kGapDelta ? "publish (gap_delta)" : "publish (raw)",
        t, publish_extra);
  }
  return 0;
}
