// SummarizeHistory (history.h): a walk over the manifest, no downloads.
#include "deltasync/history.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <set>

namespace deltasync {

std::string_view ObjectRoleName(ObjectRole role) {
  switch (role) {
    case ObjectRole::kAnchor: return "anchor";
    case ObjectRole::kDelta: return "delta";
    case ObjectRole::kCumulative: return "cumulative";
  }
  return "?";
}

History SummarizeHistory(const Manifest& manifest) {
  History h;
  const VersionEntry* previous = nullptr;
  FileSet files;                  // the side files in force
  std::set<std::string> file_keys;  // side file objects counted
  for (const VersionEntry& v : manifest.versions) {
    VersionSummary s;
    std::vector<IndexEncoding> encodings;
    s.entry = &v;
    if (v.changed_elements) {
      s.changed_fraction = v.total_elements ? static_cast<double>(*v.changed_elements) / v.total_elements : 0.0;
    }
    for (const ObjectEntry& o : v.objects) {
      ObjectRole role = o.kind == PatchKind::kAnchor ? ObjectRole::kAnchor
                        : previous && o.base_version == previous->version ? ObjectRole::kDelta
                                                                          : ObjectRole::kCumulative;
      s.objects.push_back({role, &o});
      s.bytes += o.size;
      if (std::find(encodings.begin(), encodings.end(), o.encoding) == encodings.end()) {
        encodings.push_back(o.encoding);
        if (!s.encoding.empty()) s.encoding += '+';
        s.encoding += EncodingName(o.encoding);
      }
      HistoryTotals& t = h.totals;
      t.objects++;
      t.bytes += o.size;
      if (role == ObjectRole::kAnchor) {
        t.anchors++;
        t.anchor_bytes += o.size;
      } else if (role == ObjectRole::kDelta) {
        t.deltas++;
        t.delta_bytes += o.size;
        if (v.changed_elements.value_or(0) > 0) {
          s.bytes_per_changed_element = static_cast<double>(o.size) / *v.changed_elements;
        }
      } else {
        t.cumulative++;
        t.cumulative_bytes += o.size;
      }
    }
    if (v.files) {
      SideFileChanges c;
      for (const auto& [name, entry] : *v.files) {
        c.count++;
        c.bytes += entry.size;
        auto it = files.find(name);
        if (it == files.end()) {
          c.added.push_back(name);
        } else if (it->second.key != entry.key) {
          c.changed.push_back(name);
        }
        if (file_keys.insert(entry.key).second) {
          h.totals.file_objects++;
          h.totals.file_bytes += entry.size;
        }
      }
      for (const auto& [name, entry] : files) {
        if (!v.files->count(name)) c.removed.push_back(name);
      }
      files = *v.files;
      s.files = std::move(c);
    }
    h.totals.versions++;
    h.versions.push_back(std::move(s));
    previous = &v;
  }
  return h;
}

std::string IsoUtcTime(uint64_t unix_ms) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ms / 1000);
  std::tm utc{};
  if (gmtime_r(&seconds, &utc) == nullptr) return "?";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03" PRIu64 "Z", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, unix_ms % 1000);
  return buf;
}

}  // namespace deltasync
