// ValidateKey: the one definition of a legal object key (store.h). Every Store
// checks it before touching anything, so a key that would mean different
// things to a file system and to S3 ("a/../b", "a//b", "a\b") never reaches
// either.
#include <string>
#include <string_view>

#include "deltasync/store.h"
#include "deltasync/temp_file.h"

namespace deltasync {
namespace {

constexpr size_t kMaxKeyBytes = 1024;
// Enough of a bad key to recognise it, without echoing a megabyte back.
constexpr size_t kMaxQuotedBytes = 80;

// 'key' for messages: control bytes (NUL included) escaped as \xNN so the
// message stays one printable line, long keys cut short with "...".
std::string Quote(std::string_view key) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "'";
  size_t n = key.size() < kMaxQuotedBytes ? key.size() : kMaxQuotedBytes;
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = static_cast<unsigned char>(key[i]);
    if (c < 0x20 || c == 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (n < key.size()) out += "...";
  out += "'";
  return out;
}

Status Invalid(std::string_view key, std::string_view rule) {
  return Status::InvalidArgument("invalid key " + Quote(key) + ": " + std::string(rule));
}

}  // namespace

Status ValidateKey(std::string_view key) {
  if (key.empty()) return Invalid(key, "empty");
  if (key.size() > kMaxKeyBytes) {
    return Invalid(
        key, std::to_string(key.size()) + " bytes, more than the limit of " + std::to_string(kMaxKeyBytes));
  }
  if (key.find('\0') != std::string_view::npos) return Invalid(key, "contains a NUL byte");
  if (key.find('\\') != std::string_view::npos) {
    return Invalid(key, "contains a backslash; segments are separated by '/'");
  }
  if (key.front() == '/') return Invalid(key, "starts with '/'; keys are relative to the bucket root");
  if (key.back() == '/') return Invalid(key, "ends with '/'; keys name objects, not directories");
  // Segments between '/' (the ends are known not to be '/' by now).
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string_view::npos) end = key.size();
    std::string_view segment = key.substr(start, end - start);
    if (segment.empty()) return Invalid(key, "empty segment ('//')");
    if (segment == ".") return Invalid(key, "'.' segment");
    if (segment == "..") return Invalid(key, "'..' segment; keys cannot leave the bucket");
    if (segment.starts_with(kTempNamePrefix)) {
      return Invalid(key, "a segment starts with '.tmp-', which is reserved for temporary files");
    }
    start = end + 1;
  }
  return Status::OK();
}

}  // namespace deltasync
