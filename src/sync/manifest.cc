// The manifest (manifest.h): object keys, XXH3-128 digests, the lookups,
// and the JSON form specified in docs/format.md, "Manifest", as written.
// Reading it is Manifest::Parse: the gate before the fields
// (manifest_load.cc) and the fields' checks (manifest_parse.cc).
#include "deltasync/manifest.h"
#include "sync/xxh_hex.h"

#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "sync/manifest_json.h"

namespace deltasync {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;
using manifest_json::KindName;
using manifest_json::kFormatTag;
using manifest_json::kFormatVersion;
using manifest_json::kUnpartedFormatVersion;

std::string StepKey(const char* dir, uint64_t version) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s/step_%06" PRIu64 ".safetensors", dir, version);
  return buf;
}

// One version as a compact JSON object, fields in the documented order.
OrderedJson VersionToJson(const VersionEntry& v) {
  OrderedJson out;
  out["version"] = v.version;
  out["state_hash"] = v.state_hash.Hex();
  out["total_elements"] = v.total_elements;
  // A recovered version: total_elements, for readers that need the field.
  out["changed_elements"] = v.changed_elements.value_or(v.total_elements);
  if (!v.changed_elements) out["recovered"] = true;
  out["created_unix_ms"] = v.created_unix_ms;
  OrderedJson objects = OrderedJson::array();
  for (const ObjectEntry& o : v.objects) {
    OrderedJson obj;
    obj["kind"] = KindName(o.kind);
    if (!o.parted()) obj["key"] = o.key;
    obj["encoding"] = EncodingName(o.encoding);
    obj["size"] = o.size;
    if (!o.parted()) obj["xxh3_128"] = o.xxh3_128;
    if (o.base_version) obj["base_version"] = *o.base_version;
    if (o.parted()) {
      OrderedJson parts = OrderedJson::array();
      for (const PartObject& p : o.parts) {
        OrderedJson part;
        part["key"] = p.key;
        part["size"] = p.size;
        part["xxh3_128"] = p.xxh3_128;
        parts.push_back(std::move(part));
      }
      obj["parts"] = std::move(parts);
    }
    objects.push_back(std::move(obj));
  }
  out["objects"] = std::move(objects);
  if (v.files) {
    OrderedJson files = OrderedJson::object();
    for (const auto& [name, f] : *v.files) {
      OrderedJson entry;
      entry["key"] = f.key;
      entry["size"] = f.size;
      entry["xxh3_128"] = f.xxh3_128;
      files[name] = std::move(entry);
    }
    out["files"] = std::move(files);
  }
  if (v.parted()) {
    out["layout"] = v.layout;
    OrderedJson parts = OrderedJson::array();
    for (const PartState& p : v.parts) {
      OrderedJson part;
      part["state_hash"] = p.state_hash.Hex();
      part["changed_elements"] = p.changed_elements;
      parts.push_back(std::move(part));
    }
    out["parts"] = std::move(parts);
  }
  return out;
}

OrderedJson LayoutToJson(const std::string& digest, const PartLayout& l) {
  OrderedJson out;
  out["digest"] = digest;
  OrderedJson tensors = OrderedJson::array();
  for (const TensorDesc& t : l.tensors) {
    OrderedJson tj;
    tj["name"] = t.name;
    tj["dtype"] = DTypeName(t.dtype);
    tj["shape"] = t.shape;
    tensors.push_back(std::move(tj));
  }
  out["tensors"] = std::move(tensors);
  OrderedJson parts = OrderedJson::array();
  for (const std::vector<Block>& part : l.parts) {
    OrderedJson pj = OrderedJson::array();
    for (const Block& b : part) pj.push_back(OrderedJson::array({b.tensor, b.offset, b.shape}));
    parts.push_back(std::move(pj));
  }
  out["parts"] = std::move(parts);
  return out;
}

}  // namespace

std::string AnchorKey(uint64_t version) { return StepKey("anchors", version); }
std::string DeltaKey(uint64_t version) { return StepKey("deltas", version); }
std::string CompressedAnchorKey(uint64_t version) { return StepKey("ds/anchors", version); }
std::string CompactDeltaKey(uint64_t version) { return StepKey("ds/deltas", version); }
std::string CumulativeDeltaKey(uint64_t base_version, uint64_t version, IndexEncoding encoding) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "ds/cumulative/step_%06" PRIu64 "_from_%06" PRIu64 ".%s.safetensors", version,
                base_version, std::string(EncodingName(encoding)).c_str());
  return buf;
}

std::string FileObjectKey(std::string_view xxh3_128) { return "ds/files/" + std::string(xxh3_128); }

