// TempFile and the process-wide registry of temporary files (temp_file.h).
//
// The registry is a fixed array of slots, so that a signal handler can walk
// it without a lock or an allocation. A slot's state moves
//   kFree -> kFilling (a writer claims it and copies the path in)
//         -> kLive    (the handler may remove the file)
//         -> kFree    (renamed or removed by its writer)
// and the handler takes a live slot with a compare-and-swap to kRemoving, so
// it never reads a path that a writer is rewriting; a slot the handler took
// is never reused (the process is about to die).
#include "deltasync/temp_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

namespace deltasync {
namespace {

// Longest basename kept in a temporary name, so that the name stays below
// NAME_MAX (255) whenever the target's own basename fits.
constexpr size_t kTempBaseBytes = 160;
// Longest host part (".tmp-" + 40 + pid + 16 hex + 160 stays below 255).
constexpr size_t kTempHostBytes = 40;
// write(2) never moves more than ~2 GiB at once on Linux; ask for less.
constexpr size_t kMaxWriteChunk = size_t{1} << 30;

enum SlotState : int { kFree = 0, kFilling, kLive, kRemoving };

// More temporary files at once than any writer here makes (one per
// concurrent Put); a file that finds no slot still works, it is only not
// removed on a signal.
constexpr int kSlots = 256;

struct Slot {
  std::atomic<int> state{kFree};
  char path[PATH_MAX];
};
Slot g_slots[kSlots];
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs lock-free atomics");

int Register(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = kFree;
    if (!g_slots[i].state.compare_exchange_strong(expected, kFilling, std::memory_order_acquire)) continue;
    std::memcpy(g_slots[i].path, path.c_str(), path.size() + 1);
    g_slots[i].state.store(kLive, std::memory_order_release);
    return i;
  }
  return -1;
}

void Unregister(int slot) {
  if (slot < 0) return;
  int expected = kLive;
  // Fails only when a signal handler took the slot: leave it to the handler.
  g_slots[slot].state.compare_exchange_strong(expected, kFree, std::memory_order_release);
}

void CleanupHandler(int sig) {
  int saved = errno;
  RemoveTempFiles();
  errno = saved;
  // SA_RESETHAND restored the default action; the signal is blocked while
  // this handler runs, so it is delivered (and ends the process) on return.
  ::raise(sig);
}

}  // namespace

const std::string& TempNameHost() {
  static const std::string host = [] {
    char buf[256] = {};
    if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') std::strcpy(buf, "localhost");
    std::string out;
    for (const char* p = buf; *p != '\0' && out.size() < kTempHostBytes; ++p) {
      unsigned char c = static_cast<unsigned char>(*p);
      out += std::isalnum(c) || c == '.' ? static_cast<char>(c) : '_';
    }
    return out;
  }();
  return host;
}

std::string TempPathFor(const std::string& target) {
  size_t slash = target.rfind('/');
  std::string dir = slash == std::string::npos ? "" : target.substr(0, slash + 1);
  std::string base = slash == std::string::npos ? target : target.substr(slash + 1);
  // A name no other writer (thread, process, or host sharing the directory)
  // picks at the same time; O_EXCL catches the impossible case anyway.
  static std::atomic<uint64_t> counter{0};
  uint64_t mix = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                 (std::hash<std::thread::id>{}(std::this_thread::get_id()) << 1) ^
                 (counter.fetch_add(1) * 0x9E3779B97F4A7C15ull);
  // splitmix64 finaliser: spreads the bits so names do not look sequential.
  mix = (mix ^ (mix >> 30)) * 0xBF58476D1CE4E5B9ull;
  mix = (mix ^ (mix >> 27)) * 0x94D049BB133111EBull;
  mix ^= mix >> 31;
  char middle[48];
  std::snprintf(middle, sizeof middle, "-%ld-%016llx-", static_cast<long>(::getpid()),
                static_cast<unsigned long long>(mix));
  return dir + std::string(kTempNamePrefix) + TempNameHost() + middle + base.substr(0, kTempBaseBytes);
}

std::optional<TempNameInfo> ParseTempName(std::string_view name) {
  auto parse_pid = [](std::string_view digits) -> std::optional<long> {
    long pid = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || pid <= 0) return std::nullopt;
    return pid;
  };
  auto is_hex16 = [](std::string_view h) {
    return h.size() == 16 && std::all_of(h.begin(), h.end(), [](char c) {
             return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
           });
  };
  TempNameInfo info;
  if (name.starts_with(kTempNamePrefix)) {
    // host-pid-hex-base; the host never holds a '-'.
    std::string_view rest = name.substr(kTempNamePrefix.size());
    size_t a = rest.find('-');
    if (a == std::string_view::npos || a == 0) return std::nullopt;
    size_t b = rest.find('-', a + 1);
    if (b == std::string_view::npos) return std::nullopt;
    std::optional<long> pid = parse_pid(rest.substr(a + 1, b - a - 1));
    if (!pid || rest.size() < b + 18 || !is_hex16(rest.substr(b + 1, 16)) || rest[b + 17] != '-') return std::nullopt;
    info.host = std::string(rest.substr(0, a));
    info.pid = *pid;
    info.base = std::string(rest.substr(b + 18));
    return info;
  }
  if (name.starts_with(kLegacyTempNamePrefix)) {
    // base.pid.hex
    std::string_view rest = name.substr(kLegacyTempNamePrefix.size());
    size_t dot2 = rest.rfind('.');
    if (dot2 == std::string_view::npos || dot2 == 0 || !is_hex16(rest.substr(dot2 + 1))) return std::nullopt;
    size_t dot1 = rest.rfind('.', dot2 - 1);
    if (dot1 == std::string_view::npos) return std::nullopt;
    std::optional<long> pid = parse_pid(rest.substr(dot1 + 1, dot2 - dot1 - 1));
    if (!pid) return std::nullopt;
    info.pid = *pid;
    info.base = std::string(rest.substr(0, dot1));
    info.legacy = true;
    return info;
  }
  return std::nullopt;
}

