// hf_folder_bench: publishing a Hugging Face model folder (K shards + index,
// ReadHfFolder + Publisher::PublishFolder) against publishing one
// safetensors file holding the same tensors (SafetensorsFile::Open +
// Publisher::Publish), each into its own bucket, in the same run. Each
// version changes --fraction of the bf16 elements by one step; both forms
// are rewritten (untimed), then each publish is timed from opening the files
// to the commit, alternating which form goes first. Prints the median per
// form over the delta versions and over the first (anchor) version, and the
// folder/file ratio (target <= 1.1). Figures, never pass/fail.
//
// With --parts per-file it compares instead the two ways `deltasync publish
// BUCKET DIR` publishes the folder, both stateless as the command is (each
// version opens the bucket and rebuilds the newest state from it): one
// unparted version (Publisher::Open + PublishFolder) against one part per
// weight file (PublishFolderParts: the parts encoded and uploaded in
// parallel, then one commit), each into its own bucket; it prints per
// version the total and the detect+encode+upload phase (the rebuild is the
// rest), and the medians over the delta versions.
//
//   build/bench/hf_folder_bench [--mb 256] [--shards 4] [--versions 6] [--fraction 0.03]
//                               [--threads 2] [--dir /tmp/...] [--parts per-file]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "deltasync/folder_parts.h"
#include "deltasync/hf_folder.h"
#include "deltasync/publisher.h"
#include "deltasync/safetensors.h"
#include "deltasync/store.h"
#include "timing.h"

using deltasync::cli::Median;
namespace {

using namespace deltasync;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct Args {
  uint64_t mb = 256;
  int shards = 4;
  int versions = 6;
  double fraction = 0.03;
  int threads = 2;
  std::string dir;
  bool parts = false;  // --parts per-file
};

struct Tensor {
  std::string name;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> data;  // bf16
  TensorView view() const { return {name, DType::kBF16, shape, data}; }
};

double Ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

void Die(const Status& s) {
  std::fprintf(stderr, "hf_folder_bench: %s\n", s.ToString().c_str());
  std::exit(1);
}

// Writes the tensors as one file and as a folder of `shards` files + index.
void WriteBoth(const std::vector<Tensor>& tensors, const std::string& file, const std::string& folder, int shards) {
  std::vector<TensorView> all;
  for (const Tensor& t : tensors) all.push_back(t.view());
  if (Status s = WriteSafetensorsFile(file, {{"format", "pt"}}, all); !s.ok()) Die(s);
  fs::create_directories(folder);
  nlohmann::json map = nlohmann::json::object();
  const size_t per = (tensors.size() + shards - 1) / shards;
  for (int k = 0; k < shards; ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, shards);
    std::vector<TensorView> part;
    for (size_t i = k * per; i < std::min(tensors.size(), (k + 1) * per); ++i) {
      part.push_back(tensors[i].view());
      map[tensors[i].name] = name;
    }
    if (Status s = WriteSafetensorsFile(folder + "/" + name, {{"format", "pt"}}, part); !s.ok()) Die(s);
  }
  std::string index = nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump(2);
  FILE* f = std::fopen((folder + "/" + std::string(kHfIndexFile)).c_str(), "w");
  std::fputs(index.c_str(), f);
  std::fclose(f);
  f = std::fopen((folder + "/config.json").c_str(), "w");
  std::fputs("{\"model_type\": \"llama\"}\n", f);
  std::fclose(f);
}

// Runs both timings of version `v`, alternating which goes first (odd
// versions: `first` first), so neither always meets a warm or a cold cache.
template <typename First, typename Second>
auto Alternating(int v, First first, Second second) {
  decltype(first()) a;
  decltype(second()) b;
  if (v % 2) {
    a = first();
    b = second();
  } else {
    b = second();
    a = first();
  }
  return std::make_pair(a, b);
}