std::string Xxh3Hex(std::span<const ByteSpan> parts) {
  XXH3_state_t* state = XXH3_createState();
  XXH128_hash_t hash;
  if (state != nullptr) {
    XXH3_128bits_reset(state);
    for (ByteSpan part : parts) {
      if (!part.empty()) XXH3_128bits_update(state, part.data(), part.size());
    }
    hash = XXH3_128bits_digest(state);
    XXH3_freeState(state);
  } else {
    // Out of memory for 600 bytes of state: hash one joined copy instead
    // (slow, but the answer is the same and there is no error to report).
    std::vector<uint8_t> joined;
    for (ByteSpan part : parts) joined.insert(joined.end(), part.begin(), part.end());
    hash = XXH3_128bits(joined.data(), joined.size());
  }
  return Xxh128Hex(hash);
}

std::string Xxh128Hex(const XXH128_hash_t& hash) {
  // Canonical form: big-endian, high 64 bits first, as xxhsum prints it.
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, hash);
  static const char kHex[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[2 * i] = kHex[canonical.digest[i] >> 4];
    out[2 * i + 1] = kHex[canonical.digest[i] & 15];
  }
  return out;
}

std::vector<PartObject> StoredObjects(const ObjectEntry& object) {
  if (object.parted()) return object.parts;
  return {PartObject{object.key, object.size, object.xxh3_128}};
}

const PartLayout* Manifest::LayoutOf(const VersionEntry& v) const {
  if (!v.parted()) return nullptr;
  auto it = layouts.find(v.layout);
  return it == layouts.end() ? nullptr : &it->second;
}

const ObjectEntry* VersionEntry::anchor() const {
  for (const ObjectEntry& o : objects) {
    if (o.kind == PatchKind::kAnchor) return &o;
  }
  return nullptr;
}

const ObjectEntry* VersionEntry::delta() const {
  const ObjectEntry* newest = nullptr;
  for (const ObjectEntry& o : objects) {
    if (o.kind == PatchKind::kDelta && (!newest || *o.base_version > *newest->base_version)) newest = &o;
  }
  return newest;
}

const VersionEntry* Manifest::Find(uint64_t version) const {
  // versions is strictly ascending (Parse checks it; the publisher appends).
  auto it = std::lower_bound(versions.begin(), versions.end(), version,
                             [](const VersionEntry& v, uint64_t want) { return v.version < want; });
  return it != versions.end() && it->version == version ? &*it : nullptr;
}

FileSet Manifest::FilesAt(uint64_t version) const {
  auto it = std::upper_bound(versions.begin(), versions.end(), version,
                             [](uint64_t want, const VersionEntry& v) { return want < v.version; });
  while (it != versions.begin()) {
    --it;
    if (it->files) return *it->files;
  }
  return {};
}

const VersionEntry* Manifest::Latest() const { return versions.empty() ? nullptr : &versions.back(); }

// Layout: the top level indented by two spaces, then one compact line per
// version, so the file reads (and diffs, and greps) one version per line
// while staying small. Field order is fixed, so equal manifests give equal bytes.
std::string Manifest::ToJson() const {
  // Keys are not checked for UTF-8 here (ValidateKey does not require it);
  // "replace" keeps dump() from throwing, and Parse then sees the changed key.
  auto dump = [](const OrderedJson& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); };
  std::string out = "{\n";
  out += "  \"format\": " + dump(OrderedJson(kFormatTag)) + ",\n";
  std::set<std::string> used;  // layouts the versions refer to
  for (const VersionEntry& v : versions) {
    if (v.parted()) used.insert(v.layout);
  }
  out += "  \"format_version\": " + std::to_string(used.empty() ? kUnpartedFormatVersion : kFormatVersion) + ",\n";
  out += "  \"anchor_interval\": " + std::to_string(settings ? settings->anchor_interval : anchor_interval) + ",\n";
  if (settings) {
    OrderedJson s;
    s["encoding"] = EncodingName(settings->encoding);
    s["anchor_interval"] = settings->anchor_interval;
    s["cumulative_interval"] = settings->cumulative_interval;
    s["anchor_max_fraction"] = settings->anchor_max_fraction;
    out += "  \"settings\": " + dump(s) + ",\n";
  }
  if (writer) {
    out += "  \"writer\": {\"id\": " + dump(OrderedJson(writer->id)) + ", \"seq\": " + std::to_string(writer->seq) +
           "},\n";
  }
  if (!used.empty()) {
    out += "  \"layouts\": [\n";
    size_t i = 0;
    for (const std::string& digest : used) {
      auto it = layouts.find(digest);
      out += "    " + (it == layouts.end() ? std::string("null") : dump(LayoutToJson(digest, it->second)));
      out += ++i < used.size() ? ",\n" : "\n";
    }
    out += "  ],\n";
  }
  if (versions.empty()) {
    out += "  \"versions\": []\n";
  } else {
    out += "  \"versions\": [\n";
    for (size_t i = 0; i < versions.size(); ++i) {
      out += "    " + dump(VersionToJson(versions[i]));
      out += i + 1 < versions.size() ? ",\n" : "\n";
    }
    out += "  ]\n";
  }
  out += "}\n";
  return out;
}

}  // namespace deltasync
