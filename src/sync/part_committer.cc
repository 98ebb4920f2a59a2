// PartCommitter and PartReceipt (part_publisher.h): the commit of a parted
// version, from the receipts of its parts.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "deltasync/part_publisher.h"
#include "deltasync/side_files.h"
#include "sync/manifest_writer.h"
#include "sync/notifier.h"
#include "sync/part_settings.h"

namespace deltasync {
namespace {

using Json = nlohmann::json;

std::string V(uint64_t version) { return "version " + std::to_string(version); }

bool IsLowerHex32(const std::string& s) {
  return s.size() == 32 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace

std::string PartReceipt::Serialize() const {
  nlohmann::ordered_json j;
  j["version"] = version;
  j["part"] = part;
  j["parts"] = parts;
  j["layout"] = layout;
  j["base_version"] = base_version;
  j["state_hash"] = state_hash.Hex();
  j["changed_elements"] = changed_elements;
  nlohmann::ordered_json objs = nlohmann::ordered_json::array();
  for (const Object& o : objects) {
    objs.push_back({{"kind", o.kind == PatchKind::kAnchor ? "anchor" : "delta"},
                    {"key", o.key},
                    {"size", o.size},
                    {"xxh3_128", o.xxh3_128},
                    {"base_version", o.base_version}});
  }
  j["objects"] = std::move(objs);
  if (!error.empty()) j["error"] = error;
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

Result<PartReceipt> PartReceipt::Parse(std::string_view text) {
  // get<uint32_t>() would convert any number: 98.654 to 98, -1 to 2^64-1,
  // 2^32 + 1 to 1. A field is read only when it is that type's integer.
  auto whole = [](const Json& o, const char* field, uint64_t max) -> uint64_t {
    const Json& v = o.at(field);
    if (!v.is_number_unsigned() || v.get<uint64_t>() > max) {
      throw std::invalid_argument(std::string("\"") + field + "\" is " + v.dump() + ", not an integer of 0 to " +
                                  std::to_string(max));
    }
    return v.get<uint64_t>();
  };
  constexpr uint64_t k64 = UINT64_MAX, k32 = UINT32_MAX;
  try {
    const Json j = Json::parse(text);
    PartReceipt r;
    r.version = whole(j, "version", k64);
    r.part = static_cast<uint32_t>(whole(j, "part", k32));
    r.parts = static_cast<uint32_t>(whole(j, "parts", k32));
    r.layout = j.at("layout").get<std::string>();
    r.base_version = whole(j, "base_version", k64);
    DS_ASSIGN_OR_RETURN(r.state_hash, StateHash::FromHex(j.at("state_hash").get<std::string>()));
    r.changed_elements = whole(j, "changed_elements", k64);
    if (!j.at("objects").is_array()) return Status::Corruption("part receipt: \"objects\" is not an array");
    for (const Json& o : j.at("objects")) {
      Object obj;
      const std::string kind = o.at("kind").get<std::string>();
      if (kind != "anchor" && kind != "delta") return Status::Corruption("part receipt: unknown object kind '" + kind + "'");
      obj.kind = kind == "anchor" ? PatchKind::kAnchor : PatchKind::kDelta;
      obj.key = o.at("key").get<std::string>();
      obj.size = whole(o, "size", k64);
      obj.xxh3_128 = o.at("xxh3_128").get<std::string>();
      obj.base_version = whole(o, "base_version", k64);
      r.objects.push_back(std::move(obj));
    }
    if (j.contains("error")) r.error = j.at("error").get<std::string>();
    return r;
  } catch (const std::exception& e) {
    return Status::Corruption(std::string("part receipt: ") + e.what());
  }
}

Result<std::unique_ptr<PartCommitter>> PartCommitter::Open(std::shared_ptr<Store> store, PartLayout layout,
                                                           PublisherOptions options) {
  DS_RETURN_IF_ERROR(layout.Validate());
  std::unique_ptr<PartCommitter> c(new PartCommitter());
  c->store_ = store;
  c->options_ = options;
  c->digest_ = layout.Digest();
  c->layout_ = std::move(layout);
  c->writer_id_ = NewWriterId();
  Result<Store::Versioned> current = store->GetVersioned(kManifestKey);
  if (!current.ok() && current.status().code() != ErrorCode::kNotFound) return current.status();
  if (current.ok()) {
    DS_ASSIGN_OR_RETURN(c->manifest_,
                        Manifest::Parse(current->blob.bytes(), store->Describe() + "/" + std::string(kManifestKey)));
    c->token_ = current->token;
  }
  DS_ASSIGN_OR_RETURN(c->settings_, PartedSettings(options, current.ok() ? &c->manifest_ : nullptr, store->Describe()));
  for (const VersionEntry& v : c->manifest_.versions) {
    if (v.anchor()) c->last_anchor_ = v.version;
  }
  if (const VersionEntry* latest = c->manifest_.Latest()) {
    if (latest->total_elements != c->layout_.total_elements()) {
      return Status::InvalidArgument("the layout holds " + std::to_string(c->layout_.total_elements()) +
                                     " elements; " + V(latest->version) + " of " + store->Describe() + " holds " +
                                     std::to_string(latest->total_elements));
    }
    const PartLayout* previous = c->manifest_.LayoutOf(*latest);
    if (previous && previous->tensors != c->layout_.tensors) {
      return Status::InvalidArgument("the layout's tensors (names, dtypes, shapes) differ from those of " +
                                     V(latest->version) + " in " + store->Describe());
    }
  }
  return c;
}

uint64_t PartCommitter::latest_version() const {
  const VersionEntry* latest = manifest_.Latest();
  return latest ? latest->version : 0;
}

Result<PublishStats> PartCommitter::Commit(uint64_t version, std::span<const PartReceipt> receipts,
                                          std::optional<std::span<const SideFile>> files) {
  Stopwatch clock;
  const uint64_t latest = latest_version();
  const std::string bucket = store_->Describe();
  auto refuse = [&](const std::string& why) {
    return Status::FailedPrecondition(V(version) + " not committed to " + bucket + ": " + why);
  };
  DS_RETURN_IF_ERROR(CheckNextVersion(version, latest, options_.allow_version_jump, bucket));
  const size_t n = layout_.parts.size();
  std::vector<const PartReceipt*> by_part(n, nullptr);
  for (const PartReceipt& r : receipts) {
    if (!r.error.empty()) return refuse("part " + std::to_string(r.part) + " failed: " + r.error);
    if (r.part >= n || r.parts != n) {
      return refuse("a receipt for part " + std::to_string(r.part) + " of " + std::to_string(r.parts) +
                    "; the layout has " + std::to_string(n) + " parts");
    }
    if (by_part[r.part]) return refuse("two receipts for part " + std::to_string(r.part));
    by_part[r.part] = &r;
  }
  for (size_t p = 0; p < n; ++p) {
    if (!by_part[p]) return refuse("no receipt for part " + std::to_string(p) + " (the parts must cover the model)");
  }
  const bool anchor = AnchorDue(settings_, version, latest, last_anchor_);
  VersionEntry entry;
  entry.version = version;
  entry.layout = digest_;
  entry.total_elements = layout_.total_elements();
  entry.state_hash = layout_.DescriptorTerms();
  ObjectEntry delta{PatchKind::kDelta, "", IndexEncoding::kCompact, 0, "", latest, {}};
  ObjectEntry full{PatchKind::kAnchor, "", IndexEncoding::kCompact, 0, "", std::nullopt, {}};
  for (size_t p = 0; p < n; ++p) {
    const PartReceipt& r = *by_part[p];
    const std::string part = "part " + std::to_string(p) + ": ";
    if (r.version != version) return refuse(part + "its receipt is for " + V(r.version));
    if (r.layout != digest_) return refuse(part + "its receipt is for layout " + r.layout + ", not " + digest_);
    if (r.base_version != latest) {
      return refuse(part + "published on " + V(r.base_version) + ", but the newest committed version is " +
                    std::to_string(latest));
    }
    if (r.changed_elements > layout_.PartElements(p)) return refuse(part + "more changed elements than it holds");
    const size_t want = (latest > 0 ? 1 : 0) + (anchor ? 1 : 0);
    if (r.objects.size() != want) {
      return refuse(part + "lists " + std::to_string(r.objects.size()) + " objects; " + V(version) + " needs " +
                    (anchor ? "an anchor" : "") + (anchor && latest > 0 ? " and " : "") +
                    (latest > 0 ? "a delta" : ""));
    }
    for (const PartReceipt::Object& o : r.objects) {
      if (o.kind == PatchKind::kDelta && (latest == 0 || o.base_version != latest)) {
        return refuse(part + "a delta from " + V(o.base_version));
      }
      if (o.kind == PatchKind::kAnchor && !anchor) return refuse(part + "an anchor the cadence does not call for");
      // The object's key is this part's of this version (as PartPublisher
      // names it), so no receipt can list another part's or version's object:
      // the manifest written must be one every reader parses (keys unique,
      // digests 32 lower-case hex digits), or the whole bucket is unreadable.
      const std::string expected =
          o.kind == PatchKind::kAnchor ? PartAnchorKey(version, p, n) : PartDeltaKey(version, latest, p, n);
      if (o.key != expected) {
        return refuse(part + "it lists the object '" + o.key + "'; its " +
                      (o.kind == PatchKind::kAnchor ? "anchor" : "delta") + " is '" + expected + "'");
      }
      if (!IsLowerHex32(o.xxh3_128)) {
        return refuse(part + "the XXH3-128 of '" + o.key + "' is \"" + o.xxh3_128 + "\", not 32 lower-case hex digits");
      }
      ObjectEntry& group = o.kind == PatchKind::kAnchor ? full : delta;
      if (group.parts.size() != p) return refuse(part + "two objects of one kind");
      if (o.size > UINT64_MAX - group.size) return refuse(part + "the sizes of the parts' objects overflow");
      group.parts.push_back(PartObject{o.key, o.size, o.xxh3_128});
      group.size += o.size;
    }
    entry.parts.push_back(PartState{r.state_hash, r.changed_elements});
    entry.state_hash += r.state_hash;
    entry.changed_elements = entry.changed_elements.value_or(0) + r.changed_elements;
  }
  if (latest > 0) entry.objects.push_back(std::move(delta));
  if (anchor) entry.objects.push_back(std::move(full));
  entry.created_unix_ms = UnixMillis();

  // Side files before the manifest (small): listed only when the set changed.
  if (files) {
    DS_ASSIGN_OR_RETURN(FileSet set, DescribeSideFiles(*files));
    if (set != manifest_.FilesAt(latest)) {
      DS_RETURN_IF_ERROR(
          UploadSideFiles(*store_, *files, set).WithContext("committing " + V(version) + " to " + bucket));
      entry.files = std::move(set);
    }
  }

  Manifest next = manifest_;
  next.settings = settings_;
  next.anchor_interval = settings_.anchor_interval;
  next.layouts[digest_] = layout_;
  next.versions.push_back(entry);
  DS_RETURN_IF_ERROR(CommitManifest(*store_, writer_id_, manifest_, token_, std::move(next))
                         .WithContext("committing " + V(version) + " to " + bucket));
  if (anchor) last_anchor_ = version;

  PublishStats stats;
  stats.version = version;
  stats.wrote_anchor = anchor;
  stats.wrote_delta = latest > 0;
  stats.total_elements = entry.total_elements;
  stats.changed_elements = entry.changed_elements;
  stats.delta_bytes = latest > 0 ? entry.objects.front().size : 0;
  stats.anchor_bytes = anchor ? entry.objects.back().size : 0;
  stats.upload_ms = clock.ElapsedMs();
  stats.state_hash = entry.state_hash;
  NotifyAfterCommit(notifier_, options_, version);
  return stats;
}

}  // namespace deltasync
