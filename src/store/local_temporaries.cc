// LocalStore::RemoveStaleTemporaries: the leftovers of writers killed between
// creating a temporary file and renaming it over its target (store.h,
// temp_file.h). A live writer's file is never removed: its pid is alive on
// this host, or (for a name from another host) it was modified less than
// `older_than` ago, as a writer writes, fsyncs and renames without pausing.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>

#include "deltasync/store.h"
#include "deltasync/temp_file.h"

namespace deltasync {
namespace {

struct Sweep {
  std::chrono::seconds older_than;
  bool dry_run;
  time_t now;
  LocalStore::TempCleanup stats;
};

// Walks the directory `fd` (taken) at `rel`, never following a symlink.
Status SweepDir(int fd, const std::string& rel, Sweep& sweep) {
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    int err = errno;
    ::close(fd);
    return Status::IOError("cannot read directory '" + rel + "': " + std::strerror(err));
  }
  Status status = Status::OK();
  for (;;) {
    errno = 0;
    struct dirent* e = ::readdir(d);
    if (e == nullptr) {
      if (errno != 0) status = Status::IOError("cannot read directory '" + rel + "': " + std::strerror(errno));
      break;
    }
    std::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
    const std::string path = rel.empty() ? std::string(name) : rel + "/" + std::string(name);
    if (S_ISDIR(st.st_mode)) {
      if (IsTempName(name)) continue;  // not a bucket writer's: serve --out removes its own
      int child = ::openat(::dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (child < 0) continue;
      status = SweepDir(child, path, sweep);
      if (!status.ok()) break;
      continue;
    }
    if (!S_ISREG(st.st_mode)) continue;
    std::optional<TempNameInfo> info = ParseTempName(name);
    if (!info) continue;
    const bool old_enough = sweep.now - st.st_mtime >= static_cast<time_t>(sweep.older_than.count());
    if (!old_enough || TempWriterRunsHere(*info)) {
      ++sweep.stats.kept_files;
      continue;
    }
    if (!sweep.dry_run && ::unlinkat(::dirfd(d), e->d_name, 0) != 0) {
      if (errno == ENOENT) continue;  // renamed or removed by someone else meanwhile
      status = Status::IOError("cannot remove the temporary file '" + path + "': " + std::strerror(errno));
      break;
    }
    ++sweep.stats.removed_files;
    sweep.stats.removed_bytes += static_cast<uint64_t>(st.st_size);
  }
  ::closedir(d);
  return status;
}

}  // namespace

Result<LocalStore::TempCleanup> LocalStore::RemoveStaleTemporaries(std::chrono::seconds older_than, bool dry_run) {
  if (older_than.count() < 0) return Status::InvalidArgument("the age of stale temporary files must be >= 0");
  int fd = ::open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(Describe() + ": cannot open: " + std::strerror(errno));
  Sweep sweep{older_than, dry_run, std::time(nullptr), {}};
  DS_RETURN_IF_ERROR(SweepDir(fd, "", sweep).WithContext(Describe()));
  return sweep.stats;
}

}  // namespace deltasync
