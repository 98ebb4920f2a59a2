#include "children.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "deltasync/temp_file.h"

extern char** environ;

namespace deltasync::cli {
namespace {

// Live children, for the signal handler: a fixed array of atomics (no lock,
// no allocation in the handler). 0 marks a free slot.
constexpr int kMaxChildren = 64;
std::atomic<pid_t> g_children[kMaxChildren];
std::atomic<bool> g_progress_live{false};
static_assert(std::atomic<pid_t>::is_always_lock_free && std::atomic<bool>::is_always_lock_free);

void Track(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = 0;
    if (slot.compare_exchange_strong(expected, pid)) return;
  }
}

void Untrack(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = pid;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

void WriteStderr(const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text += n;
    left -= static_cast<size_t>(n);
  }
}

// Async-signal-safe only: kill, waitpid, nanosleep, unlink, write, _exit.
void DemoInterruptHandler(int sig) {
  for (auto& slot : g_children) {
    pid_t pid = slot.load();
    if (pid > 0) ::kill(pid, sig);
  }
  // Up to 10 s for the children to stop by themselves, then SIGKILL.
  constexpr int kPollMs = 10, kGraceMs = 10000;
  for (int waited = 0;; waited += kPollMs) {
    bool live = false;
    for (auto& slot : g_children) {
      pid_t pid = slot.load();
      if (pid <= 0) continue;
      pid_t r = ::waitpid(pid, nullptr, WNOHANG);
      if (r == pid || (r < 0 && errno == ECHILD)) {
        slot.store(0);
      } else {
        live = true;
        if (waited >= kGraceMs) ::kill(pid, SIGKILL);
      }
    }
    if (!live) break;
    struct timespec pause = {0, kPollMs * 1000000L};
    ::nanosleep(&pause, nullptr);
  }
  RemoveTempFiles();
  if (g_progress_live.load()) WriteStderr(::isatty(STDERR_FILENO) ? "\r\033[K" : "\n");
  WriteStderr("interrupted\n");
  ::_exit(128 + sig);
}

}  // namespace

void DieWithParentIfAsked() {
  const char* value = std::getenv(kParentPidEnv);
  if (value == nullptr) return;
  long parent = std::strtol(value, nullptr, 10);
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  // The parent may have died before the prctl: then nobody would signal us.
  if (parent > 0 && ::getppid() != static_cast<pid_t>(parent)) {
    WriteStderr("deltasync: the demo that started this process is gone; exiting\n");
    ::_exit(1);
  }
}

Result<ChildProcess> SpawnWithStdoutPipe(const std::vector<std::string>& argv, bool quiet_stderr) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::IOError(std::string("pipe failed: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  if (quiet_stderr) posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  // The child must see the signals the demo forwards, even when the demo
  // itself was started with them blocked or ignored.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<std::string> env_strings;
  const std::string prefix = std::string(kParentPidEnv) + "=";
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, prefix.c_str(), prefix.size()) != 0) env_strings.push_back(*e);
  }
  env_strings.push_back(prefix + std::to_string(::getpid()));
  std::vector<char*> env;
  for (std::string& s : env_strings) env.push_back(s.data());
  env.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);

  pid_t pid = -1;
  int rc = posix_spawn(&pid, args[0].c_str(), &actions, &attr, cargs.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    return Status::IOError("cannot start " + args[0] + ": " + std::strerror(rc));
  }
  Track(pid);
  return ChildProcess{pid, ::fdopen(fds[0], "r")};
}

int WaitChild(pid_t pid) {
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  Untrack(pid);
  return r == pid ? status : -1;
}

void InstallDemoInterruptHandlers() {
  struct sigaction action {};
  action.sa_handler = DemoInterruptHandler;
  sigemptyset(&action.sa_mask);
  // One handler at a time: a SIGINT during the SIGTERM handler waits.
  sigaddset(&action.sa_mask, SIGINT);
  sigaddset(&action.sa_mask, SIGTERM);
  for (int sig : {SIGINT, SIGTERM}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    ::sigaction(sig, &action, nullptr);
  }
}

void SetProgressLineLive(bool live) { g_progress_live.store(live); }

}  // namespace deltasync::cli
