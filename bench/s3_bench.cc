// s3_bench: upload and download throughput of one large object through
// S3Store, against the `curl` command-line tool moving the same bytes to and
// from the same server in the same run (curl --aws-sigv4, one stream).
//
// Downloads are paired: S3Store and curl fetch the same object (the one
// S3Store uploaded, in parts) in turns, --runs rounds, the order rotated every
// round so that neither side always runs first on a warm or cold server; the
// medians are compared, and the spread (lowest, highest) is printed. Each
// download's CPU time is printed next to its wall time: the downloading
// process's (user/sys: S3Store's own, via getrusage; curl's, via wait4) and,
// when DS_RGW_DIR names a server from scripts/start-rgw.sh, the server's
// (radosgw and ceph-osd, from /proc/PID/stat): on a small machine the
// server and the client share the cores.
// S3Store downloads into memory, which costs a page fault per 4 KiB on top
// of the network; curl into /dev/null keeps no byte. Every S3Store store gets
// one download first, on fresh pages (printed apart); the paired ones reuse
// those pages through the store's download pool (S3Options::
// download_pool_bytes), as a replica's downloads of successive versions do.
// --parallel takes a list (e.g. 1,2,8): one S3Store per entry, each in the
// rotation. --tmpfs adds curl into a tmpfs file (/dev/shm: the cost of
// pages) to the rotation. Uploads run once each.
// The test server's memstore (4 GiB) keeps deleted data until RGW's garbage
// collection runs (5-15 s later): leave ~15 s between two runs of 1 GiB.
//
// Needs an S3 endpoint in the environment (AWS_ENDPOINT_URL + keys, e.g. from
// scripts/start-rgw.sh). Creates bucket ds-bench-<pid>, deletes its objects
// and the bucket at the end. Prints figures; never fails on a ratio.
//
//   bench/s3_bench [--mib N] [--part-mib N] [--parallel N[,N...]] [--runs N] [--tmpfs]
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "deltasync/s3_store.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

double TvSeconds(const timeval& tv) { return static_cast<double>(tv.tv_sec) + tv.tv_usec * 1e-6; }

// CPU seconds and minor faults of one process (or of this one).
struct Usage {
  double user = 0, sys = 0;
  long minflt = 0;
};

Usage FromRusage(const rusage& ru) { return {TvSeconds(ru.ru_utime), TvSeconds(ru.ru_stime), ru.ru_minflt}; }

Usage Minus(const Usage& a, const Usage& b) { return {a.user - b.user, a.sys - b.sys, a.minflt - b.minflt}; }

Usage Self() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return FromRusage(ru);
}

// Runs argv, waits, returns the exit status (-1 when it could not start) and
// the child's CPU use in *usage.
int Run(const std::vector<std::string>& args, Usage* usage = nullptr) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid;
  if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  int status = 0;
  rusage ru{};
  while (::wait4(pid, &status, 0, &ru) < 0) {
  }
  if (usage != nullptr) *usage = FromRusage(ru);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// utime + stime of a server process, in seconds (-1 when unreadable).
