// CheckOutsideBucket (store.h): an output path against a local bucket.
#include <sys/stat.h>

#include <filesystem>

#include "deltasync/store.h"

namespace deltasync {
namespace {

namespace fs = std::filesystem;

// Whether `path` or one of its existing ancestors is the directory `dir`
// (device and inode: the same directory reached by another path, a bind
// mount, compares equal too).
bool AtOrUnder(const fs::path& path, const struct stat& dir) {
  for (fs::path p = path;; p = p.parent_path()) {
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0 && st.st_dev == dir.st_dev && st.st_ino == dir.st_ino) return true;
    if (p == p.parent_path() || p.empty()) return false;
  }
}

}  // namespace

Status CheckOutsideBucket(const Store* store, const std::string& path, const std::string& flag) {
  const auto* local = dynamic_cast<const LocalStore*>(store);
  if (local == nullptr) return Status::OK();
  // Both resolved as far as they exist (symbolic links, "..", "."), then
  // compared component by component, and by device and inode.
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(local->root(), ec);
  if (ec) return Status::OK();  // the bucket was opened: a path that cannot be resolved holds no output
  const fs::path out = fs::weakly_canonical(fs::absolute(path), ec);
  if (ec) return Status::IOError(path + ": cannot resolve the path: " + ec.message());
  auto under = [](const fs::path& inner, const fs::path& outer) {
    auto o = outer.begin(), i = inner.begin();
    for (; o != outer.end() && !o->empty(); ++o, ++i) {
      if (i == inner.end() || *i != *o) return false;
    }
    return true;
  };
  struct stat root_st {}, out_st {};
  const bool root_known = ::stat(root.c_str(), &root_st) == 0;
  const bool inside = under(out, root) || (root_known && AtOrUnder(out, root_st));
  const bool holds = under(root, out) || (::stat(out.c_str(), &out_st) == 0 && AtOrUnder(root, out_st));
  if (inside || holds) {
    return Status::InvalidArgument(flag + " " + path + (inside ? " is inside" : " holds") + " the bucket " +
                                   local->root() +
                                   ": writing there would replace the bucket's files; choose a path outside it");
  }
  return Status::OK();
}

}  // namespace deltasync
