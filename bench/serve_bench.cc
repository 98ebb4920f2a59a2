// serve_bench: publish-to-serving latency. N `deltasync serve` daemons (no
// --out) follow one bucket; for each version, the time from Publish()
// returning until every daemon's GET /status reports that version. Run once
// with the daemons woken by /notify and once with polling alone.
//
//   build/bench/serve_bench [--daemons 4] [--versions 50] [--layers 4] [--vocab 151936]
//                           [--fraction 0.034] [--poll 1] [--anchor-interval 10]
//                           [--threads 1] [--exe build/deltasync] [--dir /tmp/...]
//
// The model has Qwen3-0.6B's shapes with --layers decoder layers, bf16
// weights, and each version changes --fraction of the elements by one bf16
// step (3.4%: the demo's rate at step 10). Figures, never pass/fail.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "deltasync/publisher.h"
#include "deltasync/store.h"
#include "timing.h"

extern char** environ;

using deltasync::cli::Median;
namespace {

using namespace deltasync;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

struct Args {
  int daemons = 4;
  int versions = 50;
  int layers = 4;
  uint64_t vocab = 151936;
  double fraction = 0.034;
  double poll = 1.0;
  uint64_t anchor_interval = 10;
  int threads = 1;
  std::string exe;
  std::string dir;
};

// Qwen3-0.6B: hidden 1024, 16 query heads and 8 KV heads of 128, MLP 3072,
// tied embedding.
std::vector<std::pair<std::string, std::vector<uint64_t>>> Shapes(int layers, uint64_t vocab) {
  std::vector<std::pair<std::string, std::vector<uint64_t>>> s = {{"model.embed_tokens.weight", {vocab, 1024}},
                                                                  {"model.norm.weight", {1024}}};
  for (int l = 0; l < layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    s.push_back({p + "self_attn.q_proj.weight", {2048, 1024}});
    s.push_back({p + "self_attn.k_proj.weight", {1024, 1024}});
    s.push_back({p + "self_attn.v_proj.weight", {1024, 1024}});
    s.push_back({p + "self_attn.o_proj.weight", {1024, 2048}});
    s.push_back({p + "self_attn.q_norm.weight", {128}});
    s.push_back({p + "self_attn.k_norm.weight", {128}});
    s.push_back({p + "mlp.gate_proj.weight", {3072, 1024}});
    s.push_back({p + "mlp.up_proj.weight", {3072, 1024}});
    s.push_back({p + "mlp.down_proj.weight", {1024, 3072}});
    s.push_back({p + "input_layernorm.weight", {1024}});
    s.push_back({p + "post_attention_layernorm.weight", {1024}});
  }
  return s;
}

class Model {
 public:
  Model(int layers, uint64_t vocab) {
    for (auto& [name, shape] : Shapes(layers, vocab)) {
      uint64_t n = 1;
      for (uint64_t d : shape) n *= d;
      tensors_.push_back({name, shape, std::vector<uint16_t>(n)});
      total_ += n;
    }
    // bf16 values around +-0.02 (exponent 0x3c); the exact values do not matter.
    for (auto& t : tensors_) {
      for (auto& x : t.data) x = static_cast<uint16_t>(0x3c00 | (Next() & 0x80ff));
    }
  }
  // Moves `fraction` of the elements (chosen at random) by one bf16 step.
  void Step(double fraction) {
    uint64_t n = static_cast<uint64_t>(fraction * static_cast<double>(total_));
    for (uint64_t k = 0; k < n; ++k) {
      uint64_t r = Next();
      auto& t = tensors_[Pick(r % total_)];
      uint16_t& x = t.data[(r >> 20) % t.data.size()];
      x = static_cast<uint16_t>((x & 0xff) == 0xff ? x - 1 : x + 1);
    }
  }
  std::vector<TensorView> Views() const {
    std::vector<TensorView> v;
    for (const auto& t : tensors_) {
      v.push_back({t.name, DType::kBF16, t.shape,
                   ByteSpan(reinterpret_cast<const uint8_t*>(t.data.data()), t.data.size() * 2)});
    }
    return v;
  }
  uint64_t total() const { return total_; }

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> shape;
    std::vector<uint16_t> data;
  };
  // A tensor chosen in proportion to its size.
  size_t Pick(uint64_t flat) const {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (flat < tensors_[i].data.size()) return i;
      flat -= tensors_[i].data.size();
    }
    return tensors_.size() - 1;
  }
  uint64_t Next() {  // xorshift64*: fast, and quality does not matter here
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 2685821657736338717ull;
  }
  std::vector<Tensor> tensors_;
  uint64_t total_ = 0;
  uint64_t state_ = 0x9e3779b97f4a7c15ull;
};

