// Manifest::Parse (manifest.h) up to its fields (manifest_parse.cc): the
// document's size, its nesting, duplicate names in one object, and that it
// is JSON at all, checked before the fields are read; and FetchManifest, the
// bucket's manifest fetched and parsed. nlohmann_json throws; every call
// into it stays inside the try block here.
#include "deltasync/manifest.h"

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "deltasync/store.h"
#include "sync/manifest_json.h"

namespace deltasync {
namespace {

using Json = nlohmann::json;

// A manifest lists a few hundred versions; far beyond that is not a manifest
// (and parsing it would cost ~10x its size in memory).
constexpr size_t kMaxManifestBytes = size_t{64} << 20;
// The schema nests 5 levels; room for extensions, none for abuse.
constexpr size_t kMaxNesting = 32;

// The deepest nesting of arrays and objects in `json`, scanning no further
// than one level beyond `limit`. Run before parsing: nlohmann builds (and
// its serializer walks) nested values recursively and ~50 bytes per level,
// so "[[[[..." must be refused before it becomes a tree.
size_t NestingDepth(ByteSpan json, size_t limit) {
  size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (uint8_t c : json) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) break;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// Duplicate names in one JSON object would let two readers of the same
// manifest disagree (nlohmann keeps one silently); they are refused.
// The parser callback sees every object start/end and key; this tracks them.
struct DuplicateKeyFinder {
  std::vector<std::set<std::string>> open;  // one per open object or array
  std::string duplicate;                    // the first duplicate name, if any

  bool operator()(int /*depth*/, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        open.emplace_back();
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!open.empty()) open.pop_back();
        break;
      case Json::parse_event_t::key:
        if (!open.empty() && !open.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      case Json::parse_event_t::value:
        break;
    }
    return true;  // keep everything; the error is reported after parsing
  }
};

}  // namespace

Result<Manifest> Manifest::Parse(ByteSpan json, std::string_view label) {
  if (json.size() > kMaxManifestBytes) {
    return Status::Corruption(std::string(label) + ": " + std::to_string(json.size()) +
                              " bytes, more than the " + std::to_string(kMaxManifestBytes >> 20) +
                              " MiB a manifest may have");
  }
  if (NestingDepth(json, kMaxNesting) > kMaxNesting) {
    return Status::Corruption(std::string(label) + ": arrays and objects nested deeper than " +
                              std::to_string(kMaxNesting) + " levels");
  }
  try {
    DuplicateKeyFinder finder;
    Json doc = Json::parse(json.begin(), json.end(), std::ref(finder));
    if (!finder.duplicate.empty()) {
      return Status::Corruption(std::string(label) + ": field '" + finder.duplicate +
                                "' appears twice in one JSON object");
    }
    return manifest_json::ParseDocument(doc, label);
  } catch (const Json::parse_error& e) {
    return Status::Corruption(std::string(label) + ": not valid JSON: " + e.what());
  } catch (const std::exception& e) {
    // Checked accessors (manifest_parse.cc) make this unreachable; keep the promise anyway.
    return Status::Corruption(std::string(label) + ": cannot read manifest: " + e.what());
  }
}

Result<Manifest> FetchManifest(Store& store) {
  Result<Blob> bytes = store.Get(kManifestKey);
  if (!bytes.ok()) {
    if (bytes.status().code() == ErrorCode::kNotFound) {
      return Status::NotFound(store.Describe() + " has no " + std::string(kManifestKey) +
                              " (nothing published yet, or not a deltasync bucket)");
    }
    return bytes.status();
  }
  return Manifest::Parse(bytes->bytes(), store.Describe() + "/" + std::string(kManifestKey));
}

}  // namespace deltasync
