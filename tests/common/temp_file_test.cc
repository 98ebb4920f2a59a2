#include "deltasync/temp_file.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "testing/process_util.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::TempDir;

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  return names;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

ByteSpan Bytes(std::string_view s) { return ByteSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }

TEST(TempFileTest, NameIsBesideTheTargetWithHostPidAndNoBackslash) {
  std::string name = TempPathFor("/some/dir/model.safetensors");
  std::string head = "/some/dir/.tmp-" + TempNameHost() + "-" + std::to_string(::getpid()) + "-";
  ASSERT_EQ(name.rfind(head, 0), 0u) << name;
  EXPECT_EQ(name.size(), head.size() + 16 + std::string("-model.safetensors").size()) << name;
  EXPECT_TRUE(name.ends_with("-model.safetensors")) << name;
  EXPECT_EQ(name.find('\\'), std::string::npos) << name;
  EXPECT_NE(TempPathFor("/some/dir/model.safetensors"), name);
  EXPECT_EQ(TempPathFor("x").rfind(".tmp-", 0), 0u);
  // The host part never holds a '-', so the name parses back.
  EXPECT_FALSE(TempNameHost().empty());
  EXPECT_EQ(TempNameHost().find('-'), std::string::npos) << TempNameHost();
  // A long basename is cut so that the name stays a valid file name.
  std::string base = std::filesystem::path(TempPathFor("/d/" + std::string(250, 'a'))).filename().string();
  EXPECT_LT(base.size(), 255u);
}

TEST(TempFileTest, ParseTempNameReadsBothFormats) {
  std::string name = std::filesystem::path(TempPathFor("/d/step-000012.safetensors")).filename().string();
  std::optional<TempNameInfo> info = ParseTempName(name);
  ASSERT_TRUE(info) << name;
  EXPECT_EQ(info->host, TempNameHost());
  EXPECT_EQ(info->pid, ::getpid());
  EXPECT_EQ(info->base, "step-000012.safetensors");
  EXPECT_FALSE(info->legacy);
  EXPECT_TRUE(IsTempName(name));

  info = ParseTempName(".tmp\\manifest.v2.json.4242.0123456789abcdef");
  ASSERT_TRUE(info);
  EXPECT_TRUE(info->legacy);
  EXPECT_EQ(info->pid, 4242);
  EXPECT_EQ(info->base, "manifest.v2.json");
  EXPECT_TRUE(info->host.empty());

  for (std::string bad : {"model.safetensors", ".tmp-", ".tmp-host", ".tmp-host-12-0123456789abcdef",
                          ".tmp-host-x-0123456789abcdef-b", ".tmp--12-0123456789abcdef-b", ".tmp-h-12-0123-b",
                          ".tmp-h-0-0123456789abcdef-b", ".tmp\\x.12.nothex", ".tmp\\x.0123456789abcdef"}) {
    EXPECT_FALSE(ParseTempName(bad)) << bad;
  }
}

TEST(TempFileTest, WriterRunsHereOnlyWhileItsPidRuns) {
  TempNameInfo self{.host = TempNameHost(), .pid = ::getpid(), .base = "x", .legacy = false};
  EXPECT_TRUE(TempNameIsFromThisHost(self));
  EXPECT_TRUE(TempWriterRunsHere(self));
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  TempNameInfo dead{.host = TempNameHost(), .pid = child, .base = "x", .legacy = false};
  EXPECT_FALSE(TempWriterRunsHere(dead));
  TempNameInfo legacy_dead{.host = "", .pid = child, .base = "x", .legacy = true};
  EXPECT_TRUE(TempNameIsFromThisHost(legacy_dead));
  EXPECT_FALSE(TempWriterRunsHere(legacy_dead));
  // Another host's pid means nothing here.
  TempNameInfo elsewhere{.host = TempNameHost() + "x", .pid = ::getpid(), .base = "x", .legacy = false};
  EXPECT_FALSE(TempNameIsFromThisHost(elsewhere));
  EXPECT_FALSE(TempWriterRunsHere(elsewhere));
}

