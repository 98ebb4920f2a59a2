// CheckOutsideBucket (store.h): an output path against a local bucket.
#include <filesystem>

#include "deltasync/store.h"

namespace deltasync {

Status CheckOutsideBucket(const Store* store, const std::string& path, const std::string& flag) {
  const auto* local = dynamic_cast<const LocalStore*>(store);
  if (local == nullptr) return Status::OK();
  // Both resolved as far as they exist (symbolic links, "..", "."), then
  // compared component by component.
  std::error_code ec;
  const std::filesystem::path root = std::filesystem::weakly_canonical(local->root(), ec);
  if (ec) return Status::OK();  // the bucket was opened: a path that cannot be resolved holds no output
  const std::filesystem::path out = std::filesystem::weakly_canonical(std::filesystem::absolute(path), ec);
  if (ec) return Status::IOError(path + ": cannot resolve the path: " + ec.message());
  auto under = [](const std::filesystem::path& inner, const std::filesystem::path& outer) {
    auto o = outer.begin(), i = inner.begin();
    for (; o != outer.end() && !o->empty(); ++o, ++i) {
      if (i == inner.end() || *i != *o) return false;
    }
    return true;
  };
  if (under(out, root) || under(root, out)) {
    return Status::InvalidArgument(flag + " " + path + (under(out, root) ? " is inside" : " holds") + " the bucket " +
                                   local->root() +
                                   ": writing there would replace the bucket's files; choose a path outside it");
  }
  return Status::OK();
}

}  // namespace deltasync
