// LocalStore: a bucket in a local directory (store.h).
//
// Object `a/b/c` is the file <root>/a/b/c. Put never writes that file in place:
// it writes a temporary file beside it, fsyncs it, renames it over the target
// and fsyncs the directory, so a reader (or a crash) sees the old object or
// the whole new one. Because an object is only ever replaced by rename, a
// reader's mmap of the old file stays consistent (Blob::MapFile relies on it).
//
// Temporary files are TempFile's (temp_file.h): ".tmp-<host>-<pid>-<unique>-<basename>",
// registered so that a SIGINT/SIGTERM removes them. ValidateKey refuses a
// segment starting with ".tmp-" (and any backslash, which the older
// ".tmp\..." names hold), so List never mistakes a leftover from a crashed
// writer for an object, and no key can collide with a temporary file.
// RemoveStaleTemporaries removes the leftovers (`deltasync gc`).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "deltasync/store.h"
#include "deltasync/temp_file.h"

namespace deltasync {
namespace {

// read(2) never moves more than ~2 GiB at once on Linux; ask for less.
constexpr size_t kMaxReadChunk = size_t{1} << 30;

std::string Errno(int err) { return std::strerror(err); }

std::string Join(const std::string& dir, std::string_view name) {
  std::string out = dir;
  if (out.empty() || out.back() != '/') out += '/';
  out += name;
  return out;
}

std::string ParentOf(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == 0 ? std::string("/") : path.substr(0, slash);
}

// Closes on destruction; Close() reports the error that close(2) can carry
// (delayed write errors on some file systems).
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  void Reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  int Close() {
    int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

// mkdir -p. Existing directories are fine.
Status MakeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/') continue;
    std::string prefix = path.substr(0, i);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return Status::IOError(path + ": cannot create directory '" + prefix + "': " + Errno(errno));
    }
  }
  return Status::OK();
}

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

}  // namespace

Result<std::unique_ptr<LocalStore>> LocalStore::Open(const std::string& root, bool create) {
  if (root.empty()) return Status::InvalidArgument("local store: empty directory path");
  if (create) DS_RETURN_IF_ERROR(MakeDirs(root));
  // realpath makes the root absolute and symlink-free once, so that every
  // later check on components below it compares against the real directory.
  char* real = ::realpath(root.c_str(), nullptr);
  if (real == nullptr) {
    int err = errno;
    if (err == ENOENT) {
      return Status::NotFound(root + ": no such directory (is the path right? a bucket exists once a version is "
                                     "published to it)");
    }
    return Status::IOError(root + ": cannot resolve path: " + Errno(err));
  }
  std::string abs(real);
  std::free(real);
  struct stat st {};
  if (::stat(abs.c_str(), &st) != 0) return Status::IOError(abs + ": stat failed: " + Errno(errno));
  if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument(abs + ": not a directory, cannot hold a store");
  return std::unique_ptr<LocalStore>(new LocalStore(std::move(abs)));
}

std::string LocalStore::Describe() const { return "file://" + root_; }

// Walks the key one component at a time with lstat, refusing symlinks, so a
// key can never reach outside root_ (not even through a link someone placed
// in the bucket). With create_parents, missing directories are made (and
// their creation fsynced). Without it, kNotFound when there is no object.
Result<std::string> LocalStore::PathFor(std::string_view key, bool create_parents) const {
  DS_RETURN_IF_ERROR(ValidateKey(key));
  auto not_found = [&] {
    return Status::NotFound(Describe() + ": object '" + std::string(key) + "' not found");
  };
  std::string path = root_;
  size_t start = 0;
  // A concurrent Delete removes directories it empties, possibly one this
  // walk just made or saw; then the walk starts over (a few times at most).
  int restarts = 0;
  auto restart = [&] {
    path = root_;
    start = 0;
    return ++restarts <= 8;
  };
  for (;;) {
    size_t slash = key.find('/', start);
    bool last = slash == std::string_view::npos;
    std::string_view so_far = key.substr(0, last ? key.size() : slash);
    path = Join(path, key.substr(start, so_far.size() - start));

    struct stat st {};
    int err = ::lstat(path.c_str(), &st) == 0 ? 0 : errno;
    if (err == ENOENT && !last && create_parents) {
      int made = ::mkdir(path.c_str(), 0755) == 0 ? 0 : errno;
      // The directory entry must be durable before objects below it are.
      if (made == 0) made = SyncDirectory(ParentOf(path));
      if (made == ENOENT && restart()) continue;  // a parent vanished
      if (made != 0 && made != EEXIST) {          // EEXIST: a concurrent Put made it
        return Status::IOError(Describe() + ": cannot create directory '" + std::string(so_far) +
                               "': " + Errno(made));
      }
      err = ::lstat(path.c_str(), &st) == 0 ? 0 : errno;
      if (err == ENOENT) {
        if (restart()) continue;
        return Status::IOError(Describe() + ": directory '" + std::string(so_far) +
                               "' keeps disappearing (concurrent deletes); try again");
      }
    }
    if (err == ENOENT || err == ENOTDIR) {
      if (last && create_parents) return path;
      return not_found();
    }
    if (err != 0) {
      return Status::IOError(Describe() + ": cannot look up '" + std::string(so_far) + "': " + Errno(err));
    }
    if (S_ISLNK(st.st_mode)) {
      return Status::FailedPrecondition(Describe() + ": key '" + std::string(key) + "': '" +
                                        std::string(so_far) +
                                        "' is a symlink; LocalStore refuses symlinks so that "
                                        "keys cannot leave the store directory");
    }
    if (!last) {
      if (!S_ISDIR(st.st_mode)) {
        if (!create_parents) return not_found();
        return Status::FailedPrecondition(Describe() + ": cannot write '" + std::string(key) + "': '" +
                                          std::string(so_far) + "' is an object, not a directory");
      }
      start = slash + 1;
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      if (!create_parents) return not_found();
      return Status::FailedPrecondition(Describe() + ": cannot write '" + std::string(key) +
                                        "': it is a directory holding other objects");
    }
    // Sockets, FIFOs and devices are not objects; Put may replace them.
    if (!S_ISREG(st.st_mode) && !create_parents) return not_found();
    return path;
  }
}

