// A bucket's history at a glance (deltasync log): what each version of a
// manifest stores, how much changed, and totals. Reads only the manifest.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "deltasync/manifest.h"

namespace deltasync {

// What an object is to its version: its anchor, its step delta (from the
// previous listed version), or a cumulative delta (from an older version).
enum class ObjectRole { kAnchor, kDelta, kCumulative };

// "anchor", "delta", "cumulative".
std::string_view ObjectRoleName(ObjectRole role);

struct ObjectSummary {
  ObjectRole role = ObjectRole::kDelta;
  const ObjectEntry* object = nullptr;  // into the manifest summarized
};

// A version whose `files` lists a side-file set (the set changed): the full
// set's size, and its names against the previous set (none before the first).
struct SideFileChanges {
  uint64_t count = 0, bytes = 0;  // the full set
  std::vector<std::string> added, changed, removed;  // sorted names
};

struct VersionSummary {
  const VersionEntry* entry = nullptr;  // into the manifest summarized
  std::vector<ObjectSummary> objects;   // in manifest order
  uint64_t bytes = 0;                   // of its objects
  // changed_elements / total_elements (0 for an empty model); nullopt for a
  // recovered version (VersionEntry::changed_elements unknown).
  std::optional<double> changed_fraction;
  // The step delta's size / changed_elements; nullopt without a step delta
  // or when nothing changed.
  std::optional<double> bytes_per_changed_element;
  // The encodings of its objects, distinct, in order, joined by '+'
  // ("compact", "raw+gap_delta").
  std::string encoding;
  // Set when the version lists its side files; nullopt: the previous set.
  std::optional<SideFileChanges> files;
};

struct HistoryTotals {
  uint64_t versions = 0, objects = 0, bytes = 0;
  uint64_t anchors = 0, deltas = 0, cumulative = 0;  // objects by role
  uint64_t anchor_bytes = 0, delta_bytes = 0, cumulative_bytes = 0;
  uint64_t file_objects = 0, file_bytes = 0;  // distinct side file objects (not in `objects`)
};

struct History {
  std::vector<VersionSummary> versions;  // ascending, as in the manifest
  HistoryTotals totals;
};

// REQUIRES: `manifest` outlives the result (it points into it).
History SummarizeHistory(const Manifest& manifest);

// "2025-01-31T12:34:56.789Z": a Unix time in milliseconds as ISO-8601 UTC.
std::string IsoUtcTime(uint64_t unix_ms);

}  // namespace deltasync
