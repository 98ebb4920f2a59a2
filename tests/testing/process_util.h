// Waiting for a child process in tests without ever hanging the run.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <chrono>
#include <thread>

namespace deltasync::testing {

struct WaitResult {
  int status = 0;          // the raw wait status
  bool error = false;      // waitpid failed (not our child, already reaped)
  bool timed_out = false;  // still running after the timeout: killed (SIGKILL) and reaped
};

// waitpid(pid), polled every 5 ms for at most `timeout`; a child still
// running then is killed and reaped, and the result says so, so a hung
// child fails its test instead of hanging the run.
inline WaitResult WaitOrKill(pid_t pid, std::chrono::milliseconds timeout) {
  WaitResult r;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const pid_t got = ::waitpid(pid, &r.status, WNOHANG);
    if (got == pid) return r;
    if (got < 0) {
      r.error = true;
      return r;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &r.status, 0);
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace deltasync::testing