struct Daemon {
  pid_t pid = -1;
  std::string address;
  std::unique_ptr<httplib::Client> client;
};

bool SpawnDaemon(const Args& a, const std::string& bucket, Daemon& d) {
  int fds[2];
  if (::pipe(fds) != 0) return false;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::string poll = std::to_string(a.poll), threads = std::to_string(a.threads);
  std::vector<std::string> argv_s = {a.exe,    "serve", "--bucket",  bucket, "--listen", "127.0.0.1:0",
                                     "--poll", poll,    "--threads", threads};
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  int rc = posix_spawn(&d.pid, a.exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) return false;
  FILE* out = ::fdopen(fds[0], "r");
  char line[256] = {};
  bool got = std::fgets(line, sizeof line, out) != nullptr;
  std::fclose(out);
  std::string text = got ? line : "";
  if (text.rfind("listening on ", 0) != 0) return false;
  d.address = text.substr(13, text.find_first_of("\r\n") - 13);
  d.client = std::make_unique<httplib::Client>("http://" + d.address);
  d.client->set_keep_alive(true);
  d.client->set_read_timeout(30, 0);
  return true;
}

uint64_t HeldVersion(Daemon& d) {
  httplib::Result r = d.client->Get("/status");
  if (!r || r->status != 200) return 0;
  nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
  return j.is_object() && j["version"].is_number_unsigned() ? j["version"].get<uint64_t>() : 0;
}

// One run: fresh bucket, fresh daemons, --versions + 1 versions (the first
// is the initial anchor load and is reported apart). Latencies in ms.
bool Run(const Args& a, bool notify, std::vector<double>& latencies, double& first_ms, double& publish_ms) {
  const std::string bucket = a.dir + (notify ? "/bucket-notify" : "/bucket-poll");
  fs::remove_all(bucket);
  fs::create_directories(bucket);
  std::vector<Daemon> daemons(a.daemons);
  auto stop = [&] {
    for (auto& d : daemons) {
      if (d.pid > 0) ::kill(d.pid, SIGTERM);
    }
    for (auto& d : daemons) {
      if (d.pid > 0) ::waitpid(d.pid, nullptr, 0);
    }
    fs::remove_all(bucket);
  };
  for (auto& d : daemons) {
    if (!SpawnDaemon(a, bucket, d)) {
      std::fprintf(stderr, "serve_bench: cannot start %s serve\n", a.exe.c_str());
      stop();
      return false;
    }
  }
  auto store = OpenStore(bucket).value();
  PublisherOptions options;
  options.anchor_interval = a.anchor_interval;
  options.threads = 2;
  if (notify) {
    for (auto& d : daemons) options.notify_urls.push_back("http://" + d.address);
  }
  Model model(a.layers, a.vocab);
  auto publisher = Publisher::Open(store, options);
  if (!publisher.ok()) {
    std::fprintf(stderr, "serve_bench: %s\n", publisher.status().ToString().c_str());
    stop();
    return false;
  }
  double publish_sum = 0;
  // A trainer publishes on its own schedule, not right after the replicas
  // caught up: a random pause of up to one poll interval before each
  // version keeps the polling daemons out of phase with the publisher (the
  // same pauses in both runs).
  std::mt19937_64 rng(42);
  for (int v = 1; v <= a.versions + 1; ++v) {
    if (v > 1) model.Step(a.fraction);
    std::this_thread::sleep_for(std::chrono::duration<double>(std::uniform_real_distribution<double>(0, a.poll)(rng)));
    auto t0 = Clock::now();
    auto stats = (*publisher)->Publish(static_cast<uint64_t>(v), model.Views());
    auto published = Clock::now();
    if (!stats.ok()) {
      std::fprintf(stderr, "serve_bench: %s\n", stats.status().ToString().c_str());
      stop();
      return false;
    }
    if (v > 1) publish_sum += std::chrono::duration<double, std::milli>(published - t0).count();
    // Poll every daemon until all hold v; the latency is when the last one
    // was first seen holding it.
    std::vector<bool> holds(daemons.size(), false);
    size_t holding = 0;
    while (holding < daemons.size()) {
      for (size_t i = 0; i < daemons.size(); ++i) {
        if (!holds[i] && HeldVersion(daemons[i]) >= static_cast<uint64_t>(v)) {
          holds[i] = true;
          ++holding;
        }
      }
      if (std::chrono::duration<double>(Clock::now() - published).count() > 300) {
        std::fprintf(stderr, "serve_bench: version %d not held by every daemon after 300 s\n", v);
        stop();
        return false;
      }
      if (holding < daemons.size()) std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - published).count();
    if (v == 1) {
      first_ms = ms;
    } else {
      latencies.push_back(ms);
    }
    std::fprintf(stderr, "\r  %s: version %d/%d, %.0f ms   ", notify ? "notify" : "poll", v, a.versions + 1, ms);
  }
  std::fprintf(stderr, "\r\033[K");
  publish_ms = publish_sum / a.versions;
  stop();
  return true;
}

