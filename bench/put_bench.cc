// put_bench: the local store's write of one object (LocalStore::Put's steps:
// TempFile Create, Write, Sync, Close, RenameOverTarget, SyncDirectory), with
// the writeback started while writing (TempFile's default) against without it
// (a stand-in for sync_file_range that says "unsupported", so TempFile takes
// the path it had before: write everything, then one fsync). Alternates
// off, on, on, off per round; prints each run and the medians.
//
//   put_bench DIR BYTES ROUNDS [STEP_MIB]   (STEP_MIB: the step of the "on" runs)
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "deltasync/temp_file.h"
#include "timing.h"

using deltasync::cli::Median;
namespace {

using deltasync::ByteSpan;
using deltasync::TempFile;
using deltasync::cli::ThreadCpuSeconds;

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int Unsupported(int, int64_t, int64_t) { return ENOSYS; }

struct Run {
  double write_wall, write_cpu, sync_wall, rest_wall, total;
};

Run PutOnce(const std::string& dir, const std::vector<uint8_t>& data, bool writeback, size_t step) {
  const std::string target = dir + "/object.bin";
  ::unlink(target.c_str());
  TempFile tmp;
  auto check = [](int err, const char* what) {
    if (err != 0) {
      std::fprintf(stderr, "put_bench: %s failed: errno %d\n", what, err);
      std::exit(1);
    }
  };
  const double t0 = Now();
  check(tmp.Create(target), "create");
  tmp.SetWritebackForTesting(step, writeback ? nullptr : Unsupported);
  const double c0 = ThreadCpuSeconds();
  check(tmp.Write(ByteSpan(data.data(), data.size())), "write");
  const double t1 = Now(), c1 = ThreadCpuSeconds();
  check(tmp.Sync(), "fsync");
  const double t2 = Now();
  check(tmp.Close(), "close");
  check(tmp.RenameOverTarget(), "rename");
  check(deltasync::SyncDirectory(dir), "directory fsync");
  const double t3 = Now();
  return {t1 - t0, c1 - c0, t2 - t1, t3 - t2, t3 - t0};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: put_bench DIR BYTES ROUNDS [STEP_MIB]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const size_t bytes = std::strtoull(argv[2], nullptr, 10);
  const int rounds = std::atoi(argv[3]);
  const size_t step = argc == 5 ? std::strtoull(argv[4], nullptr, 10) << 20 : TempFile::kWritebackStep;
  if (step == 0) return 2;
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  std::vector<Run> runs[2];
  for (int r = 0; r < rounds; ++r) {
    for (bool on : {false, true, true, false}) {
      Run run = PutOnce(dir, data, on, step);
      runs[on].push_back(run);
      std::printf("%-3s write %8.2f ms (cpu %8.2f)  fsync %8.2f ms  close+rename+dirsync %6.2f ms  total %8.2f ms\n",
                  on ? "on" : "off", run.write_wall * 1e3, run.write_cpu * 1e3, run.sync_wall * 1e3,
                  run.rest_wall * 1e3, run.total * 1e3);
    }
  }
  ::unlink((dir + "/object.bin").c_str());
  for (int on : {0, 1}) {
    auto col = [&](double Run::*m) {
      std::vector<double> v;
      for (const Run& r : runs[on]) v.push_back(r.*m * 1e3);
      std::sort(v.begin(), v.end());
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.2f [%.2f-%.2f]", Median(v), v.front(), v.back());
      return std::string(buf);
    };
    std::printf("median %-3s n=%zu write %s cpu %s fsync %s rest %s total %s\n", on ? "on" : "off", runs[on].size(),
                col(&Run::write_wall).c_str(), col(&Run::write_cpu).c_str(), col(&Run::sync_wall).c_str(),
                col(&Run::rest_wall).c_str(), col(&Run::total).c_str());
  }
  return 0;
}