TEST(TempFileTest, RegisteredUntilRenamedOverTheTarget) {
  TempDir dir;
  const std::string target = dir.Sub("out.bin");
  const int before = RegisteredTempFileCount();
  {
    TempFile tmp;
    ASSERT_EQ(tmp.Create(target), 0);
    EXPECT_EQ(RegisteredTempFileCount(), before + 1);
    EXPECT_TRUE(std::filesystem::exists(tmp.path()));
    ASSERT_EQ(tmp.Write(Bytes("hello")), 0);
    ASSERT_EQ(tmp.Sync(), 0);
    ASSERT_EQ(tmp.Close(), 0);
    ASSERT_EQ(tmp.RenameOverTarget(), 0);
    EXPECT_EQ(RegisteredTempFileCount(), before);
  }
  EXPECT_EQ(ReadAll(target), "hello");
  EXPECT_EQ(Names(dir.path()), std::vector<std::string>{"out.bin"});
}

TEST(TempFileTest, RemovedAndUnregisteredWhenNotCommitted) {
  TempDir dir;
  const int before = RegisteredTempFileCount();
  {
    TempFile tmp;
    ASSERT_EQ(tmp.Create(dir.Sub("out.bin")), 0);
    ASSERT_EQ(tmp.Write(Bytes("partial")), 0);
  }
  EXPECT_EQ(RegisteredTempFileCount(), before);
  EXPECT_TRUE(Names(dir.path()).empty());
}

TEST(TempFileTest, CreateFailureRegistersNothing) {
  TempDir dir;
  const int before = RegisteredTempFileCount();
  TempFile tmp;
  EXPECT_EQ(tmp.Create(dir.Sub("missing/out.bin")), ENOENT);
  EXPECT_EQ(RegisteredTempFileCount(), before);
}

TEST(TempFileTest, RemoveTempFilesUnlinksEveryLiveOne) {
  TempDir dir;
  TempFile a, b;
  ASSERT_EQ(a.Create(dir.Sub("a")), 0);
  ASSERT_EQ(b.Create(dir.Sub("b")), 0);
  ASSERT_EQ(Names(dir.path()).size(), 2u);
  RemoveTempFiles();
  EXPECT_TRUE(Names(dir.path()).empty());
  EXPECT_EQ(RegisteredTempFileCount(), 0);
}

// A child process with the CLI's handlers, killed while its temporary file
// exists: the file is removed and the child still dies by the signal.
void KillWhileWriting(int sig) {
  TempDir dir;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The signal's default action first, as in a CLI started from a shell:
    // a test binary started in the background of a non-interactive shell
    // (`tests &` in a script, scripts/test-arm64.sh's shards) inherits
    // SIGINT ignored, which InstallTempFileCleanupOnSignals keeps (as for
    // nohup), and the child then never died.
    ::signal(sig, SIG_DFL);
    InstallTempFileCleanupOnSignals();
    TempFile tmp;
    if (tmp.Create(dir.Sub("big.bin")) != 0 || tmp.Write(Bytes("some bytes")) != 0) ::_exit(3);
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(4);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(Names(dir.path()).size(), 1u);
  ASSERT_EQ(::kill(pid, sig), 0);
  const testing::WaitResult waited = testing::WaitOrKill(pid, std::chrono::seconds(120));
  ASSERT_FALSE(waited.timed_out) << "the child outlived signal " << sig << " by 120 s";
  ASSERT_FALSE(waited.error);
  const int status = waited.status;
  ASSERT_TRUE(WIFSIGNALED(status)) << "status " << status;
  EXPECT_EQ(WTERMSIG(status), sig);
  EXPECT_TRUE(Names(dir.path()).empty()) << Names(dir.path()).front();
}

TEST(TempFileTest, SigtermRemovesTheTemporaryFileAndStillKills) { KillWhileWriting(SIGTERM); }
TEST(TempFileTest, SigintRemovesTheTemporaryFileAndStillKills) { KillWhileWriting(SIGINT); }