bool IsTempName(std::string_view name) {
  return name.starts_with(kTempNamePrefix) || name.starts_with(kLegacyTempNamePrefix);
}

bool TempNameIsFromThisHost(const TempNameInfo& info) { return info.legacy || info.host == TempNameHost(); }

bool TempWriterRunsHere(const TempNameInfo& info) {
  if (!TempNameIsFromThisHost(info)) return false;
  if (info.pid <= 0 || info.pid > INT_MAX) return true;
  // EPERM: the process exists but belongs to someone else.
  return ::kill(static_cast<pid_t>(info.pid), 0) == 0 || errno != ESRCH;
}

int RemoveDeadWritersTemporaries(const std::string& target) {
  namespace fs = std::filesystem;
  std::string trimmed = target;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const fs::path path(trimmed);
  const std::string base = path.filename().string().substr(0, kTempBaseBytes);
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  if (base.empty()) return 0;
  int removed = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::optional<TempNameInfo> info = ParseTempName(it->path().filename().string());
    if (!info || info->base != base || !TempNameIsFromThisHost(*info) || TempWriterRunsHere(*info)) continue;
    std::error_code rm;
    if (fs::remove_all(it->path(), rm) > 0 && !rm) ++removed;
  }
  return removed;
}

TempFile::~TempFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!path_.empty()) ::unlink(path_.c_str());
  Unregister(slot_);
}

int TempFile::Create(const std::string& target) {
  if (!path_.empty() || fd_ >= 0) return EBUSY;
  std::string path = TempPathFor(target);
  // Registered before it exists: a signal between open and Register would
  // otherwise leave the file behind.
  int slot = Register(path);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    int err = errno;
    Unregister(slot);
    return err;
  }
  target_ = target;
  path_ = std::move(path);
  fd_ = fd;
  slot_ = slot;
  return 0;
}

namespace {

int SyncFileRangeWrite(int fd, int64_t offset, int64_t bytes) {
  return ::sync_file_range(fd, static_cast<off_t>(offset), static_cast<off_t>(bytes), SYNC_FILE_RANGE_WRITE) == 0
             ? 0
             : errno;
}

}  // namespace

int TempFile::Write(ByteSpan bytes) {
  if (fd_ < 0) return EBADF;
  const uint8_t* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    size_t chunk = std::min(left, kMaxWriteChunk);
    // Stop at the next step's end, so its writeback starts right after it.
    if (writeback_) chunk = std::min<uint64_t>(chunk, writeback_started_ + writeback_step_ - written_);
    ssize_t n = ::write(fd_, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;  // cannot happen for a regular file; never spin
    p += n;
    left -= static_cast<size_t>(n);
    written_ += static_cast<uint64_t>(n);
    if (writeback_ && written_ - writeback_started_ >= writeback_step_) {
      WritebackFn start = start_writeback_ != nullptr ? start_writeback_ : SyncFileRangeWrite;
      int err = start(fd_, static_cast<int64_t>(writeback_started_), static_cast<int64_t>(writeback_step_));
      if (err == EINVAL || err == ENOSYS || err == ESPIPE || err == EOPNOTSUPP) {
        // Not supported here (file system, kernel, seccomp): not a silent
        // wrong result, only a slower Sync; the bytes and the durability
        // are the same, as Sync's fsync writes and waits for everything.
        writeback_ = false;
      } else if (err != 0) {
        return err;  // e.g. EIO: the device failed; do not wait for fsync to say so
      }
      writeback_started_ += writeback_step_;
    }
  }
  return 0;
}

int TempFile::Sync() {
  if (fd_ < 0) return EBADF;
  return ::fsync(fd_) == 0 ? 0 : errno;
}

int TempFile::Close() {
  if (fd_ < 0) return EBADF;
  int fd = fd_;
  fd_ = -1;
  return ::close(fd) == 0 ? 0 : errno;
}

int TempFile::RenameOverTarget() {
  if (path_.empty()) return EBADF;
  if (::rename(path_.c_str(), target_.c_str()) != 0) return errno;
  // A signal between the rename and here unlinks a name that no longer
  // exists: harmless.
  path_.clear();
  Unregister(slot_);
  slot_ = -1;
  return 0;
}

void RemoveTempFiles() {
  for (Slot& slot : g_slots) {
    int expected = kLive;
    if (!slot.state.compare_exchange_strong(expected, kRemoving, std::memory_order_acquire)) continue;
    ::unlink(slot.path);
  }
}

void InstallTempFileCleanupOnSignals() {
  for (int sig : {SIGINT, SIGTERM}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    struct sigaction action {};
    action.sa_handler = CleanupHandler;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESETHAND;
    ::sigaction(sig, &action, nullptr);
  }
}

int RegisteredTempFileCount() {
  int n = 0;
  for (const Slot& slot : g_slots) n += slot.state.load(std::memory_order_acquire) == kLive;
  return n;
}

int SyncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = ::fsync(fd) != 0 && errno != EINVAL ? errno : 0;
  ::close(fd);
  return err;
}

}  // namespace deltasync
