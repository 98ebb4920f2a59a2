// Temporary files for atomic writes (write beside the target, fsync, rename
// over it), shared by every writer of files: LocalStore::Put (buckets,
// `serve --out`, `pull -o`) and WriteSafetensorsFile (`apply -o`).
//
// Every temporary file is registered in a process-wide registry from just
// before it is created until it is renamed over its target or removed, so that
// a SIGINT/SIGTERM can remove it: InstallTempFileCleanupOnSignals() (the CLI
// calls it), or RemoveTempFiles() from a program's own signal handler.
//
// Naming: "<directory of target>/.tmp-<host>-<pid>-<16 hex>-<basename>":
// <host> is this machine's host name with every byte other than [A-Za-z0-9.]
// replaced by '_' and cut to 40 bytes (so it never holds a '-'), <pid> the
// writer's process id in decimal, <basename> the target's file name cut to
// 160 bytes. ValidateKey refuses a key segment starting with ".tmp-", so no
// key names a temporary file and LocalStore::List never shows one. Leftovers
// (from a SIGKILLed writer) match the glob '.tmp-*'; older releases wrote
// ".tmp\<basename>.<pid>.<16 hex>" (a literal backslash), still recognised
// (docs/format.md, "Temporary files").
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "deltasync/tensor.h"

namespace deltasync {

inline constexpr std::string_view kTempNamePrefix = ".tmp-";
inline constexpr std::string_view kLegacyTempNamePrefix = ".tmp\\";

// A fresh temporary path beside `target` (see "Naming" above).
std::string TempPathFor(const std::string& target);

// What a temporary name says about its writer.
struct TempNameInfo {
  std::string host;  // as written in the name; empty for a legacy name
  long pid = 0;
  std::string base;  // the (possibly cut) target's basename
  bool legacy = false;
};

// The parts of a temporary file name (a basename, not a path); nullopt for a
// name that is not one.
std::optional<TempNameInfo> ParseTempName(std::string_view name);
// Whether `name` starts like a temporary name (either format).
bool IsTempName(std::string_view name);
// This machine's <host> part, as TempPathFor writes it.
const std::string& TempNameHost();
// Whether a temporary name was written on this host (its pid means something
// here). A legacy name (no host) counts as this host's.
bool TempNameIsFromThisHost(const TempNameInfo& info);
// Whether the writer of a temporary name from this host still runs: its pid
// exists (kill(pid, 0) succeeds or fails with EPERM). False for another
// host's name. A pid reused by an unrelated process also reads as running
// (a leftover kept longer, never a live file removed).
bool TempWriterRunsHere(const TempNameInfo& info);

// Removes what writers of `target` killed on this host left beside it: every
// entry of target's directory named like TempPathFor(target) (same cut
// basename; either format) whose writer no longer runs here, file, link or
// folder (a model folder being built). A running writer's entry and another
// host's are kept. For commands that write one path a user names (`pull -o`,
// `pull --hf-dir`), at start. Returns the number of entries removed; errors
// are ignored (a leftover that cannot be removed only stays).
int RemoveDeadWritersTemporaries(const std::string& target);

// One temporary file, owned until RenameOverTarget() succeeds; otherwise the
// destructor closes and removes it. The methods return 0 or an errno value,
// so that callers word the message for their own users.
class TempFile {
 public:
  TempFile() = default;
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile();

  // Creates a new, empty file named TempPathFor(target) (O_EXCL, O_NOFOLLOW,
  // mode 0644) and registers it. A TempFile is created once.
  int Create(const std::string& target);
  // Writes all of `bytes` (short writes and EINTR are retried). After every
  // writeback step written it starts the device's writeback of that step
  // (sync_file_range SYNC_FILE_RANGE_WRITE, which does not wait), so that
  // Sync waits only for the tail instead of the whole file. Where the file
  // system does not support that, Write goes on without it (same bytes, same
  // durability: Sync still does it all); another error of it is returned.
  int Write(ByteSpan bytes);
  // fsync(2): the data must be on disk before the rename publishes it.
  int Sync();
  // close(2), which can report a deferred write error (NFS).
  int Close();
  // rename(2) over the target; on success the file is no longer temporary.
  // Syncing the target's directory is the caller's business.
  int RenameOverTarget();

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

  // Bytes between two starts of writeback.
  static constexpr size_t kWritebackStep = size_t{8} << 20;
  // Starts the writeback of [offset, offset + bytes) of fd; 0 or an errno value.
  using WritebackFn = int (*)(int fd, int64_t offset, int64_t bytes);
  // For tests: a smaller step (> 0) and a stand-in for sync_file_range
  // (nullptr: the real one). Call before the first Write.
  void SetWritebackForTesting(size_t step, WritebackFn start) {
    writeback_step_ = step;
    start_writeback_ = start;
  }

 private:
  std::string target_, path_;
  int fd_ = -1;
  int slot_ = -1;  // registry slot, -1 when not registered
  uint64_t written_ = 0;           // bytes written so far
  uint64_t writeback_started_ = 0; // bytes whose writeback was started (a multiple of the step)
  bool writeback_ = true;          // false once the file system said it cannot
  size_t writeback_step_ = kWritebackStep;
  WritebackFn start_writeback_ = nullptr;
};

// fsync(2) of the directory `dir`: makes a rename or mkdir inside it
// durable. 0 or an errno value (EINVAL, a file system that cannot sync
// directories, counts as success), so that callers word the message.
int SyncDirectory(const std::string& dir);

// Removes every registered temporary file. Async-signal-safe (unlink only;
// no allocation, no lock), for a signal handler. Each file is removed once.
void RemoveTempFiles();

// Installs handlers for SIGINT and SIGTERM that call RemoveTempFiles() and
// then re-raise the signal with its default action (so the process still
// dies by that signal: exit status 130 / 143 in a shell). A signal that is
// ignored when this is called (a background job's SIGINT) stays ignored.
// Not for programs that handle these signals themselves (`serve`, Python).
void InstallTempFileCleanupOnSignals();

// Temporary files registered now (for tests).
int RegisteredTempFileCount();

}  // namespace deltasync