std::string SelfDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? fs::path(std::string(buf, static_cast<size_t>(n))).parent_path().string() : ".";
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  a.exe = SelfDir() + "/../deltasync";
  a.dir = (fs::temp_directory_path() / ("serve_bench-" + std::to_string(::getpid()))).string();
  if (argc % 2 == 0) {  // a flag without its value, or --help
    std::fprintf(stderr,
                 "usage: serve_bench [--daemons N] [--versions N] [--layers L] [--vocab V] [--fraction F] [--poll S]\n"
                 "                   [--anchor-interval N] [--threads N] [--exe PATH] [--dir DIR]\n");
    return 2;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--daemons") a.daemons = std::stoi(v);
    else if (k == "--versions") a.versions = std::stoi(v);
    else if (k == "--layers") a.layers = std::stoi(v);
    else if (k == "--vocab") a.vocab = std::stoull(v);
    else if (k == "--fraction") a.fraction = std::stod(v);
    else if (k == "--poll") a.poll = std::stod(v);
    else if (k == "--anchor-interval") a.anchor_interval = std::stoull(v);
    else if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--exe") a.exe = v;
    else if (k == "--dir") a.dir = v;
    else {
      std::fprintf(stderr, "serve_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  ::signal(SIGPIPE, SIG_IGN);
  Model probe(a.layers, a.vocab);
  std::printf("serve_bench: %d daemons (--poll %g, --threads %d, no --out), %d versions of a Qwen3-shaped model "
              "(%d layers, %.1fM bf16 parameters, %.0f MB), %.1f%% changed per version, anchor every %llu, %u CPUs\n",
              a.daemons, a.poll, a.threads, a.versions, a.layers, probe.total() / 1e6, probe.total() * 2 / 1e6,
              100 * a.fraction, static_cast<unsigned long long>(a.anchor_interval),
              std::thread::hardware_concurrency());
  std::fflush(stdout);
  nlohmann::json result;
  for (bool notify : {true, false}) {
    std::vector<double> lat;
    double first = 0, publish = 0;
    if (!Run(a, notify, lat, first, publish)) return 1;
    double p90 = 0;
    {
      std::vector<double> s = lat;
      std::sort(s.begin(), s.end());
      p90 = s[static_cast<size_t>(0.9 * (s.size() - 1))];
    }
    std::printf("%-12s publish() returned -> all %d daemons hold it: median %.1f ms, p90 %.1f ms, max %.1f ms "
                "(min %.1f ms; over %zu versions; first version, a full anchor load: %.0f ms; publish() itself: "
                "mean %.0f ms)\n",
                notify ? "with /notify" : "poll only", a.daemons, Median(lat), p90,
                *std::max_element(lat.begin(), lat.end()), *std::min_element(lat.begin(), lat.end()), lat.size(),
                first, publish);
    std::fflush(stdout);
    result[notify ? "notify" : "poll"] = {{"median_ms", Median(lat)},
                                          {"p90_ms", p90},
                                          {"max_ms", *std::max_element(lat.begin(), lat.end())},
                                          {"first_version_ms", first},
                                          {"publish_mean_ms", publish}};
  }
  fs::remove_all(a.dir);
  std::printf("%s\n", result.dump().c_str());
  return 0;
}
