// s3_bench: upload and download throughput of one large object through
// S3Store, against the `curl` command-line tool moving the same bytes to and
// from the same server in the same run (curl --aws-sigv4, one stream).
// S3Store downloads into memory, which costs a page fault per 4 KiB on top
// of the network; so curl's download is timed twice: into a tmpfs file
// (/dev/shm: the same memory cost) and into /dev/null (network only).
// Downloads are repeated (--runs, best time kept); uploads run once each.
// The first download gets fresh pages; later ones reuse its pages through
// the store's download pool (S3Options::download_pool_bytes), as a replica's
// downloads of successive versions do: both figures are printed.
// The test server's memstore (4 GiB) keeps deleted data until RGW's garbage
// collection runs (5-15 s later): leave ~15 s between two runs of 1 GiB.
//
// Needs an S3 endpoint in the environment (AWS_ENDPOINT_URL + keys, e.g. from
// scripts/start-rgw.sh). Creates bucket ds-bench-<pid>, deletes its objects
// and the bucket at the end. Prints figures; never fails on a ratio.
//
//   bench/s3_bench [--mib N] [--part-mib N] [--parallel N] [--runs N]
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// Runs argv, waits, returns the exit status (-1 when it could not start).
int Run(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid;
  if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
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

void Report(const char* what, double ours, double curl, double mib) {
  std::printf("%-22s S3Store %6.2f s %6.0f MiB/s | curl %6.2f s %6.0f MiB/s | ratio %.2f\n", what, ours,
              mib / ours, curl, mib / curl, curl / ours);
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mib = 1024, part_mib = 64;
  int parallel = 8, runs = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--mib") mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--part-mib") part_mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--parallel") parallel = std::atoi(argv[i + 1]);
    else if (flag == "--runs") runs = std::max(1, std::atoi(argv[i + 1]));
  }
  std::string endpoint = Env("AWS_ENDPOINT_URL_S3");
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL");
  if (endpoint.empty()) {
    std::printf("s3_bench: skipped: no AWS_ENDPOINT_URL (start a server with scripts/start-rgw.sh)\n");
    return 0;
  }
  std::string region = Env("AWS_REGION").empty() ? "us-east-1" : Env("AWS_REGION");

  deltasync::S3Options options;
  options.create_bucket = true;
  options.part_size = part_mib << 20;
  options.multipart_threshold = part_mib << 20;
  options.parallelism = parallel;
  std::string bucket = "ds-bench-" + std::to_string(::getpid());
  auto opened = deltasync::S3Store::Open("s3://" + bucket, options);
  if (!opened.ok()) {
    std::fprintf(stderr, "s3_bench: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  deltasync::S3Store& store = **opened;

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
  std::string curl_url = endpoint + "/" + bucket + "/curl-object";
  int rc = 0;

  std::printf("s3_bench: %llu MiB object at %s, part size %llu MiB, parallelism %d\n",
              static_cast<unsigned long long>(mib), store.EndpointDescription().c_str(),
              static_cast<unsigned long long>(part_mib), parallel);

  // Phase 1: S3Store. Phase 2: curl. One object on the server at a time:
  // memstore holds deleted data until RGW's garbage collection frees it.
  Clock::time_point t0 = Clock::now();
  deltasync::Status put = store.Put("bench-object", data);
  const double ours_up = Seconds(t0);
  double ours_down = 1e30, ours_first = 0;
  if (!put.ok()) {
    std::fprintf(stderr, "s3_bench: upload failed: %s\n", put.ToString().c_str());
    rc = 1;
  }
  for (int r = 0; r < runs && rc == 0; ++r) {
    t0 = Clock::now();
    auto got = store.Get("bench-object");
    const double took = Seconds(t0);
    if (r == 0) ours_first = took;  // fresh pages; later runs reuse them (S3Options::download_pool_bytes)
    ours_down = std::min(ours_down, took);
    if (!got.ok()) {
      std::fprintf(stderr, "s3_bench: %s\n", got.status().ToString().c_str());
      rc = 1;
    } else if (got->size() != data.size() || std::memcmp(got->data(), data.data(), data.size()) != 0) {
      std::fprintf(stderr, "s3_bench: downloaded bytes differ from the uploaded ones\n");
      rc = 1;
    }
  }
  (void)store.Delete("bench-object");

  t0 = Clock::now();
  int up = Run({"curl", "-K", config, "-T", file, "-o", "/dev/null", curl_url});
  const double curl_up = Seconds(t0);
  if (up != 0) {
    std::fprintf(stderr, "s3_bench: curl upload failed (exit %d)\n", up);
    rc = 1;
  }
  ::unlink(file.c_str());  // frees its page cache before the downloads
  const std::string shm_file = "/dev/shm/ds-s3-bench-" + std::to_string(::getpid()) + ".bin";
  double curl_shm = 1e30, curl_null = 1e30;
  for (int r = 0; r < runs && rc == 0; ++r) {
    t0 = Clock::now();
    int a = Run({"curl", "-K", config, "-o", shm_file, curl_url});
    curl_shm = std::min(curl_shm, Seconds(t0));
    ::unlink(shm_file.c_str());
    t0 = Clock::now();
    int b = Run({"curl", "-K", config, "-o", "/dev/null", curl_url});
    curl_null = std::min(curl_null, Seconds(t0));
    if (a != 0 || b != 0) {
      std::fprintf(stderr, "s3_bench: curl download failed (exit %d, %d)\n", a, b);
      rc = 1;
    }
  }
  (void)store.Delete("curl-object");

  if (rc == 0) {
    const double m = static_cast<double>(mib);
    Report("upload", ours_up, curl_up, m);
    Report("download (curl->tmpfs)", ours_down, curl_shm, m);
    Report("download (curl->null)", ours_down, curl_null, m);
    Report("first download (fresh pages) vs curl->null", ours_first, curl_null, m);
    std::printf("(ratio = curl time / S3Store time; above 1 means S3Store is faster)\n");
  }
  // The bucket is empty now; remove it too (S3Store has no bucket deletion).
  (void)Run({"curl", "-K", config, "-X", "DELETE", "-o", "/dev/null", endpoint + "/" + bucket});
  ::unlink(file.c_str());
  ::unlink(config.c_str());
  ::rmdir(dir.c_str());
  return rc;
}