Status LocalStore::Put(std::string_view key, std::span<const ByteSpan> parts) {
  auto fail = [&](std::string_view what, int err) {
    return Status::IOError(Describe() + ": cannot write '" + std::string(key) + "': " + std::string(what) +
                           ": " + Errno(err));
  };
  std::string path;
  TempFile tmp;
  // A concurrent Delete removes directories it empties, possibly one that
  // PathFor just created for us (open then fails with ENOENT): start over.
  // Not one of this process's Deletes: they wait on tree_ until the
  // temporary file holds its directory.
  for (int attempt = 0;; ++attempt) {
    int err = 0;
    {
      std::lock_guard<std::mutex> lock(tree_);
      DS_ASSIGN_OR_RETURN(path, PathFor(key, /*create_parents=*/true));
      err = tmp.Create(path);
    }
    if (err == 0) break;
    if ((err == ENOENT || err == EEXIST) && attempt < 8) continue;
    return fail("cannot create temporary file", err);
  }

  for (ByteSpan part : parts) {
    if (int err = tmp.Write(part)) return fail("write failed", err);
  }
  // The data must be on disk before the rename publishes it; otherwise a
  // crash could leave the new name pointing at an empty or partial file.
  if (int err = tmp.Sync()) return fail("fsync failed", err);
  if (int err = tmp.Close()) return fail("close failed", err);
  if (int err = tmp.RenameOverTarget()) return fail("rename over the old object failed", err);
  // The rename itself lives in the directory; sync it so the new object
  // survives a crash. On failure the object is visible but perhaps not durable.
  if (int err = SyncDirectory(ParentOf(path))) {
    return fail("object replaced, but syncing its directory failed (it may not survive a crash)", err);
  }
  return Status::OK();
}

Result<Blob> LocalStore::Get(std::string_view key) {
  DS_ASSIGN_OR_RETURN(std::string path, PathFor(key, /*create_parents=*/false));
  Result<Blob> blob = Blob::MapFile(path);
  if (blob.ok()) return blob;
  if (blob.status().code() == ErrorCode::kNotFound) {  // deleted since PathFor looked
    return Status::NotFound(Describe() + ": object '" + std::string(key) + "' not found");
  }
  return blob.status().WithContext(Describe() + ": cannot read '" + std::string(key) + "'");
}

Result<Blob> LocalStore::GetRange(std::string_view key, uint64_t offset, uint64_t length) {
  DS_ASSIGN_OR_RETURN(std::string path, PathFor(key, /*create_parents=*/false));
  auto fail = [&](std::string_view what, int err) {
    return Status::IOError(Describe() + ": cannot read '" + std::string(key) + "': " + std::string(what) +
                           ": " + Errno(err));
  };
  // O_NOFOLLOW: PathFor saw no symlink, and a link swapped in since is refused too.
  Fd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.get() < 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return Status::NotFound(Describe() + ": object '" + std::string(key) + "' not found");
    }
    return fail("cannot open", err);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return fail("stat failed", errno);
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (offset > size || length > size - offset) {
    return Status::InvalidArgument(Describe() + ": range at offset " + std::to_string(offset) +
                                   " of length " + std::to_string(length) + " exceeds object '" +
                                   std::string(key) + "' of " + std::to_string(size) + " bytes");
  }
  std::vector<uint8_t> out(length);
  uint64_t done = 0;
  while (done < length) {
    ssize_t n = ::pread(fd.get(), out.data() + done, std::min<uint64_t>(length - done, kMaxReadChunk),
                        static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail("read failed", errno);
    }
    if (n == 0)
      return fail("file ended early", EIO);  // only if modified in place, which deltasync never does
    done += static_cast<uint64_t>(n);
  }
  return Blob::FromVector(std::move(out));
}

