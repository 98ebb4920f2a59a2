// The compact delta's inspection side (deltasync/compact.h,
// docs/format.md, "Compact objects"): whether a file is a compact delta
// (IsCompactDelta), a version-3 delta's diff tables from its metadata
// (compact::ParseDeltaTables, for the decoder and ParseCompactDelta), and
// each stream's bytes by part (MeasureCompactDelta), read without the base.
// Encoding is compact_delta.cc.
#include <optional>
#include <string>

#include "codec/compact_bf16.h"
#include "codec/compact_container.h"
#include "codec/compact_streams.h"
#include "codec/compact_v3.h"
#include "codec/patch_metadata.h"
#include "deltasync/compact.h"

namespace deltasync {
namespace {

namespace pm = patchmeta;
using compact::CorruptTensor;
using compact::kClasses;
using compact::kModeBf16;
using compact::kStreamSuffix;
using compact::Reader;

}  // namespace

bool IsCompactDelta(const SafetensorsFile& file) {
  auto it = file.metadata().find(std::string(pm::kEncoding));
  return it != file.metadata().end() && it->second == kCompactEncodingName;
}

// A version-3 delta's diff tables, when its metadata has them.
Status compact::ParseDeltaTables(const SafetensorsFile& file, std::optional<V3Tables>& tables) {
  auto it = file.metadata().find(std::string(kTablesKey));
  if (it == file.metadata().end()) return Status::OK();
  tables.emplace();
  if (auto err = V3Tables::ParseHex(it->second, *tables)) {
    return Status::Corruption(file.label() + ": __metadata__ '" + std::string(kTablesKey) + "' is malformed: " + *err);
  }
  return Status::OK();
}

Result<CompactStreamSizes> MeasureCompactDelta(const SafetensorsFile& file) {
  if (!IsCompactDelta(file)) return Status::InvalidArgument(file.label() + " is not a compact delta");
  CompactStreamSizes out;
  out.header_bytes = file.blob().size();
  std::optional<compact::V3Tables> tables;
  DS_RETURN_IF_ERROR(compact::ParseDeltaTables(file, tables));
  DS_ASSIGN_OR_RETURN(const compact::RawStreams raw, compact::ReadContainer(file));
  out.container = raw.container;
  for (const compact::RawStream& r : raw.streams) {
    // Container 2 names no tensor: its streams are named by base index.
    // Appended, not "#" + std::to_string(...): in this file GCC 12 flags the
    // insert at 0 that the latter inlines with a false -Wrestrict.
    const std::string param = raw.container == 1 ? r.param : std::string(1, '#').append(std::to_string(r.index));
    const std::optional<uint64_t> index = raw.container == 1 ? std::nullopt : std::optional<uint64_t>(r.index);
    const TensorView t{param + std::string(kStreamSuffix), DType::kU8, {r.bytes.size()}, r.bytes};
    auto bad = [&](const std::string& msg) { return CorruptTensor(file.label(), t.name, msg); };
    Reader in(t.data);
    std::optional<uint8_t> version = in.Byte(), mode = in.Byte();
    std::optional<uint64_t> count = in.Varint();
    if (!version || !mode || !count) return bad("truncated stream header");
    if (*version == compact::kStreamVersion3 && *mode == kModeBf16) {
      // Version 3 is measured by decoding its entropy-coded parts.
      compact::ParsedBf16 parsed;
      compact::V3Sizes sizes;
      if (*count > t.data.size() * 8) return bad("count " + std::to_string(*count) + " is impossible for the stream's size");
      if (auto err = compact::ParseBf16StreamV3(in, *count, tables ? &*tables : nullptr, parsed, &sizes)) return bad(*err);
      out.tensors++;
      out.changed += *count;
      out.changed_tensors.push_back({raw.container == 1 ? param : "", true, *count, index});
      out.gap_bytes += sizes.gaps;
      out.diff_bytes += sizes.diffs;
      out.escape_bytes += sizes.escapes;
      continue;
    }
    int diff_blocks = 1;
    if (*mode == kModeBf16) {
      diff_blocks = 0;
      for (int cl = 0; cl < kClasses; ++cl) {
        std::optional<uint64_t> m = in.Varint();
        if (!m) return bad("truncated class counts");
        diff_blocks += *m > 0;
      }
    }
    // Block framing: u8 method, varint raw length, varint stored length, bytes.
    auto block = [&]() -> std::optional<uint64_t> {
      if (!in.Byte() || !in.Varint()) return std::nullopt;
      std::optional<uint64_t> stored = in.Varint();
      if (!stored || !in.Take(*stored)) return std::nullopt;
      return *stored;
    };
    std::optional<uint64_t> gaps = block();
    std::optional<uint64_t> second = 0;
    for (int b = 0; b < diff_blocks && second; ++b) {
      std::optional<uint64_t> one = block();
      second = one ? std::optional<uint64_t>(*second + *one) : std::nullopt;
    }
    std::optional<uint64_t> third = *mode == kModeBf16 ? block() : std::optional<uint64_t>(0);
    if (!gaps || !second || !third) return bad("truncated or malformed block");
    out.tensors++;
    out.changed += *count;
    out.changed_tensors.push_back({raw.container == 1 ? param : "", *mode == kModeBf16, *count, index});
    out.gap_bytes += *gaps;
    if (*mode == kModeBf16) {
      out.diff_bytes += *second;
      out.escape_bytes += *third;
    } else {
      out.value_bytes += *second;
    }
  }
  out.header_bytes -= out.gap_bytes + out.diff_bytes + out.escape_bytes + out.value_bytes;
  return out;
}

}  // namespace deltasync