void FlipSome(std::vector<Tensor>& tensors, double fraction, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> coin(0, 1);
  for (Tensor& t : tensors) {
    for (size_t e = 0; e < t.data.size() / 2; ++e) {
      if (coin(rng) < fraction) {
        uint16_t b;
        std::memcpy(&b, &t.data[2 * e], 2);
        b ^= 1;  // one bf16 step (either way)
        std::memcpy(&t.data[2 * e], &b, 2);
      }
    }
  }
}

// --parts per-file: the stateless command, unparted against one part per file.
int RunParts(const Args& args, std::vector<Tensor>& tensors, std::mt19937_64& rng) {
  PublisherOptions options;
  options.threads = args.threads;
  options.anchor_interval = 1000;
  auto store = [&](const std::string& name) {
    auto s = OpenStore(args.dir + "/" + name);
    if (!s.ok()) Die(s.status());
    return *s;
  };
  std::shared_ptr<Store> one_store = store("bucket-one"), parts_store = store("bucket-parts");
  const std::string file = args.dir + "/single.safetensors", folder = args.dir + "/folder";
  struct Timing {
    double total = 0, phase = 0;  // phase: detect + encode + upload (+ commit)
  };
  std::vector<double> one_ms, parts_ms, one_phase, parts_phase;
  for (int v = 1; v <= args.versions; ++v) {
    if (v > 1) FlipSome(tensors, args.fraction, rng);
    WriteBoth(tensors, file, folder, args.shards);
    auto time_one = [&] {
      auto t0 = Clock::now();
      auto d = ReadHfFolder(folder);
      if (!d.ok()) Die(d.status());
      auto pub = Publisher::Open(one_store, options);
      if (!pub.ok()) Die(pub.status());
      auto stats = (*pub)->PublishFolder(v, *d);
      if (!stats.ok()) Die(stats.status());
      return Timing{Ms(t0, Clock::now()), stats->detect_encode_ms + stats->upload_ms};
    };
    auto time_parts = [&] {
      auto t0 = Clock::now();
      auto d = ReadHfFolder(folder);
      if (!d.ok()) Die(d.status());
      auto stats = PublishFolderParts(parts_store, v, *d, options);
      if (!stats.ok()) Die(stats.status());
      return Timing{Ms(t0, Clock::now()), stats->stats.detect_encode_ms + stats->stats.upload_ms};
    };
    const auto [a, b] = Alternating(v, time_one, time_parts);
    if (v > 1) {
      one_ms.push_back(a.total);
      parts_ms.push_back(b.total);
      one_phase.push_back(a.phase);
      parts_phase.push_back(b.phase);
    }
    std::printf("version %d: unparted %.1f ms (detect+encode+upload %.1f), %d parts %.1f ms (%.1f)\n", v, a.total,
                a.phase, args.shards, b.total, b.phase);
  }
  auto one = FetchManifest(*one_store), parts = FetchManifest(*parts_store);
  if (!one.ok() || !parts.ok() || one->Latest()->state_hash != parts->Latest()->state_hash) {
    std::fprintf(stderr, "hf_folder_bench: the two buckets disagree\n");
    return 1;
  }
  std::printf("model %.0f MB bf16, %d shards, %.1f%% changed per version, %d threads\n",
              static_cast<double>(one->Latest()->total_elements) * 2 / 1e6, args.shards, 100 * args.fraction,
              args.threads);
  std::printf("delta versions (median of %zu), stateless publish of the folder: unparted %.1f ms, --parts per-file "
              "%.1f ms, parts/unparted %.3fx; detect+encode+upload: %.1f ms vs %.1f ms, %.3fx\n",
              one_ms.size(), Median(one_ms), Median(parts_ms), Median(parts_ms) / Median(one_ms), Median(one_phase),
              Median(parts_phase), Median(parts_phase) / Median(one_phase));
  fs::remove_all(args.dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--mb") args.mb = std::stoull(v);
    else if (k == "--shards") args.shards = std::stoi(v);
    else if (k == "--versions") args.versions = std::stoi(v);
    else if (k == "--fraction") args.fraction = std::stod(v);
    else if (k == "--threads") args.threads = std::stoi(v);
    else if (k == "--dir") args.dir = v;
    else if (k == "--parts" && v == "per-file") args.parts = true;
    else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (args.dir.empty()) args.dir = (fs::temp_directory_path() / ("hf-folder-bench-" + std::to_string(::getpid()))).string();
  fs::remove_all(args.dir);
  fs::create_directories(args.dir);

  // 32 tensors of (rows x 1024) bf16, ~N(0, 0.02) bit patterns.
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const uint64_t total_elements = args.mb * 1000'000 / 2;
  const int count = 32;
  std::vector<Tensor> tensors(count);
  for (int i = 0; i < count; ++i) {
    Tensor& t = tensors[i];
    char name[64];
    std::snprintf(name, sizeof name, "model.layers.%02d.weight", i);
    t.name = name;
    t.shape = {total_elements / count / 1024, 1024};
    t.data.resize(t.shape[0] * 1024 * 2);
    for (size_t e = 0; e < t.data.size() / 2; ++e) {
      float x = normal(rng);
      uint32_t bits;
      std::memcpy(&bits, &x, 4);
      uint16_t b = static_cast<uint16_t>(bits >> 16);
      std::memcpy(&t.data[2 * e], &b, 2);
    }
  }

  if (args.parts) return RunParts(args, tensors, rng);

  PublisherOptions options;
  options.threads = args.threads;
  options.anchor_interval = 1000;
  auto open = [&](const std::string& name) {
    auto store = OpenStore(args.dir + "/" + name);
    if (!store.ok()) Die(store.status());
    auto pub = Publisher::Open(*store, options);
    if (!pub.ok()) Die(pub.status());
    return std::move(*pub);
  };
  auto file_pub = open("bucket-file");
  auto folder_pub = open("bucket-folder");
  const std::string file = args.dir + "/single.safetensors", folder = args.dir + "/folder";
  std::vector<double> file_ms, folder_ms;
  double file_first = 0, folder_first = 0;
  for (int v = 1; v <= args.versions; ++v) {
    if (v > 1) FlipSome(tensors, args.fraction, rng);
    WriteBoth(tensors, file, folder, args.shards);
    auto time_file = [&] {
      auto t0 = Clock::now();
      auto f = SafetensorsFile::Open(file);
      if (!f.ok()) Die(f.status());
      auto stats = file_pub->Publish(v, f->tensors());
      if (!stats.ok()) Die(stats.status());
      return Ms(t0, Clock::now());
    };
    auto time_folder = [&] {
      auto t0 = Clock::now();
      auto d = ReadHfFolder(folder);
      if (!d.ok()) Die(d.status());
      auto stats = folder_pub->PublishFolder(v, *d);
      if (!stats.ok()) Die(stats.status());
      return Ms(t0, Clock::now());
    };
    const auto [a, b] = Alternating(v, time_file, time_folder);
    if (v == 1) {
      file_first = a;
      folder_first = b;
    } else {
      file_ms.push_back(a);
      folder_ms.push_back(b);
    }
    std::printf("version %d: file %.1f ms, folder (%d shards) %.1f ms\n", v, a, args.shards, b);
  }
  if (file_pub->state().total_bytes() != folder_pub->state().total_bytes() ||
      file_pub->manifest().Latest()->state_hash != folder_pub->manifest().Latest()->state_hash) {
    std::fprintf(stderr, "hf_folder_bench: the two buckets disagree\n");
    return 1;
  }
  const double mb = static_cast<double>(file_pub->state().total_bytes()) / 1e6;
  std::printf("model %.0f MB bf16, %d shards, %.1f%% changed per version, %d threads\n", mb, args.shards,
              100 * args.fraction, args.threads);
  std::printf("first version (anchor): file %.1f ms, folder %.1f ms, folder/file %.3fx\n", file_first, folder_first,
              folder_first / file_first);
  std::printf("delta versions (median of %zu): file %.1f ms, folder %.1f ms, folder/file %.3fx (target <= 1.1x)\n",
              file_ms.size(), Median(file_ms), Median(folder_ms), Median(folder_ms) / Median(file_ms));
  fs::remove_all(args.dir);
  return 0;
}
