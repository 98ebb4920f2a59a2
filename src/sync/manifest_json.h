// The manifest's JSON form as its writer (manifest.cc) and its reader
// (manifest_load.cc, manifest_parse.cc) share it: the format tag and
// versions, an object's kind name, and the step from Manifest::Parse to
// the fields' checks. Internal to src/sync/.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string_view>

#include "deltasync/manifest.h"
#include "deltasync/status.h"

namespace deltasync::manifest_json {

inline constexpr std::string_view kFormatTag = "deltasync-manifest";
// 1: every version published by one process; 2: parted versions (and their
// layouts) may be listed. A writer writes 1 unless a listed version is parted.
inline constexpr uint64_t kFormatVersion = 2;
inline constexpr uint64_t kUnpartedFormatVersion = 1;

inline std::string_view KindName(PatchKind kind) { return kind == PatchKind::kAnchor ? "anchor" : "delta"; }

// The parsed document checked field by field, one rule at a time, each
// failure naming the field (manifest_parse.cc). Called by Manifest::Parse
// (manifest_load.cc) inside its try block.
Result<Manifest> ParseDocument(const nlohmann::json& doc, std::string_view label);

}  // namespace deltasync::manifest_json
