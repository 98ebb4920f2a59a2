// The manifest's fields read and checked (manifest_json.h's ParseDocument,
// the JSON form specified in docs/format.md, "Manifest"), once
// Manifest::Parse (manifest_load.cc) has parsed the document.
//
// Parse is the replicas' gate: everything a replica later relies on without
// checking again (a delta's base is listed, the first version has an anchor,
// keys are safe, hashes are well-formed) is checked here, one rule at a time,
// each failure naming the field. nlohmann_json throws; every call into it
// stays inside Manifest::Parse's try block.
#include "sync/manifest_json.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "deltasync/hf_folder.h"
#include "deltasync/manifest.h"
#include "deltasync/store.h"

namespace deltasync {
namespace {

using Json = nlohmann::json;
using manifest_json::KindName;
using manifest_json::kFormatTag;
using manifest_json::kFormatVersion;

// An anchor, the step delta, a cumulative delta, and room for one more.
constexpr size_t kMaxObjectsPerVersion = 4;

bool IsLowerHex32(const std::string& s) {
  if (s.size() != 32) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// A JSON value for a message, cut short: the offending value may be huge.
// Containers are named, not printed (dump() recurses).
std::string Snippet(const Json& j) {
  if (j.is_structured()) return std::string("an ") + j.type_name();
  std::string s = j.dump();
  return s.size() <= 60 ? s : s.substr(0, 57) + "...";
}

// Reads fields of one JSON object, turning every problem into kCorruption
// "<label>: <where>: <what>".
class FieldReader {
 public:
  FieldReader(std::string_view label, std::string where) : label_(label), where_(std::move(where)) {}

  void set_where(std::string where) { where_ = std::move(where); }
  const std::string& where() const { return where_; }

  Status Fail(const std::string& what, ErrorCode code = ErrorCode::kCorruption) const {
    std::string msg(label_);
    if (!where_.empty()) msg += ": " + where_;
    return Status(code, msg + ": " + what);
  }

  Result<const Json*> Field(const Json& obj, const char* name) const {
    auto it = obj.find(name);
    if (it == obj.end()) return Fail(std::string("missing field '") + name + "'");
    return &*it;
  }

  Result<uint64_t> Unsigned(const Json& obj, const char* name) const {
    DS_ASSIGN_OR_RETURN(const Json* v, Field(obj, name));
    // Negative numbers parse as number_integer, fractions and values beyond
    // 2^64-1 as number_float; none of them is a count.
    if (!v->is_number_unsigned()) {
      return Fail(std::string("'") + name + "' must be an integer from 0 to 2^64-1, got " + Snippet(*v));
    }
    return v->get<uint64_t>();
  }

  Result<std::string> String(const Json& obj, const char* name) const {
    DS_ASSIGN_OR_RETURN(const Json* v, Field(obj, name));
    if (!v->is_string()) return Fail(std::string("'") + name + "' must be a string, got " + Snippet(*v));
    return v->get<std::string>();
  }

  Result<std::string> Hex32(const Json& obj, const char* name) const {
    DS_ASSIGN_OR_RETURN(std::string s, String(obj, name));
    if (!IsLowerHex32(s)) {
      return Fail(std::string("'") + name + "' must be 32 lower-case hex digits, got \"" + s + "\"");
    }
    return s;
  }

 private:
  std::string_view label_;
  std::string where_;
};
Result<ObjectEntry> ParseObject(const Json& j, const FieldReader& r) {
  if (!j.is_object()) return r.Fail("must be a JSON object, got " + Snippet(j));
  ObjectEntry o;
  DS_ASSIGN_OR_RETURN(std::string kind, r.String(j, "kind"));
  if (kind == "anchor") {
    o.kind = PatchKind::kAnchor;
  } else if (kind == "delta") {
    o.kind = PatchKind::kDelta;
  } else {
    return r.Fail("unknown kind \"" + kind + "\" (expected \"anchor\" or \"delta\")");
  }
  const bool parted = j.contains("parts");
  if (parted) {
    // A parted version's object: one stored object per part.
    if (j.contains("key") || j.contains("xxh3_128")) {
      return r.Fail("an object with 'parts' has no 'key' or 'xxh3_128' of its own (each part has them)");
    }
    const Json& parts = j["parts"];
    if (!parts.is_array() || parts.empty()) return r.Fail("'parts' must be a non-empty array, got " + Snippet(parts));
    for (size_t i = 0; i < parts.size(); ++i) {
      FieldReader pr = r;
      pr.set_where(r.where() + ": parts[" + std::to_string(i) + "]");
      if (!parts[i].is_object()) return pr.Fail("must be a JSON object, got " + Snippet(parts[i]));
      PartObject p;
      DS_ASSIGN_OR_RETURN(p.key, pr.String(parts[i], "key"));
      if (Status s = ValidateKey(p.key); !s.ok()) return pr.Fail(s.message());
      DS_ASSIGN_OR_RETURN(p.size, pr.Unsigned(parts[i], "size"));
      DS_ASSIGN_OR_RETURN(p.xxh3_128, pr.Hex32(parts[i], "xxh3_128"));
      o.parts.push_back(std::move(p));
    }
  } else {
    DS_ASSIGN_OR_RETURN(o.key, r.String(j, "key"));
    // A manifest must never steer a replica outside the bucket.
    if (Status s = ValidateKey(o.key); !s.ok()) return r.Fail(s.message());
  }
  DS_ASSIGN_OR_RETURN(std::string encoding, r.String(j, "encoding"));
  Result<IndexEncoding> parsed = ParseEncoding(encoding);
  if (!parsed.ok()) {
    // nvcomp_cascaded is well-formed but not decodable here (kUnsupported);
    // anything else is not an encoding at all.
    ErrorCode code =
        parsed.status().code() == ErrorCode::kUnsupported ? ErrorCode::kUnsupported : ErrorCode::kCorruption;
    return r.Fail(parsed.status().message(), code);
  }
  o.encoding = *parsed;
  DS_ASSIGN_OR_RETURN(o.size, r.Unsigned(j, "size"));
  if (parted) {
    uint64_t sum = 0;
    for (const PartObject& p : o.parts) {
      if (p.size > UINT64_MAX - sum) return r.Fail("the sizes of its parts overflow");
      sum += p.size;
    }
    if (sum != o.size) {
      return r.Fail("'size' " + std::to_string(o.size) + " is not the sum of its parts' sizes " + std::to_string(sum));
    }
    if (o.encoding != IndexEncoding::kCompact) return r.Fail("a parted object must be compact, not " + encoding);
  } else {
    DS_ASSIGN_OR_RETURN(o.xxh3_128, r.Hex32(j, "xxh3_128"));
  }
  // base_version's relation to other versions is checked in ParseVersion.
  bool has_base = j.contains("base_version");
  if (o.kind == PatchKind::kAnchor) {
    if (has_base) return r.Fail("an anchor has no base_version");
  } else {
    if (!has_base) return r.Fail("delta has no base_version");
    DS_ASSIGN_OR_RETURN(o.base_version, r.Unsigned(j, "base_version"));
  }
  return o;
}

// A version's side files: name -> {key, size, xxh3_128}, the key the
// content address of the hash.
Result<FileSet> ParseFiles(const Json& j, const FieldReader& r) {
  if (!j.is_object()) return r.Fail("'files' must be an object, got " + Snippet(j));
  FileSet files;
  for (auto it = j.begin(); it != j.end(); ++it) {
    FieldReader fr = r;
    fr.set_where(r.where() + ": files[\"" + it.key().substr(0, 80) + "\"]");
    if (Status s = ValidateSideFileName(it.key()); !s.ok()) return fr.Fail(s.message());
    if (!it->is_object()) return fr.Fail("must be a JSON object, got " + Snippet(*it));
    FileEntry f;
    DS_ASSIGN_OR_RETURN(f.key, fr.String(*it, "key"));
    DS_ASSIGN_OR_RETURN(f.size, fr.Unsigned(*it, "size"));
    DS_ASSIGN_OR_RETURN(f.xxh3_128, fr.Hex32(*it, "xxh3_128"));
    if (f.key != FileObjectKey(f.xxh3_128)) {
      return fr.Fail("key '" + f.key + "' is not the content address " + FileObjectKey(f.xxh3_128));
    }
    files.emplace(it.key(), std::move(f));
  }
  return files;
}

Result<std::vector<uint64_t>> UnsignedArray(const Json& j, const FieldReader& r, const char* what) {
  if (!j.is_array()) return r.Fail(std::string(what) + " must be an array of integers, got " + Snippet(j));
  std::vector<uint64_t> out;
  for (const Json& e : j) {
    if (!e.is_number_unsigned()) return r.Fail(std::string(what) + " must hold integers, got " + Snippet(e));
    out.push_back(e.get<uint64_t>());
  }
  return out;
}

// One entry of the top-level "layouts" (docs/format.md, "Parts").
Result<std::pair<std::string, PartLayout>> ParseLayout(const Json& j, FieldReader r) {
  if (!j.is_object()) return r.Fail("must be a JSON object, got " + Snippet(j));
  DS_ASSIGN_OR_RETURN(std::string digest, r.Hex32(j, "digest"));
  r.set_where(r.where() + " (" + digest + ")");
  PartLayout l;
  DS_ASSIGN_OR_RETURN(const Json* tensors, r.Field(j, "tensors"));
  if (!tensors->is_array()) return r.Fail("'tensors' must be an array, got " + Snippet(*tensors));
  for (const Json& t : *tensors) {
    if (!t.is_object()) return r.Fail("'tensors' must hold objects, got " + Snippet(t));
    TensorDesc d;
    DS_ASSIGN_OR_RETURN(d.name, r.String(t, "name"));
    DS_ASSIGN_OR_RETURN(std::string dtype, r.String(t, "dtype"));
    std::optional<DType> parsed = ParseDType(dtype);
    if (!parsed) return r.Fail("tensor '" + d.name + "': unknown dtype \"" + dtype + "\"");
    d.dtype = *parsed;
    DS_ASSIGN_OR_RETURN(const Json* shape, r.Field(t, "shape"));
    DS_ASSIGN_OR_RETURN(d.shape, UnsignedArray(*shape, r, "'shape'"));
    l.tensors.push_back(std::move(d));
  }
  DS_ASSIGN_OR_RETURN(const Json* parts, r.Field(j, "parts"));
  if (!parts->is_array()) return r.Fail("'parts' must be an array, got " + Snippet(*parts));
  for (const Json& p : *parts) {
    if (!p.is_array()) return r.Fail("a part must be an array of blocks, got " + Snippet(p));
    std::vector<Block>& blocks = l.parts.emplace_back();
    for (const Json& b : p) {
      if (!b.is_array() || b.size() != 3 || !b[0].is_number_unsigned() || b[0].get<uint64_t>() > UINT32_MAX) {
        return r.Fail("a block must be [tensor index, offset, shape], got " + Snippet(b));
      }
      Block block;
      block.tensor = static_cast<uint32_t>(b[0].get<uint64_t>());
      DS_ASSIGN_OR_RETURN(block.offset, UnsignedArray(b[1], r, "a block's offset"));
      DS_ASSIGN_OR_RETURN(block.shape, UnsignedArray(b[2], r, "a block's shape"));
      blocks.push_back(std::move(block));
    }
  }
  if (Status s = l.Validate(); !s.ok()) return r.Fail(s.message());
  if (l.Digest() != digest) return r.Fail("'digest' is not the layout's digest " + l.Digest());
  return std::make_pair(std::move(digest), std::move(l));
}

// A version's "layout" and "parts", and the rules tying its objects and
// hashes to them.
Status ParseParts(const Json& j, VersionEntry& v, const std::map<std::string, PartLayout>& layouts,
                  uint64_t format_version, const FieldReader& r) {
  const bool any_parted_object =
      std::any_of(v.objects.begin(), v.objects.end(), [](const ObjectEntry& o) { return o.parted(); });
  if (!j.contains("layout")) {
    if (j.contains("parts")) return r.Fail("'parts' without 'layout'");
    if (any_parted_object) return r.Fail("an object has 'parts' but the version has no 'layout'");
    return Status::OK();
  }
  if (format_version < 2) return r.Fail("a parted version ('layout') needs format_version 2");
  DS_ASSIGN_OR_RETURN(v.layout, r.Hex32(j, "layout"));
  auto layout = layouts.find(v.layout);
  if (layout == layouts.end()) return r.Fail("'layout' " + v.layout + " is not in the manifest's 'layouts'");
  const PartLayout& l = layout->second;
  const size_t n = l.parts.size();
  DS_ASSIGN_OR_RETURN(const Json* parts, r.Field(j, "parts"));
  if (!parts->is_array() || parts->size() != n) {
    return r.Fail("'parts' must be an array of the layout's " + std::to_string(n) + " parts, got " + Snippet(*parts) +
                  (parts->is_array() ? " of " + std::to_string(parts->size()) : std::string()));
  }
  StateHash sum = l.DescriptorTerms();
  uint64_t changed = 0;
  for (size_t p = 0; p < n; ++p) {
    FieldReader pr = r;
    pr.set_where(r.where() + ": parts[" + std::to_string(p) + "]");
    if (!(*parts)[p].is_object()) return pr.Fail("must be a JSON object, got " + Snippet((*parts)[p]));
    PartState state;
    DS_ASSIGN_OR_RETURN(std::string hash, pr.Hex32((*parts)[p], "state_hash"));
    state.state_hash = *StateHash::FromHex(hash);
    DS_ASSIGN_OR_RETURN(state.changed_elements, pr.Unsigned((*parts)[p], "changed_elements"));
    if (state.changed_elements > l.PartElements(p)) {
      return pr.Fail("changed_elements " + std::to_string(state.changed_elements) + " exceeds the part's " +
                     std::to_string(l.PartElements(p)) + " elements");
    }
    sum += state.state_hash;
    changed += state.changed_elements;
    v.parts.push_back(state);
  }
  if (sum != v.state_hash) {
    return r.Fail("state_hash " + v.state_hash.Hex() + " is not the layout's descriptor terms plus its parts' hashes (" +
                  sum.Hex() + ")");
  }
  if (v.total_elements != l.total_elements()) {
    return r.Fail("total_elements " + std::to_string(v.total_elements) + " differs from the layout's " +
                  std::to_string(l.total_elements()));
  }
  if (v.changed_elements && *v.changed_elements != changed) {
    return r.Fail("changed_elements " + std::to_string(*v.changed_elements) + " is not the sum of its parts' " +
                  std::to_string(changed));
  }
  for (const ObjectEntry& o : v.objects) {
    if (o.parts.size() != n) {
      return r.Fail("a parted version's " + std::string(KindName(o.kind)) + " has " + std::to_string(o.parts.size()) +
                    " part objects; its layout has " + std::to_string(n) + " parts");
    }
  }
  return Status::OK();
}

// `listed`: versions seen so far (all lower). `keys`: key -> version, to
// refuse one object listed twice.
Result<VersionEntry> ParseVersion(const Json& j, size_t index, uint64_t previous,
                                  const std::set<uint64_t>& listed, std::map<std::string, uint64_t>& keys,
                                  const std::map<std::string, PartLayout>& layouts, uint64_t format_version,
                                  FieldReader& r) {
  std::string at = "versions[" + std::to_string(index) + "]";
  r.set_where(at);
  if (!j.is_object()) return r.Fail("must be a JSON object, got " + Snippet(j));
  VersionEntry v;
  DS_ASSIGN_OR_RETURN(v.version, r.Unsigned(j, "version"));
  at += " (version " + std::to_string(v.version) + ")";
  r.set_where(at);
  if (v.version == 0) return r.Fail("version must be positive");
  if (index > 0 && v.version <= previous) {
    return r.Fail("not above the previous version " + std::to_string(previous) +
                  "; versions must be strictly ascending");
  }
  DS_ASSIGN_OR_RETURN(std::string hash, r.Hex32(j, "state_hash"));
  Result<StateHash> state_hash = StateHash::FromHex(hash);
  if (!state_hash.ok()) return r.Fail(state_hash.status().message());
  v.state_hash = *state_hash;
  DS_ASSIGN_OR_RETURN(v.total_elements, r.Unsigned(j, "total_elements"));
  DS_ASSIGN_OR_RETURN(uint64_t changed, r.Unsigned(j, "changed_elements"));
  if (changed > v.total_elements) {
    return r.Fail("changed_elements " + std::to_string(changed) + " exceeds total_elements " +
                  std::to_string(v.total_elements));
  }
  v.changed_elements = changed;
  bool recovered = false;
  if (j.contains("recovered")) {
    if (!j["recovered"].is_boolean()) return r.Fail("'recovered' must be true or false, got " + Snippet(j["recovered"]));
    recovered = j["recovered"].get<bool>();
  }
  if (recovered) v.changed_elements = std::nullopt;  // not known: see VersionEntry
  DS_ASSIGN_OR_RETURN(v.created_unix_ms, r.Unsigned(j, "created_unix_ms"));

  DS_ASSIGN_OR_RETURN(const Json* objects, r.Field(j, "objects"));
  if (!objects->is_array()) return r.Fail("'objects' must be an array, got " + Snippet(*objects));
  if (objects->empty() || objects->size() > kMaxObjectsPerVersion) {
    return r.Fail("has " + std::to_string(objects->size()) + " objects; a version lists 1 to " +
                  std::to_string(kMaxObjectsPerVersion) + " (at most one anchor, deltas from distinct bases)");
  }
  for (size_t i = 0; i < objects->size(); ++i) {
    FieldReader obj_reader = r;
    obj_reader.set_where(at + ": objects[" + std::to_string(i) + "]");
    DS_ASSIGN_OR_RETURN(ObjectEntry o, ParseObject((*objects)[i], obj_reader));
    if (o.kind == PatchKind::kAnchor && v.anchor() != nullptr) {
      return obj_reader.Fail("a second anchor; a version has at most one");
    }
    if (o.kind == PatchKind::kDelta) {
      for (const ObjectEntry& other : v.objects) {
        if (other.kind == PatchKind::kDelta && other.base_version == o.base_version) {
          return obj_reader.Fail("a second delta from base_version " + std::to_string(*o.base_version));
        }
      }
    }
    for (const PartObject& stored : StoredObjects(o)) {
      auto [it, inserted] = keys.emplace(stored.key, v.version);
      if (!inserted) {
        return obj_reader.Fail("key '" + stored.key + "' is already listed by version " +
                               std::to_string(it->second));
      }
    }
    v.objects.push_back(std::move(o));
  }
  DS_RETURN_IF_ERROR(ParseParts(j, v, layouts, format_version, r));
  if (j.contains("files")) {
    DS_ASSIGN_OR_RETURN(v.files, ParseFiles(j["files"], r));
  }
  // Checked before the delta's base, so a first version holding only a
  // delta gets this message rather than "base not listed".
  if (index == 0 && v.anchor() == nullptr) {
    return r.Fail("the first listed version has no anchor, so a new replica could not start");
  }
  if (recovered && v.anchor() == nullptr) {
    return r.Fail("a recovered version has no anchor; it has no other route");
  }
  for (const ObjectEntry& d : v.objects) {
    if (d.kind != PatchKind::kDelta) continue;
    if (*d.base_version >= v.version) {
      return r.Fail("delta base_version " + std::to_string(*d.base_version) + " is not below the version");
    }
    if (!listed.count(*d.base_version)) {
      return r.Fail("delta base_version " + std::to_string(*d.base_version) + " is not a listed version");
    }
  }
  return v;
}

// The optional "settings" object. Fields it does not know are ignored (a
// later format may add settings whose absence means what it meant before).
Result<BucketSettings> ParseSettings(const Json& j, std::string_view label) {
  FieldReader r(label, "settings");
  if (!j.is_object()) return r.Fail("must be a JSON object, got " + Snippet(j));
  BucketSettings s;
  DS_ASSIGN_OR_RETURN(std::string encoding, r.String(j, "encoding"));
  Result<IndexEncoding> parsed = ParseEncoding(encoding);
  if (!parsed.ok()) {
    return r.Fail("'encoding' is \"" + encoding + "\"; a bucket is published as compact, gap_delta or raw");
  }
  s.encoding = *parsed;
  DS_ASSIGN_OR_RETURN(s.anchor_interval, r.Unsigned(j, "anchor_interval"));
  if (s.anchor_interval == 0) return r.Fail("'anchor_interval' must be positive");
  DS_ASSIGN_OR_RETURN(s.cumulative_interval, r.Unsigned(j, "cumulative_interval"));
  DS_ASSIGN_OR_RETURN(const Json* fraction, r.Field(j, "anchor_max_fraction"));
  if (!fraction->is_number() || !(fraction->get<double>() >= 0) || !std::isfinite(fraction->get<double>())) {
    return r.Fail("'anchor_max_fraction' must be a number >= 0, got " + Snippet(*fraction));
  }
  s.anchor_max_fraction = fraction->get<double>();
  return s;
}

}  // namespace

Result<Manifest> manifest_json::ParseDocument(const Json& doc, std::string_view label) {
  FieldReader r(label, "");
  if (!doc.is_object())
    return r.Fail("the document must be a JSON object, not " + std::string(doc.type_name()));
  // The tag first: a wrong file gets "not a manifest", not a list of field errors.
  DS_ASSIGN_OR_RETURN(std::string format, r.String(doc, "format"));
  if (format != kFormatTag) {
    return r.Fail("'format' is \"" + format + "\", expected \"" + std::string(kFormatTag) +
                  "\"; this is not a deltasync manifest");
  }
  DS_ASSIGN_OR_RETURN(uint64_t format_version, r.Unsigned(doc, "format_version"));
  if (format_version == 0) return r.Fail("'format_version' must be positive");
  if (format_version > kFormatVersion) {
    return r.Fail("format_version " + std::to_string(format_version) +
                      " is newer than this deltasync reads (" + std::to_string(kFormatVersion) +
                      "); upgrade deltasync to follow this bucket",
                  ErrorCode::kUnsupported);
  }
  Manifest m;
  DS_ASSIGN_OR_RETURN(m.anchor_interval, r.Unsigned(doc, "anchor_interval"));
  if (m.anchor_interval == 0) return r.Fail("'anchor_interval' must be positive");
  if (doc.contains("settings")) {
    DS_ASSIGN_OR_RETURN(m.settings, ParseSettings(doc["settings"], label));
  }
  if (doc.contains("writer")) {
    const Json& w = doc["writer"];
    if (!w.is_object()) return r.Fail("'writer' must be an object, got " + Snippet(w));
    WriterStamp stamp;
    FieldReader wr(label, "writer");
    DS_ASSIGN_OR_RETURN(stamp.id, wr.String(w, "id"));
    DS_ASSIGN_OR_RETURN(stamp.seq, wr.Unsigned(w, "seq"));
    bool printable = !stamp.id.empty() && stamp.id.size() <= 128;
    for (char c : stamp.id) printable = printable && c >= 0x21 && c <= 0x7E;
    if (!printable) return r.Fail("'writer.id' must be 1-128 printable ASCII characters without spaces");
    m.writer = std::move(stamp);
  }
  if (doc.contains("layouts")) {
    const Json& layouts = doc["layouts"];
    if (!layouts.is_array()) return r.Fail("'layouts' must be an array, got " + Snippet(layouts));
    for (size_t i = 0; i < layouts.size(); ++i) {
      DS_ASSIGN_OR_RETURN(auto layout, ParseLayout(layouts[i], FieldReader(label, "layouts[" + std::to_string(i) + "]")));
      if (!m.layouts.emplace(layout.first, std::move(layout.second)).second) {
        return r.Fail("layout " + layout.first + " is listed twice");
      }
    }
  }
  DS_ASSIGN_OR_RETURN(const Json* versions, r.Field(doc, "versions"));
  if (!versions->is_array()) return r.Fail("'versions' must be an array, got " + Snippet(*versions));

  std::set<uint64_t> listed;
  std::map<std::string, uint64_t> keys;
  uint64_t previous = 0;
  for (size_t i = 0; i < versions->size(); ++i) {
    DS_ASSIGN_OR_RETURN(VersionEntry v, ParseVersion((*versions)[i], i, previous, listed, keys, m.layouts, format_version, r));
    previous = v.version;
    listed.insert(v.version);
    m.versions.push_back(std::move(v));
  }
  return m;
}

}  // namespace deltasync
