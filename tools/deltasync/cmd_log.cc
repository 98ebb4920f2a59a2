// log (alias ls): a bucket's history at a glance, from its manifest alone.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "deltasync/history.h"
#include "deltasync/manifest.h"
#include "deltasync/store.h"
#include "output.h"

namespace deltasync::cli {
namespace {

nlohmann::ordered_json LogJson(const std::string& bucket, const History& h) {
  using Json = nlohmann::ordered_json;
  Json versions = Json::array();
  for (const VersionSummary& v : h.versions) {
    Json objects = Json::array();
    for (const ObjectSummary& o : v.objects) {
      Json entry = {{"role", ObjectRoleName(o.role)},
                    {"key", o.object->parted() ? Json(nullptr) : Json(o.object->key)},
                    {"encoding", EncodingName(o.object->encoding)},
                    {"size_bytes", o.object->size},
                    {"base_version", o.object->base_version ? Json(*o.object->base_version) : Json(nullptr)},
                    {"xxh3_128", o.object->parted() ? Json(nullptr) : Json(o.object->xxh3_128)}};
      if (o.object->parted()) {
        Json parts = Json::array();
        for (const PartObject& p : o.object->parts) {
          parts.push_back({{"key", p.key}, {"size_bytes", p.size}, {"xxh3_128", p.xxh3_128}});
        }
        entry["parts"] = std::move(parts);
      }
      objects.push_back(std::move(entry));
    }
    versions.push_back({{"version", v.entry->version},
                        {"created", IsoUtcTime(v.entry->created_unix_ms)},
                        {"created_unix_ms", v.entry->created_unix_ms},
                        {"total_elements", v.entry->total_elements},
                        {"changed_elements", v.entry->changed_elements ? Json(*v.entry->changed_elements)
                                                                       : Json(nullptr)},
                        {"changed_fraction", v.changed_fraction ? Json(*v.changed_fraction) : Json(nullptr)},
                        {"recovered", !v.entry->changed_elements},
                        {"bytes_per_changed_element",
                         v.bytes_per_changed_element ? Json(*v.bytes_per_changed_element) : Json(nullptr)},
                        {"encoding", v.encoding},
                        {"bytes", v.bytes},
                        {"state_hash", v.entry->state_hash.Hex()},
                        {"objects", std::move(objects)},
                        {"parts", v.entry->parted() ? Json(v.entry->parts.size()) : Json(nullptr)},
                        {"files", v.files ? Json{{"count", v.files->count},
                                                 {"bytes", v.files->bytes},
                                                 {"added", v.files->added},
                                                 {"changed", v.files->changed},
                                                 {"removed", v.files->removed}}
                                          : Json(nullptr)}});
  }
  const HistoryTotals& t = h.totals;
  return {{"bucket", bucket},
          {"versions", std::move(versions)},
          {"totals",
           {{"versions", t.versions},
            {"objects", t.objects},
            {"bytes", t.bytes},
            {"anchors", t.anchors},
            {"anchor_bytes", t.anchor_bytes},
            {"deltas", t.deltas},
            {"delta_bytes", t.delta_bytes},
            {"cumulative", t.cumulative},
            {"cumulative_bytes", t.cumulative_bytes},
            {"file_objects", t.file_objects},
            {"file_bytes", t.file_bytes}}}};
}

// "3 (12.4 KB), config.json changed, chat_template.jinja added": the set a
// version lists, and what changed against the previous one (none at first).
std::string FilesText(const SideFileChanges& c) {
  std::string out = std::to_string(c.count) + " (" + HumanBytes(static_cast<double>(c.bytes)) + ")";
  const bool first = c.changed.empty() && c.removed.empty() && c.added.size() == c.count;
  if (first) return out;
  for (const auto& [names, what] : {std::pair{&c.changed, " changed"}, {&c.added, " added"}, {&c.removed, " removed"}}) {
    for (const std::string& name : *names) out += ", " + name + what;
  }
  return out;
}

void PrintLog(const std::string& bucket, const History& h) {
  std::printf("%s\n", bucket.c_str());
  std::printf("%8s  %-24s  %9s  %9s  %-9s  %s\n", "version", "created (UTC)", "changed", "B/changed", "encoding",
              "objects");
  for (const VersionSummary& v : h.versions) {
    std::string objects;
    for (const ObjectSummary& o : v.objects) {
      if (!objects.empty()) objects += ", ";
      objects += std::string(ObjectRoleName(o.role)) + " " + HumanBytes(static_cast<double>(o.object->size));
      if (o.object->parted()) objects += " in " + std::to_string(o.object->parts.size()) + " parts";
      if (o.role == ObjectRole::kCumulative) objects += " (from " + std::to_string(*o.object->base_version) + ")";
    }
    if (v.files) objects += "; files: " + FilesText(*v.files);
    // A recovered version: how much changed is not known.
    if (!v.changed_fraction) objects += " (recovered: no base)";
    char per_changed[32] = "-", changed[32] = "?";
    if (v.bytes_per_changed_element) std::snprintf(per_changed, sizeof per_changed, "%.3f", *v.bytes_per_changed_element);
    if (v.changed_fraction) std::snprintf(changed, sizeof changed, "%.3f%%", 100.0 * *v.changed_fraction);
    std::printf("%8llu  %-24s  %9s  %9s  %-9s  %s\n", static_cast<unsigned long long>(v.entry->version),
                IsoUtcTime(v.entry->created_unix_ms).c_str(), changed, per_changed, v.encoding.c_str(),
                objects.c_str());
  }
  const HistoryTotals& t = h.totals;
  std::printf("totals: %llu version(s), %llu object(s), %s: %llu anchor(s) %s, %llu delta(s) %s, %llu cumulative %s\n",
              static_cast<unsigned long long>(t.versions), static_cast<unsigned long long>(t.objects),
              HumanBytes(static_cast<double>(t.bytes)).c_str(), static_cast<unsigned long long>(t.anchors),
              HumanBytes(static_cast<double>(t.anchor_bytes)).c_str(), static_cast<unsigned long long>(t.deltas),
              HumanBytes(static_cast<double>(t.delta_bytes)).c_str(), static_cast<unsigned long long>(t.cumulative),
              HumanBytes(static_cast<double>(t.cumulative_bytes)).c_str());
  if (t.file_objects > 0) {
    std::printf("side files: %llu object(s), %s\n", static_cast<unsigned long long>(t.file_objects),
                HumanBytes(static_cast<double>(t.file_bytes)).c_str());
  }
}

}  // namespace

Status RunLog(const LogArgs& args) {
  DS_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(args.bucket, /*create=*/false));
  DS_ASSIGN_OR_RETURN(Manifest manifest, FetchManifest(*store));
  const History history = SummarizeHistory(manifest);
  if (args.json) {
    std::printf("%s\n", LogJson(store->Describe(), history).dump().c_str());
  } else {
    PrintLog(store->Describe(), history);
  }
  return Status::OK();
}

}  // namespace deltasync::cli