// The same with the test itself started with SIGINT and SIGTERM ignored (a
// background job of a non-interactive shell): the child inherits SIG_IGN,
// and the test still sees the CLI's handlers at work, not a child that
// never dies.
TEST(TempFileTest, SignalTestsHoldWhenStartedWithTheSignalsIgnored) {
  for (int sig : {SIGINT, SIGTERM}) {
    struct sigaction ignore {}, old {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ASSERT_EQ(::sigaction(sig, &ignore, &old), 0);
    KillWhileWriting(sig);
    ASSERT_EQ(::sigaction(sig, &old, nullptr), 0);
  }
}

// Writeback: Write starts the device's writeback after every step. A stand-in
// for sync_file_range records the ranges and can fail as a file system would.
struct WritebackLog {
  static inline std::vector<std::pair<int64_t, int64_t>> ranges;
  static inline int fail_with = 0;
  static int Start(int /*fd*/, int64_t offset, int64_t bytes) {
    ranges.emplace_back(offset, bytes);
    return fail_with;
  }
  static void Reset(int err) {
    ranges.clear();
    fail_with = err;
  }
};

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  uint32_t x = 12345;
  for (char& c : s) {
    x = x * 1103515245u + 12345u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

// Writes `data` in uneven parts (one of them spanning several steps) through a
// TempFile whose step is `step`, then publishes it.
int WriteInParts(const std::string& target, const std::string& data, size_t step) {
  TempFile tmp;
  if (int err = tmp.Create(target)) return err;
  tmp.SetWritebackForTesting(step, WritebackLog::Start);
  const size_t cuts[] = {0, 1000, 1000 + 3 * step + 17, data.size()};
  for (int i = 0; i < 3; ++i) {
    size_t from = std::min(cuts[i], data.size()), to = std::min(cuts[i + 1], data.size());
    if (int err = tmp.Write(Bytes(std::string_view(data).substr(from, to - from)))) return err;
  }
  if (int err = tmp.Sync()) return err;
  if (int err = tmp.Close()) return err;
  return tmp.RenameOverTarget();
}

TEST(TempFileTest, WritebackStartsAfterEveryStepAndTheBytesAreExact) {
  constexpr size_t kStep = 4096;
  for (size_t size : {7 * kStep, 7 * kStep + 123, kStep - 1}) {
    SCOPED_TRACE(size);
    TempDir dir;
    const std::string target = dir.Sub("big.bin");
    const std::string data = Pattern(size);
    WritebackLog::Reset(0);
    ASSERT_EQ(WriteInParts(target, data, kStep), 0);
    EXPECT_TRUE(ReadAll(target) == data);
    // One range per whole step written, in order, back to back; the tail
    // (less than a step) is left to Sync.
    ASSERT_EQ(WritebackLog::ranges.size(), size / kStep);
    for (size_t i = 0; i < WritebackLog::ranges.size(); ++i) {
      EXPECT_EQ(WritebackLog::ranges[i].first, static_cast<int64_t>(i * kStep));
      EXPECT_EQ(WritebackLog::ranges[i].second, static_cast<int64_t>(kStep));
    }
  }
}

TEST(TempFileTest, UnsupportedWritebackIsDroppedAndTheObjectIsTheSame) {
  constexpr size_t kStep = 4096;
  for (int err : {ENOSYS, EINVAL, ESPIPE, EOPNOTSUPP}) {
    SCOPED_TRACE(err);
    TempDir dir;
    const std::string target = dir.Sub("big.bin");
    const std::string data = Pattern(9 * kStep + 5);
    WritebackLog::Reset(err);
    ASSERT_EQ(WriteInParts(target, data, kStep), 0);
    EXPECT_TRUE(ReadAll(target) == data);
    EXPECT_EQ(WritebackLog::ranges.size(), 1u);  // tried once, then not again
  }
}

TEST(TempFileTest, WritebackDeviceErrorFailsTheWrite) {
  TempDir dir;
  WritebackLog::Reset(EIO);
  EXPECT_EQ(WriteInParts(dir.Sub("big.bin"), Pattern(3 * 4096), 4096), EIO);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("big.bin")));
}

TEST(TempFileTest, RealWritebackOverManyStepsKeepsTheBytes) {
  TempDir dir;
  const std::string target = dir.Sub("big.bin");
  const std::string data = Pattern(3 * TempFile::kWritebackStep + 4097);
  TempFile tmp;
  ASSERT_EQ(tmp.Create(target), 0);
  ASSERT_EQ(tmp.Write(Bytes(std::string_view(data).substr(0, 100))), 0);
  ASSERT_EQ(tmp.Write(Bytes(std::string_view(data).substr(100))), 0);
  ASSERT_EQ(tmp.Sync(), 0);
  ASSERT_EQ(tmp.Close(), 0);
  ASSERT_EQ(tmp.RenameOverTarget(), 0);
  EXPECT_TRUE(ReadAll(target) == data);
}

}  // namespace
}  // namespace deltasync