double ProcCpu(long pid) {
  if (pid <= 0) return -1;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::istringstream fields(stat.substr(paren + 2));
  std::string f;
  double ticks = 0;
  for (int i = 3; i <= 15 && (fields >> f); ++i) {
    if (i >= 14) ticks += std::strtod(f.c_str(), nullptr);  // fields 14 and 15: utime, stime
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

long PidFromFile(const std::string& path) {
  std::ifstream in(path);
  long pid = 0;
  in >> pid;
  return in ? pid : 0;
}

bool WriteFile(const std::string& path, const std::vector<uint8_t>& data, mode_t mode) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n <= 0) {
      ::close(fd);
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return ::close(fd) == 0;
}

// One download: wall time, the client's CPU, the server's CPU.
struct Sample {
  double wall = 0;
  Usage client;
  double rgw = -1, osd = -1;
};

// One side of the rotation: an S3Store with its parallelism, or curl.
struct Side {
  std::string name;
  std::unique_ptr<deltasync::S3Store> store;  // null for curl
  std::string curl_output;                    // /dev/null or a tmpfs file
  Sample fresh;                               // S3Store: the first download (fresh pages)
  std::vector<Sample> samples;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

template <typename F>
double MedianOf(const std::vector<Sample>& s, F f) {
  std::vector<double> v;
  for (const Sample& x : s) v.push_back(f(x));
  return Median(v);
}

void Report(const char* what, double ours, double curl, double mib) {
  std::printf("%-22s S3Store %6.2f s %6.0f MiB/s | curl %6.2f s %6.0f MiB/s | ratio %.2f\n", what, ours,
              mib / ours, curl, mib / curl, curl / ours);
}

void PrintSide(const Side& s, double mib) {
  std::vector<double> walls;
  for (const Sample& x : s.samples) walls.push_back(x.wall);
  if (walls.empty()) return;
  std::printf("  %-16s median %5.3f s (%5.3f-%5.3f) %5.0f MiB/s | client CPU user %5.3f sys %5.3f s, %7.0f minor "
              "faults | server CPU rgw %5.3f osd %5.3f s\n",
              s.name.c_str(), Median(walls), *std::min_element(walls.begin(), walls.end()),
              *std::max_element(walls.begin(), walls.end()), mib / Median(walls),
              MedianOf(s.samples, [](const Sample& x) { return x.client.user; }),
              MedianOf(s.samples, [](const Sample& x) { return x.client.sys; }),
              MedianOf(s.samples, [](const Sample& x) { return static_cast<double>(x.client.minflt); }),
              MedianOf(s.samples, [](const Sample& x) { return x.rgw; }),
              MedianOf(s.samples, [](const Sample& x) { return x.osd; }));
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mib = 1024, part_mib = 64;
  std::vector<int> parallels;
  int runs = 3;
  bool tmpfs = false;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    const char* value = i + 1 < argc ? argv[i + 1] : "";
    if (flag == "--tmpfs") {
      tmpfs = true;
      continue;
    }
    if (flag == "--mib") mib = std::strtoull(value, nullptr, 10);
    else if (flag == "--part-mib") part_mib = std::strtoull(value, nullptr, 10);
    else if (flag == "--runs") runs = std::max(1, std::atoi(value));
    else if (flag == "--parallel") {
      std::istringstream list(value);
      for (std::string p; std::getline(list, p, ',');) parallels.push_back(std::max(1, std::atoi(p.c_str())));
    }
    ++i;
  }
  if (parallels.empty()) parallels.push_back(8);
  std::string endpoint = Env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL");
  if (endpoint.empty()) {
    std::printf("s3_bench: skipped: no AWS_ENDPOINT_URL (start a server with scripts/start-rgw.sh)\n");
    return 0;
  }
  std::string region = Env("AWS_REGION").empty() ? "us-east-1" : Env("AWS_REGION");
  const std::string rgw_dir = Env("DS_RGW_DIR");
  const long rgw_pid = rgw_dir.empty() ? 0 : PidFromFile(rgw_dir + "/rgw.pid");
  const long osd_pid = rgw_dir.empty() ? 0 : PidFromFile(rgw_dir + "/osd.pid");

  std::string bucket = "ds-bench-" + std::to_string(::getpid());
  std::vector<Side> sides;
  for (int p : parallels) {
    deltasync::S3Options options;
    options.create_bucket = sides.empty();
    options.part_size = part_mib << 20;
    options.multipart_threshold = part_mib << 20;
    options.parallelism = p;
    auto opened = deltasync::S3Store::Open("s3://" + bucket, options);
    if (!opened.ok()) {
      std::fprintf(stderr, "s3_bench: %s\n", opened.status().ToString().c_str());
      return 1;
    }
    sides.push_back(Side{"S3Store x" + std::to_string(p), std::move(*opened), "", {}, {}});
  }
  deltasync::S3Store& store = *sides.front().store;

  // Incompressible bytes (xorshift), so no layer can shortcut them.
  std::vector<uint8_t> data(mib << 20);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(data.data() + i, &x, 8);
  }

  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // figures appear as they are printed
  // curl reads the same bytes from a file (page cache), and its credentials
  // from a 0600 config file rather than its command line.
  char dir_template[] = "/tmp/ds-s3-bench.XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) return 1;
  std::string dir = dir_template;
  std::string file = dir + "/object.bin", config = dir + "/curl.cfg";
  std::string cfg = "user = \"" + Env("AWS_ACCESS_KEY_ID") + ":" + Env("AWS_SECRET_ACCESS_KEY") +
                    "\"\naws-sigv4 = \"aws:amz:" + region +
                    ":s3\"\nheader = \"x-amz-content-sha256: UNSIGNED-PAYLOAD\"\nsilent\nshow-error\nfail\nmax-time = 600\n";
  if (!WriteFile(config, std::vector<uint8_t>(cfg.begin(), cfg.end()), 0600) || !WriteFile(file, data, 0600)) {
    std::fprintf(stderr, "s3_bench: cannot write to %s\n", dir.c_str());
    return 1;
  }
  int rc = 0;

  std::printf("s3_bench: %llu MiB object at %s, part size %llu MiB, %d paired rounds%s\n",
              static_cast<unsigned long long>(mib), store.EndpointDescription().c_str(),
              static_cast<unsigned long long>(part_mib), runs,
              rgw_pid > 0 ? "" : " (no DS_RGW_DIR: server CPU not measured)");

  // Uploads: curl's object first, deleted before S3Store's (memstore holds
  // deleted data until RGW's garbage collection frees it).
  const std::string curl_url = endpoint + "/" + bucket + "/curl-object";
  Clock::time_point t0 = Clock::now();
  int up = Run({"curl", "-K", config, "-T", file, "-o", "/dev/null", curl_url});
  const double curl_up = Seconds(t0);
  if (up != 0) {
    std::fprintf(stderr, "s3_bench: curl upload failed (exit %d)\n", up);
    rc = 1;
  }
  (void)store.Delete("curl-object");
  ::unlink(file.c_str());  // frees its page cache before the downloads
  t0 = Clock::now();
  deltasync::Status put = store.Put("bench-object", data);
  const double ours_up = Seconds(t0);
  if (!put.ok()) {
    std::fprintf(stderr, "s3_bench: upload failed: %s\n", put.ToString().c_str());
    rc = 1;
  }

  // Both download the object S3Store uploaded.
  const std::string object_url = endpoint + "/" + bucket + "/bench-object";
  const std::string shm_file = "/dev/shm/ds-s3-bench-" + std::to_string(::getpid()) + ".bin";
  sides.push_back(Side{"curl -> null", nullptr, "/dev/null", {}, {}});
  if (tmpfs) sides.push_back(Side{"curl -> tmpfs", nullptr, shm_file, {}, {}});

  auto download = [&](Side& side) {
    Sample s;
    const double rgw0 = ProcCpu(rgw_pid), osd0 = ProcCpu(osd_pid);
    if (side.store) {
      const Usage u0 = Self();
      t0 = Clock::now();
      auto got = side.store->Get("bench-object");
      s.wall = Seconds(t0);
      s.client = Minus(Self(), u0);
      if (!got.ok()) {
        std::fprintf(stderr, "s3_bench: %s\n", got.status().ToString().c_str());
        rc = 1;
      } else if (got->size() != data.size() || std::memcmp(got->data(), data.data(), data.size()) != 0) {
        std::fprintf(stderr, "s3_bench: downloaded bytes differ from the uploaded ones\n");
        rc = 1;
      }
    } else {
      t0 = Clock::now();
      int code = Run({"curl", "-K", config, "-o", side.curl_output, object_url}, &s.client);
      s.wall = Seconds(t0);
      if (side.curl_output != "/dev/null") ::unlink(side.curl_output.c_str());
      if (code != 0) {
        std::fprintf(stderr, "s3_bench: curl download failed (exit %d)\n", code);
        rc = 1;
      }
    }
    if (rgw0 >= 0) s.rgw = ProcCpu(rgw_pid) - rgw0;
    if (osd0 >= 0) s.osd = ProcCpu(osd_pid) - osd0;
    return s;
  };
  for (Side& side : sides) {
    if (side.store && rc == 0) side.fresh = download(side);
  }
  for (int r = 0; r < runs && rc == 0; ++r) {
    for (size_t k = 0; k < sides.size() && rc == 0; ++k) {
      Side& side = sides[(k + static_cast<size_t>(r)) % sides.size()];
      side.samples.push_back(download(side));
    }
  }
  (void)store.Delete("bench-object");

  if (rc == 0) {
    const double m = static_cast<double>(mib);
    std::printf("paired downloads (%d rounds, order rotated each round; CPU medians; server CPU -1: unread):\n", runs);
    for (const Side& s : sides) PrintSide(s, m);
    for (const Side& s : sides) {
      if (s.store) {
        std::printf("  %-16s first download (fresh pages) %5.3f s | client CPU user %5.3f sys %5.3f s, %7ld minor "
                    "faults | server CPU rgw %5.3f osd %5.3f s\n",
                    s.name.c_str(), s.fresh.wall, s.fresh.client.user, s.fresh.client.sys, s.fresh.client.minflt,
                    s.fresh.rgw, s.fresh.osd);
      }
    }
    auto wall = [](const Side& s) { return MedianOf(s.samples, [](const Sample& x) { return x.wall; }); };
    const Side& ours = sides.front();
    const Side& null_side = sides[parallels.size()];
    Report("upload", ours_up, curl_up, m);
    if (tmpfs) Report("download (curl->tmpfs)", wall(ours), wall(sides.back()), m);
    Report("download (curl->null)", wall(ours), wall(null_side), m);
    Report("first download (fresh pages) vs curl->null", ours.fresh.wall, wall(null_side), m);
    for (size_t k = 1; k < parallels.size(); ++k) {
      Report(("download x" + std::to_string(parallels[k]) + " (curl->null)").c_str(), wall(sides[k]),
             wall(null_side), m);
    }
    std::printf("(ratio = curl time / S3Store time, medians of the paired rounds; above 1 means S3Store is faster)\n");
  }
  // The bucket is empty now; remove it too (S3Store has no bucket deletion).
  (void)Run({"curl", "-K", config, "-X", "DELETE", "-o", "/dev/null", endpoint + "/" + bucket});
  ::unlink(file.c_str());
  ::unlink(config.c_str());
  ::rmdir(dir.c_str());
  return rc;
}
