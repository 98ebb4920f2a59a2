// safetensors writer: deterministic headers and crash-safe file replacement.
//
// The header is built as text rather than through a json object so that the
// key order is exactly "__metadata__" then the caller's tensor order, and so
// the same input always gives the same bytes (hashes of published files must
// reproduce).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "deltasync/safetensors.h"
#include "deltasync/temp_file.h"

namespace deltasync {
namespace {

// A JSON string literal for `s`, or nullopt when `s` is not valid UTF-8.
// nlohmann's strict serializer refuses overlong forms, surrogates and code
// points above U+10FFFF, the same set the reader refuses, so whatever is
// written can be read back.
std::optional<std::string> JsonString(const std::string& s) {
  try {
    return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::string Quote(std::string_view s) {
  constexpr size_t kMax = 128;
  // Appended, not "'" + std::string(s): GCC 12 flags the insert at 0 that
  // the latter inlines with a false -Wrestrict.
  std::string out(1, '\'');
  out.append(s.substr(0, kMax));
  out.append(s.size() <= kMax ? "'" : "...'");
  return out;
}

std::string ErrnoText(int err) { return std::strerror(err); }

// Sets `out` to the header JSON (unpadded) for `tensors`, after checking
// every input rule.
Status BuildHeaderJson(const Metadata& metadata, std::span<const TensorLayout> tensors,
                       std::string* out) {
  std::string& j = *out;
  j = "{";
  if (!metadata.empty()) {
    j += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      std::optional<std::string> k = JsonString(key), v = JsonString(value);
      if (!k) return Status::InvalidArgument("metadata key " + Quote(key) + " is not valid UTF-8");
      if (!v) {
        return Status::InvalidArgument("metadata value for key " + Quote(key) +
                                       " is not valid UTF-8");
      }
      if (!first) j += ',';
      first = false;
      j += *k + ':' + *v;
    }
    j += '}';
  }

  std::unordered_set<std::string_view> seen;
  uint64_t offset = 0;
  for (const TensorLayout& t : tensors) {
    if (t.name.empty()) return Status::InvalidArgument("tensor with an empty name");
    if (t.name == "__metadata__") {
      return Status::InvalidArgument("tensor name '__metadata__' is reserved for the metadata");
    }
    if (!seen.insert(t.name).second) {
      return Status::InvalidArgument("duplicate tensor name " + Quote(t.name));
    }
    std::optional<std::string> name = JsonString(std::string(t.name));
    if (!name) return Status::InvalidArgument("tensor name " + Quote(t.name) + " is not valid UTF-8");

    const std::string prefix = "tensor " + Quote(t.name);
    const std::string shape_text = ShapeToString(t.shape);
    std::optional<uint64_t> count = CheckedElementCount(t.shape);
    uint64_t need;
    if (!count || __builtin_mul_overflow(*count, DTypeSize(t.dtype), &need)) {
      return Status::InvalidArgument(prefix + ": shape " + shape_text + " byte size overflows 64 bits");
    }
    if (t.bytes != need) {
      return Status::InvalidArgument(prefix + ": data is " + std::to_string(t.bytes) +
                                     " bytes but shape " + shape_text + " x " +
                                     std::string(DTypeName(t.dtype)) + " needs " +
                                     std::to_string(need));
    }
    uint64_t end;
    if (__builtin_add_overflow(offset, need, &end)) {
      return Status::InvalidArgument(prefix + ": data section would exceed 2^64 bytes");
    }

    if (j.size() > 1) j += ',';
    j += *name;
    j += ":{\"dtype\":\"";
    j += DTypeName(t.dtype);
    j += "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) j += ',';
      j += std::to_string(t.shape[i]);
    }
    j += "],\"data_offsets\":[" + std::to_string(offset) + ',' + std::to_string(end) + "]}";
    offset = end;
  }
  j += '}';
  return Status::OK();
}

// The rename is only durable once the directory entry is on disk.
Status SyncParentDir(const std::string& target) {
  size_t slash = target.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : target.substr(0, slash);
  if (int err = SyncDirectory(dir)) {
    return Status::IOError(target + ": written, but fsync of directory " + dir + " failed: " + ErrnoText(err));
  }
  return Status::OK();
}

}  // namespace

Result<std::vector<uint8_t>> EncodeSafetensorsHeader(const Metadata& metadata,
                                                     std::span<const TensorView> tensors) {
  std::vector<TensorLayout> layouts;
  layouts.reserve(tensors.size());
  for (const TensorView& t : tensors) layouts.push_back({t.name, t.dtype, t.shape, t.data.size()});
  return EncodeSafetensorsHeader(metadata, std::span<const TensorLayout>(layouts));
}

Result<std::vector<uint8_t>> EncodeSafetensorsHeader(const Metadata& metadata,
                                                     std::span<const TensorLayout> tensors) {
  std::string text;
  DS_RETURN_IF_ERROR(BuildHeaderJson(metadata, tensors, &text));
  // Pad with spaces (valid JSON whitespace) so the data section starts at a
  // multiple of 8 bytes, as the official writer does; readers can then view
  // 8-byte elements in place when the buffer itself is aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxSafetensorsHeaderBytes) {
    return Status::InvalidArgument("header would be " + std::to_string(text.size()) +
                                   " bytes, above the " +
                                   std::to_string(kMaxSafetensorsHeaderBytes) + "-byte limit");
  }
  std::vector<uint8_t> out(8 + text.size());
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));  // little-endian
  std::memcpy(out.data() + 8, text.data(), text.size());
  return out;
}

Result<std::vector<uint8_t>> SerializeSafetensors(const Metadata& metadata,
                                                  std::span<const TensorView> tensors) {
  DS_ASSIGN_OR_RETURN(std::vector<uint8_t> out, EncodeSafetensorsHeader(metadata, tensors));
  size_t total = out.size();
  for (const TensorView& t : tensors) total += t.data.size();
  out.reserve(total);
  for (const TensorView& t : tensors) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

Status WriteSafetensorsFile(const std::string& path, const Metadata& metadata,
                            std::span<const TensorView> tensors) {
  // Validate before touching the file system: bad input creates nothing.
  Result<std::vector<uint8_t>> header = EncodeSafetensorsHeader(metadata, tensors);
  if (!header.ok()) return header.status().WithContext(path);

  TempFile tmp;
  if (int err = tmp.Create(path)) return Status::IOError(path + ": cannot create a temporary file: " + ErrnoText(err));
  auto failed = [&](std::string_view step, int err) {
    return Status::IOError(path + ": " + std::string(step) + " of " + tmp.path() + " failed: " + ErrnoText(err));
  };
  if (int err = tmp.Write(*header)) return failed("write", err);
  for (const TensorView& t : tensors) {
    if (int err = tmp.Write(t.data)) return failed("write", err);
  }
  if (int err = tmp.Sync()) return failed("fsync", err);
  // close() can report a deferred write error (e.g. on NFS).
  if (int err = tmp.Close()) return failed("close", err);
  if (int err = tmp.RenameOverTarget()) return failed("rename over the target", err);
  return SyncParentDir(path);
}

}  // namespace deltasync