Result<uint64_t> LocalStore::Size(std::string_view key) {
  DS_ASSIGN_OR_RETURN(std::string path, PathFor(key, /*create_parents=*/false));
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      return Status::NotFound(Describe() + ": object '" + std::string(key) + "' not found");
    }
    return Status::IOError(Describe() + ": cannot stat '" + std::string(key) + "': " + Errno(err));
  }
  return static_cast<uint64_t>(st.st_size);
}

namespace {

// Appends to `out` every object in the directory `fd` (whose key prefix is
// `rel`, "" for the root) whose key starts with `prefix`. Subdirectories are
// opened relative to their parent with O_NOFOLLOW, and symlinks and other
// non-regular files are skipped, so the walk never leaves the store, even if
// someone swaps a directory for a link while it runs. Names that are not
// valid key segments (temporary files among them) are skipped. Takes `fd`.
Status Walk(int fd, const std::string& rel, std::string_view prefix, std::vector<std::string>& out) {
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    int err = errno;
    ::close(fd);
    return Status::IOError("cannot read directory '" + rel + "': " + Errno(err));
  }
  // closedir also closes fd; the lambda keeps every return path tidy.
  auto done = [d](Status s) {
    ::closedir(d);
    return s;
  };
  for (;;) {
    errno = 0;
    struct dirent* e = ::readdir(d);
    if (e == nullptr) {
      if (errno != 0) return done(Status::IOError("cannot read directory '" + rel + "': " + Errno(errno)));
      return done(Status::OK());
    }
    std::string_view name = e->d_name;
    if (name == "." || name == ".." || IsTempName(name)) continue;
    unsigned char type = e->d_type;
    if (type == DT_UNKNOWN) {  // some file systems do not fill d_type
      struct stat st {};
      if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      type = S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_UNKNOWN;
    }
    if (type != DT_DIR && type != DT_REG) continue;
    std::string key = rel.empty() ? std::string(name) : rel + "/" + std::string(name);
    if (!ValidateKey(key).ok()) continue;
    if (type == DT_REG) {
      if (StartsWith(key, prefix)) out.push_back(std::move(key));
      continue;
    }
    // Descend only where keys starting with `prefix` can live.
    std::string as_dir = key + "/";
    if (!StartsWith(as_dir, prefix) && !StartsWith(prefix, as_dir)) continue;
    int child = ::openat(::dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (child < 0) {
      // Removed or replaced since readdir (a concurrent Delete): nothing to list.
      if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) continue;
      return done(Status::IOError("cannot open directory '" + key + "': " + Errno(errno)));
    }
    Status s = Walk(child, key, prefix, out);
    if (!s.ok()) return done(s);
  }
}

}  // namespace

Result<std::vector<std::string>> LocalStore::List(std::string_view prefix) {
  // The walk starts at the root and prunes every directory that cannot hold
  // a key with this prefix, so listing "deltas/" reads only deltas/.
  int fd = ::open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(Describe() + ": cannot open the store directory: " + Errno(errno));
  std::vector<std::string> keys;
  DS_RETURN_IF_ERROR(Walk(fd, "", prefix, keys).WithContext(Describe() + ": cannot list"));
  std::sort(keys.begin(), keys.end());
  return keys;
}

Status LocalStore::Delete(std::string_view key) {
  Result<std::string> path = PathFor(key, /*create_parents=*/false);
  if (!path.ok()) {
    return path.status().code() == ErrorCode::kNotFound ? Status::OK() : path.status();
  }
  if (::unlink(path->c_str()) != 0 && errno != ENOENT) {
    return Status::IOError(Describe() + ": cannot delete '" + std::string(key) + "': " + Errno(errno));
  }
  // Remove the directories this leaves empty, so deleted versions leave no
  // trail of empty folders. rmdir refuses a non-empty directory, which ends
  // the walk; a Put that loses a directory this way retries (see Put).
  // Deletes are not fsynced: an object that reappears after a crash is
  // harmless, because the manifest no longer lists it.
  std::lock_guard<std::mutex> lock(tree_);
  for (std::string dir = ParentOf(*path); dir.size() > root_.size(); dir = ParentOf(dir)) {
    if (::rmdir(dir.c_str()) != 0) break;
  }
  return Status::OK();
}

}  // namespace deltasync
