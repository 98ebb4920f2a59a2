// LocalStore's compare-and-swap (GetVersioned / PutIfUnchanged), used for the
// manifest. The token is the XXH3-64 of the object's bytes: any rewrite that
// changes the content changes the token, and a rewrite with identical content
// is harmless to miss. Check-and-replace runs under an exclusive flock(2) on
// the object's parent directory, which serialises writers across threads and
// processes on the same host (flock locks belong to the open file
// description, so two fds in one process exclude each other too).
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "deltasync/store.h"

namespace deltasync {
namespace {

std::string TokenOf(std::span<const ByteSpan> parts) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  for (ByteSpan p : parts) XXH3_64bits_update(st, p.data(), p.size());
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Holds an exclusive flock on a directory for its lifetime.
class DirLock {
 public:
  static Result<DirLock> Acquire(const std::string& dir) {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Status::IOError(dir + ": cannot open for locking: " + std::strerror(errno));
    while (::flock(fd, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return Status::IOError(dir + ": flock failed: " + std::strerror(err));
    }
    return DirLock(fd);
  }
  DirLock(DirLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  DirLock& operator=(DirLock&&) = delete;
  ~DirLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }

 private:
  explicit DirLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace

Result<Store::Versioned> LocalStore::GetVersioned(std::string_view key) {
  DS_ASSIGN_OR_RETURN(Blob blob, Get(key));
  ByteSpan bytes = blob.bytes();
  std::string token = TokenOf(std::span<const ByteSpan>(&bytes, 1));
  return Versioned{std::move(blob), std::move(token)};
}

Result<std::string> LocalStore::PutIfUnchanged(std::string_view key, std::span<const ByteSpan> parts,
                                               const std::optional<std::string>& expected_token) {
  DS_ASSIGN_OR_RETURN(std::string path, PathFor(key, /*create_parents=*/true));
  std::string dir = path.substr(0, path.find_last_of('/'));
  DS_ASSIGN_OR_RETURN(DirLock lock, DirLock::Acquire(dir));

  Result<Versioned> current = GetVersioned(key);
  if (current.ok()) {
    if (!expected_token) {
      return Status::Conflict(Describe() + ": object '" + std::string(key) +
                              "' was created by another writer (expected it not to exist)");
    }
    if (current->token != *expected_token) {
      return Status::Conflict(Describe() + ": object '" + std::string(key) +
                              "' was changed by another writer since it was read");
    }
  } else if (current.status().code() == ErrorCode::kNotFound) {
    if (expected_token) {
      return Status::Conflict(Describe() + ": object '" + std::string(key) +
                              "' was deleted by another writer since it was read");
    }
  } else {
    return current.status();
  }
  DS_RETURN_IF_ERROR(Put(key, parts));
  return TokenOf(parts);
}

}  // namespace deltasync
