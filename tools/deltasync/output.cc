#include "output.h"

#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "deltasync/store.h"

extern char** environ;

namespace deltasync::cli {

Status WritePatchFile(const std::string& path, const EncodedPatch& patch) {
  std::filesystem::path p = std::filesystem::absolute(path);
  if (!p.has_filename()) return Status::InvalidArgument(path + ": not a file path");
  // A LocalStore rooted at the parent directory gives the atomic write.
  DS_ASSIGN_OR_RETURN(auto dir, LocalStore::Open(p.parent_path().string(), /*create=*/true));
  return dir->Put(p.filename().string(), patch.parts).WithContext("writing " + path);
}

Status WriteStateFile(const std::string& path, const WeightState& state, uint64_t version) {
  std::vector<TensorView> views = state.views();
  DS_ASSIGN_OR_RETURN(EncodedPatch anchor, EncodeAnchor(version, views));
  return WritePatchFile(path, anchor);
}

Result<ChildProcess> SpawnWithStdoutPipe(const std::vector<std::string>& argv, bool quiet_stderr) {
  int fds[2];
  if (::pipe(fds) != 0) return Status::IOError(std::string("pipe failed: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  if (quiet_stderr) posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, args[0].c_str(), &actions, nullptr, cargs.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return Status::IOError("cannot start " + args[0] + ": " + std::strerror(rc));
  }
  return ChildProcess{pid, ::fdopen(fds[0], "r")};
}

namespace {
bool StderrIsTerminal() {
  static const bool tty = ::isatty(STDERR_FILENO) == 1;
  return tty;
}
}  // namespace

void DrawProgressLine(const std::string& text) {
  if (!StderrIsTerminal()) return;
  std::fprintf(stderr, "\r\033[K  %s", text.c_str());
  std::fflush(stderr);
}

void EraseProgressLine() {
  if (!StderrIsTerminal()) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

std::string TransferText(const std::string& what, uint64_t done, uint64_t total, double elapsed_s) {
  std::string text = what + ": " + HumanBytes(static_cast<double>(done)) + " of " +
                     HumanBytes(static_cast<double>(total));
  if (elapsed_s > 0.05 && done > 0) text += ", " + HumanBytes(static_cast<double>(done) / elapsed_s) + "/s";
  return text;
}

void PrintJson(const nlohmann::ordered_json& value) {
  std::printf("%s\n", value.dump().c_str());
  std::fflush(stdout);
}

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

}  // namespace deltasync::cli
