// OpenStore: bucket URL -> Store. The one place that knows which schemes
// exist, so the CLI, the Python front and tests all accept the same URLs.
#include <cctype>
#include <string>
#include <string_view>

#include "deltasync/s3_store.h"
#include "deltasync/store.h"

namespace deltasync {
namespace {

constexpr std::string_view kFileScheme = "file://";
constexpr std::string_view kS3Scheme = "s3://";

// True when `url` starts with "scheme://" (RFC 3986 scheme characters), so
// that "gs://bucket" is refused rather than taken for a relative directory.
bool HasScheme(std::string_view url) {
  size_t colon = url.find("://");
  if (colon == std::string_view::npos || colon == 0) return false;
  if (!std::isalpha(static_cast<unsigned char>(url[0]))) return false;
  for (size_t i = 1; i < colon; ++i) {
    unsigned char c = static_cast<unsigned char>(url[i]);
    if (!std::isalnum(c) && c != '+' && c != '-' && c != '.') return false;
  }
  return true;
}

Result<std::shared_ptr<Store>> OpenLocal(const std::string& dir, bool create) {
  DS_ASSIGN_OR_RETURN(std::unique_ptr<LocalStore> store, LocalStore::Open(dir, create));
  return std::shared_ptr<Store>(std::move(store));
}

}  // namespace

Result<std::shared_ptr<Store>> OpenStore(std::string_view url, bool create, bool create_bucket) {
  if (url.empty()) {
    return Status::InvalidArgument(
        "empty bucket URL: give a directory, file:///abs/dir or s3://bucket/prefix");
  }
  if (url.substr(0, kFileScheme.size()) == kFileScheme) {
    std::string_view path = url.substr(kFileScheme.size());
    // "file://host/dir" names a directory on another host; only the local,
    // absolute form is meaningful here.
    if (path.empty() || path.front() != '/') {
      return Status::InvalidArgument("bucket URL '" + std::string(url) +
                                     "': a file:// URL needs an absolute path, as in file:///abs/dir");
    }
    return OpenLocal(std::string(path), create);
  }
  if (url.substr(0, kS3Scheme.size()) == kS3Scheme) return OpenS3StoreFromUrl(url, create_bucket);
  if (HasScheme(url)) {
    return Status::InvalidArgument(
        "bucket URL '" + std::string(url) +
        "': unknown scheme; use a directory, file:///abs/dir or s3://bucket/prefix");
  }
  return OpenLocal(std::string(url), create);
}

}  // namespace deltasync
