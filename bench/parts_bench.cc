// Parted publishing (docs/format.md, "Parts") against one process: a
// Qwen3-0.6B-shaped synthetic trainer (tools/deltasync/synthetic_model.h),
// every tensor split FSDP2-style by rows (Shard(0)) into P parts. Each part
// runs its PartPublisher on its own thread with `cores / P` worker threads
// (the code a rank runs; ranks are threads here, so no network is measured),
// then one PartCommitter commits. Compared, in the same run, with the
// gather-to-one-rank route: one Publisher with every core publishing the full
// tensors (the all-gather itself not counted). Prints figures, never pass/fail.
// --keep 1 leaves the last parted bucket in DIR/parted; --follow BUCKET runs
// only a Replica (--cores threads) over an existing bucket, one version at a
// time, and prints its apply time per delta version (its peak RSS is then the
// replica's: run it under /usr/bin/time -v).
//
//   parts_bench [--layers 2] [--steps 6] [--vocab 151936] [--cores N] [--parts 1,2,4] [--dir /tmp/x] [--keep 1]
//   parts_bench --follow /tmp/x/parted [--cores N]
//   parts_bench --restart /tmp/x/parted --restart-parts 4 --restart-part 0 [--layers/--vocab as published]
// (--restart: a PartPublisher joining the bucket as part q of a row layout of
// P parts: the time its Open takes; its peak RSS is the process's.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "deltasync/block.h"
#include "deltasync/part_publisher.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/store.h"
#include "synthetic_model.h"

