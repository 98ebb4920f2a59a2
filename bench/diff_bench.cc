// diff_bench: `deltasync diff` of two bf16 checkpoints against reading both
// files with `dd` (to /dev/null), measured in the same run on a warm page
// cache.
//
//   bench/diff_bench [--quick] [--rate P] [--runs N] [--dir DIR] [--deltasync PATH] [--keep]
//
// Writes two safetensors files of Qwen3-0.6B's shapes in bf16 (596M
// parameters, 1.2 GB each; --quick: 2 layers and a 16k vocabulary, 0.1 GB)
// into a fresh directory under DIR (default /tmp), the second one differing
// from the first in a fraction P (default 0.03) of the elements by one
// mantissa step. Both files are read once untimed (the page cache is warm from then
// on: every figure is a warm-cache figure), then timed, best of N (default
// 3) each: `dd if=A of=/dev/null bs=16M`, the same for B, and
// `deltasync diff A B -o PATCH` (default encoding). Prints the times and
// diff / (dd A + dd B). The deltasync binary defaults to the one built next
// to this bench (build/deltasync). Removes its directory at the end (--keep
// leaves it, for profiling by hand, and prints its path). Prints
// figures; never fails on a ratio.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "deltasync/safetensors.h"
#include "synthetic_model.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs argv with stdout (and stderr unless `show_errors`) sent to
// /dev/null; the exit status (-1 when it could not start).
int Run(const std::vector<std::string>& args, bool show_errors = false) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  if (!show_errors) posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  int started = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (started != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Best wall time of `runs` runs of argv; negative when a run failed.
double Best(const std::vector<std::string>& args, int runs) {
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    Clock::time_point t0 = Clock::now();
    if (Run(args) != 0) return -1;
    best = std::min(best, Seconds(t0));
  }
  return best;
}

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint16_t ToBf16(float f) {  // round to nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

std::string SelfDir() {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : self.parent_path().string();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, keep = false;
  double rate = 0.03;
  int runs = 3;
  std::string dir_parent = "/tmp", deltasync = SelfDir() + "/../deltasync";
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    bool has_value = i + 1 < argc;
    if (flag == "--quick") quick = true;
    else if (flag == "--keep") keep = true;
    else if (flag == "--rate" && has_value) rate = std::atof(argv[++i]);
    else if (flag == "--runs" && has_value) runs = std::max(1, std::atoi(argv[++i]));
    else if (flag == "--dir" && has_value) dir_parent = argv[++i];
    else if (flag == "--deltasync" && has_value) deltasync = argv[++i];
    else {
      std::fprintf(stderr, "usage: diff_bench [--quick] [--rate P] [--runs N] [--dir DIR] [--deltasync PATH] [--keep]\n");
      return 2;
    }
  }
  std::string dir_template = dir_parent + "/ds-diff-bench.XXXXXX";
  if (::mkdtemp(dir_template.data()) == nullptr) {
    std::fprintf(stderr, "diff_bench: cannot create a directory in %s: %s\n", dir_parent.c_str(), std::strerror(errno));
    return 1;
  }
  const std::string dir = dir_template;
  const std::string a_path = dir + "/a.safetensors", b_path = dir + "/b.safetensors", patch = dir + "/patch";

  // The two states: weights ~N(0, 0.02) as bf16; B changes a fraction
  // `rate` of them (picked by hash) in the last mantissa bit.
  const auto shapes = deltasync::cli::Qwen3Shapes(quick ? 2 : 28, quick ? 16384 : 151936);
  std::vector<std::vector<uint16_t>> a_data, b_data;
  std::vector<deltasync::TensorView> a_views, b_views;
  uint64_t elements = 0, changed = 0, salt = 0;
  const uint64_t threshold = static_cast<uint64_t>(std::ldexp(std::clamp(rate, 0.0, 1.0), 32));
  for (const auto& [name, shape] : shapes) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    std::vector<uint16_t> a(n), b(n);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t key = Mix(salt + i);
      a[i] = ToBf16(0.02f * deltasync::cli::SyntheticGauss(key));
      b[i] = a[i];
      if ((key >> 32) < threshold) {
        b[i] = static_cast<uint16_t>(a[i] ^ 1);  // the last mantissa bit: stays finite
        ++changed;
      }
    }
    salt += n;
    elements += n;
    a_data.push_back(std::move(a));
    b_data.push_back(std::move(b));
  }
  for (size_t t = 0; t < shapes.size(); ++t) {
    auto bytes = [](const std::vector<uint16_t>& v) {
      return deltasync::ByteSpan(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 2);
    };
    a_views.push_back({shapes[t].first, deltasync::DType::kBF16, shapes[t].second, bytes(a_data[t])});
    b_views.push_back({shapes[t].first, deltasync::DType::kBF16, shapes[t].second, bytes(b_data[t])});
  }
  deltasync::Status st = deltasync::WriteSafetensorsFile(a_path, {}, a_views);
  if (st.ok()) st = deltasync::WriteSafetensorsFile(b_path, {}, b_views);
  a_data.clear();
  b_data.clear();
  a_views.clear();
  b_views.clear();

  int rc = 0;
  if (!st.ok()) {
    std::fprintf(stderr, "diff_bench: %s\n", st.ToString().c_str());
    rc = 1;
  } else {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    const double gb = 2.0 * static_cast<double>(elements) / 1e9;
    std::printf("diff_bench: two bf16 files of %.0fM parameters (%.2f GB each), %.2f%% of elements changed, "
                "warm page cache, best of %d\n",
                static_cast<double>(elements) / 1e6, gb, 100.0 * static_cast<double>(changed) / static_cast<double>(elements),
                runs);
    const std::vector<std::string> dd_a = {"dd", "if=" + a_path, "of=/dev/null", "bs=16M"};
    const std::vector<std::string> dd_b = {"dd", "if=" + b_path, "of=/dev/null", "bs=16M"};
    const std::vector<std::string> diff = {deltasync, "diff", a_path, b_path, "-o", patch};
    // Warm-up: both files into the page cache, and one diff (checks it runs).
    if (Best(dd_a, 1) < 0 || Best(dd_b, 1) < 0) {
      std::fprintf(stderr, "diff_bench: dd failed\n");
      rc = 1;
    } else if (Run(diff, /*show_errors=*/true) != 0) {
      std::fprintf(stderr, "diff_bench: '%s diff' failed\n", deltasync.c_str());
      rc = 1;
    } else {
      const double ta = Best(dd_a, runs), tb = Best(dd_b, runs), td = Best(diff, runs);
      std::printf("dd A          %6.3f s  %6.2f GB/s\n", ta, gb / ta);
      std::printf("dd B          %6.3f s  %6.2f GB/s\n", tb, gb / tb);
      std::printf("diff A B      %6.3f s  %6.2f GB/s of input\n", td, 2 * gb / td);
      std::printf("ratio diff / (dd A + dd B) = %.2f\n", td / (ta + tb));
    }
  }
  if (keep) {
    std::printf("kept %s\n", dir.c_str());
  } else {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return rc;
}
