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

// The URL scheme `url` starts with, or "" when it is a path. A scheme is a
// leading `[A-Za-z][A-Za-z0-9+.-]*:` (RFC 3986), so that "gs://bucket",
// "s3:/bucket" and "run:1" are refused rather than taken for relative
// directories; a colon after a '/' ("./run:1", "/data/a:b") is part of a path.
std::string_view SchemeOf(std::string_view url) {
  size_t colon = url.find(':');
  if (colon == std::string_view::npos || colon == 0) return {};
  if (!std::isalpha(static_cast<unsigned char>(url[0]))) return {};
  for (size_t i = 1; i < colon; ++i) {
    unsigned char c = static_cast<unsigned char>(url[i]);
    if (!std::isalnum(c) && c != '+' && c != '-' && c != '.') return {};
  }
  return url.substr(0, colon);
}

bool EqualsIgnoringCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

// The refusal of a URL whose scheme is unknown or misspelt, with the form
// the user probably meant when there is one.
Status BadScheme(std::string_view url, std::string_view scheme) {
  std::string rest(url.substr(scheme.size() + 1));
  while (!rest.empty() && rest.front() == '/') rest.erase(0, 1);
  std::string hint;
  if (EqualsIgnoringCase(scheme, "s3")) {
    hint = " (did you mean s3://" + rest + "?)";
  } else if (EqualsIgnoringCase(scheme, "file")) {
    hint = " (did you mean file:///" + rest + "?)";
  } else {
    hint = " (for a directory whose name has a colon, write ./" + std::string(url) + ")";
  }
  return Status::InvalidArgument("bucket '" + std::string(url) + "': '" + std::string(scheme) +
                                 ":' is not a bucket URL deltasync reads; give a directory, file:///abs/dir or "
                                 "s3://bucket/prefix" + hint);
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
  if (std::string_view scheme = SchemeOf(url); !scheme.empty()) return BadScheme(url, scheme);
  return OpenLocal(std::string(url), create);
}

}  // namespace deltasync
