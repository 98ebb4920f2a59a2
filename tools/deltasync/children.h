// The demo's child processes (`follow` replicas, `serve` daemons) and what
// SIGINT/SIGTERM do to them: nothing is orphaned, whatever ends the demo.
//
// - Ctrl-C, `kill`, `timeout`, Slurm or Kubernetes (SIGINT/SIGTERM): the
//   demo's handler forwards the signal to every live child, waits for them
//   (SIGKILL after 10 s), removes its temporary files, ends a live progress
//   line, prints "interrupted" and exits 128 + signal (130 / 143).
// - SIGKILL of the demo: each child asked the kernel for SIGTERM when its
//   parent dies (PR_SET_PDEATHSIG) as it started, and exits by itself.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <string>
#include <vector>

#include "deltasync/status.h"

namespace deltasync::cli {

// Set by the demo in its children's environment: the demo's pid.
inline constexpr const char* kParentPidEnv = "DELTASYNC_PARENT_PID";

// For a process started with kParentPidEnv (the demo's children; a no-op
// otherwise): PR_SET_PDEATHSIG(SIGTERM), then exit(1) at once when the
// parent is already gone (it died before the prctl).
void DieWithParentIfAsked();

// A child process whose stdout the caller reads through `out`.
struct ChildProcess {
  pid_t pid = -1;
  FILE* out = nullptr;
};

// Starts argv[0] with arguments argv[1..], the current environment plus
// kParentPidEnv, default SIGINT/SIGTERM handling and no blocked signals; its
// stdout on a pipe (and its stderr on /dev/null when quiet_stderr). The child
// is tracked for InstallDemoInterruptHandlers until WaitChild reaps it.
Result<ChildProcess> SpawnWithStdoutPipe(const std::vector<std::string>& argv, bool quiet_stderr);

// waitpid (retrying EINTR), then forgets the child. Its wait status, or -1.
int WaitChild(pid_t pid);

// The demo's SIGINT/SIGTERM handlers (above). A signal that is ignored when
// this is called (a background job's SIGINT) stays ignored.
void InstallDemoInterruptHandlers();

// Whether a progress line (no newline yet) is on stderr now, so that the
// handler ends it before printing "interrupted".
void SetProgressLineLive(bool live);

}  // namespace deltasync::cli