namespace {

using namespace deltasync;
using Clock = std::chrono::steady_clock;

double Ms(Clock::time_point a) { return std::chrono::duration<double, std::milli>(Clock::now() - a).count(); }

PartLayout RowLayout(const std::vector<TensorView>& views, size_t parts) {
  std::vector<TensorView> sorted = views;
  std::sort(sorted.begin(), sorted.end(), [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  PartLayout l;
  l.parts.resize(parts);
  for (uint32_t t = 0; t < sorted.size(); ++t) {
    const TensorView& v = sorted[t];
    l.tensors.push_back({v.name, DType::kBF16, v.shape});
    const uint64_t n = v.shape[0], chunk = (n + parts - 1) / parts;
    for (size_t p = 0; p < parts; ++p) {
      const uint64_t begin = std::min(n, p * chunk), end = std::min(n, begin + chunk);
      if (begin == end) continue;
      Block b{t, std::vector<uint64_t>(v.shape.size(), 0), v.shape};
      b.offset[0] = begin;
      b.shape[0] = end - begin;
      l.parts[p].push_back(std::move(b));
    }
  }
  return l;
}

// Part p's blocks of the fp32 masters: row ranges, so views into them.
std::vector<TensorView> BlockViews(const PartLayout& l, size_t p, const std::vector<TensorView>& masters) {
  std::vector<TensorView> out;
  for (const Block& b : l.parts[p]) {
    const TensorDesc& d = l.tensors[b.tensor];
    for (const TensorView& m : masters) {
      if (m.name != d.name) continue;
      const BlockGeometry g = l.Geometry(b);
      out.push_back({d.name, m.dtype, b.shape, m.data.subspan(g.RunStart(0) * 4, g.elements() * 4)});
    }
  }
  return out;
}

// The process's peak RSS in MB (VmHWM); `reset` first sets it to the current RSS.
double PeakRssMb(bool reset = false) {
  if (reset) std::ofstream("/proc/self/clear_refs") << "5";
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024;
  }
  return 0;
}

// A replica over `bucket`, one version at a time: its apply time per delta
// version, and its peak RSS while it applies them (after the first anchor).
int Follow(const std::string& bucket, int cores) {
  auto store = OpenStore(bucket);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  auto replica = Replica::Create(std::shared_ptr<Store>(std::move(*store)), ReplicaWithThreads(cores));
  auto first = replica->Update(1);
  if (!first.ok()) {
    std::fprintf(stderr, "%s\n", first.status().ToString().c_str());
    return 1;
  }
  const double after_anchor = PeakRssMb();
  PeakRssMb(/*reset=*/true);
  double apply = 0, download = 0;
  int deltas = 0;
  for (uint64_t v = 2;; ++v) {
    auto st = replica->Update(v);
    if (!st.ok()) {
      if (st.status().code() == ErrorCode::kNotFound) break;
      std::fprintf(stderr, "%s\n", st.status().ToString().c_str());
      return 1;
    }
    apply += st->apply_ms;
    download += st->download_ms;
    deltas += static_cast<int>(st->deltas_applied);
  }
  std::printf("replica (%d threads): %d delta versions, apply %.1f ms per version (fetch %.1f ms), %.1f M elements\n",
              cores, deltas, apply / std::max(1, deltas), download / std::max(1, deltas),
              replica->state().total_elements() / 1e6);
  std::printf("peak RSS: %.0f MB through the anchor, %.0f MB while applying the deltas\n", after_anchor,
              PeakRssMb());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 2, steps = 6;
  uint64_t vocab = 151936;
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<size_t> part_counts = {1, 2, 4};
  std::string dir = (std::filesystem::temp_directory_path() / "deltasync-parts-bench").string();
  std::string follow, restart;
  size_t restart_parts = 4, restart_part = 0;
  bool keep = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--follow") follow = argv[i + 1];
    else if (a == "--restart") restart = argv[i + 1];
    else if (a == "--restart-parts") restart_parts = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--restart-part") restart_part = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--keep") keep = std::atoi(argv[i + 1]) != 0;
    else
    if (a == "--layers") layers = std::atoi(argv[i + 1]);
    else if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--vocab") vocab = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--cores") cores = std::atoi(argv[i + 1]);
    else if (a == "--dir") dir = argv[i + 1];
    else if (a == "--parts") {
      part_counts.clear();
      for (char* s = argv[i + 1]; *s;) {
        part_counts.push_back(std::strtoull(s, &s, 10));
        if (*s == ',') ++s;
      }
    }
  }
  if (!follow.empty()) return Follow(follow, cores);
  cli::SyntheticModelOptions model;
  model.layers = layers;
  model.vocab = vocab;
  if (!restart.empty()) {
    PartLayout layout;
    {
      cli::SyntheticTrainer trainer(model);  // only for the tensors' names and shapes
      layout = RowLayout(trainer.MasterViews(), restart_parts);
    }
    PublisherOptions o;
    o.threads = cores;
    o.anchor_interval = 100;
    const double before = PeakRssMb(/*reset=*/true);
    auto t0 = Clock::now();
    auto pub = PartPublisher::Open(std::shared_ptr<Store>(std::move(*OpenStore(restart))), layout,
                                   static_cast<uint32_t>(restart_part), o);
    if (!pub.ok()) {
      std::fprintf(stderr, "%s\n", pub.status().ToString().c_str());
      return 1;
    }
    std::printf("restart as part %zu of %zu: %.1f ms, %.1f M of %.1f M elements held after; peak RSS %.0f MB over %.0f MB before\n",
                restart_part, restart_parts, Ms(t0), (*pub)->state().total_elements() / 1e6,
                layout.total_elements() / 1e6, PeakRssMb(), before);
    return 0;
  }
  std::printf("model: %d layers, vocab %llu; %d steps, anchor every 100 (deltas only after the first); %d cores\n",
              layers, static_cast<unsigned long long>(vocab), steps, cores);
  std::printf("%-22s %8s %14s %14s %12s %12s %14s\n", "route", "threads", "publish ms", "ms/rank max", "MB written",
              "commit ms", "receipt B/rank");

  // The gather-to-one-rank route: one Publisher, every core.
  {
    cli::SyntheticTrainer trainer(model);
    std::filesystem::remove_all(dir);
    auto store = OpenStore(dir + "/single");
    PublisherOptions o;
    o.threads = cores;
    o.anchor_interval = 100;
    auto pub = std::move(Publisher::Open(std::move(*store), o)).value();
    double total = 0;
    uint64_t bytes = 0;
    for (int s = 1; s <= steps; ++s) {
      trainer.Step();
      auto t0 = Clock::now();
      auto st = pub->Publish(s, trainer.MasterViews());
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.status().ToString().c_str());
        return 1;
      }
      if (s > 1) total += Ms(t0), bytes += st->delta_bytes;
    }
    std::printf("%-22s %8d %14.1f %14s %12.2f %12s %14s\n", "one process (P=1)", cores, total / (steps - 1), "-",
                bytes / 1e6 / (steps - 1), "-", "-");
  }
  for (size_t parts : part_counts) {
    cli::SyntheticTrainer trainer(model);
    std::filesystem::remove_all(dir + "/parted");
    auto store = std::shared_ptr<Store>(std::move(*OpenStore(dir + "/parted")));
    const std::vector<TensorView> views = trainer.MasterViews();
    PartLayout layout = RowLayout(views, parts);
    const int threads = std::max(1, cores / static_cast<int>(parts));
    PublisherOptions o;
    o.threads = threads;
    o.anchor_interval = 100;
    std::vector<std::unique_ptr<PartPublisher>> pubs;
    for (size_t p = 0; p < parts; ++p) pubs.push_back(std::move(PartPublisher::Open(store, layout, p, o)).value());
    auto committer = std::move(PartCommitter::Open(store, layout, o)).value();
    double wall = 0, slowest = 0, commit = 0, receipt_bytes = 0;
    uint64_t bytes = 0;
    for (int s = 1; s <= steps; ++s) {
      trainer.Step();
      const std::vector<TensorView> masters = trainer.MasterViews();
      std::vector<PartReceipt> receipts(parts);
      std::vector<double> ms(parts);
      std::vector<Status> failed(parts);
      auto t0 = Clock::now();
      std::vector<std::thread> ranks;
      for (size_t p = 0; p < parts; ++p) {
        ranks.emplace_back([&, p] {
          auto t = Clock::now();
          std::vector<TensorView> blocks = BlockViews(layout, p, masters);
          auto r = pubs[p]->Publish(s, blocks);
          if (r.ok()) receipts[p] = *r;
          else failed[p] = r.status();
          ms[p] = Ms(t);
        });
      }
      for (auto& t : ranks) t.join();
      const double w = Ms(t0);
      for (const Status& f : failed) {
        if (!f.ok()) {
          std::fprintf(stderr, "%s\n", f.ToString().c_str());
          return 1;
        }
      }
      auto c0 = Clock::now();
      auto st = committer->Commit(s, receipts);
      const double cm = Ms(c0);
      if (!st.ok()) {
        std::fprintf(stderr, "%s\n", st.status().ToString().c_str());
        return 1;
      }
      for (auto& p : pubs) p->Finish(true);
      if (s > 1) {
        wall += w;
        slowest += *std::max_element(ms.begin(), ms.end());
        commit += cm;
        bytes += st->delta_bytes;
        for (const PartReceipt& r : receipts) receipt_bytes += r.Serialize().size();
      }
    }
    const int n = steps - 1;
    char route[64];
    std::snprintf(route, sizeof route, "P=%zu%s", parts, static_cast<int>(parts) > cores ? " (oversubscribed)" : "");
    std::printf("%-22s %8d %14.1f %14.1f %12.2f %12.2f %14.0f\n", route, threads, wall / n, slowest / n,
                bytes / 1e6 / n, commit / n, receipt_bytes / n / parts);
  }
  if (!keep) std::filesystem::remove_all(dir);
  else std::filesystem::remove_all(dir + "/single");
  return 0;
}
