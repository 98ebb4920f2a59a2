// PruneVersions (retention.h): manifest first, then objects.
#include "deltasync/retention.h"

#include <map>
#include <set>

#include "deltasync/manifest.h"
#include "sync/retention_routes.h"

namespace deltasync {
namespace {

// After a failed delete: no version lists the objects of the removed
// versions any more, so no later gc finds them (it deletes only what the
// versions it removes list).
std::string LeftBehind(const PruneStats& stats, const std::string& key) {
  return "the manifest no longer lists " + key + " but deleting it failed; no later gc will find it or the other " +
         "objects of the removed versions " + std::to_string(stats.removed_versions.front()) + "-" +
         std::to_string(stats.removed_versions.back()) + " not deleted yet (weight objects under anchors/, deltas/, " +
         "ds/): delete those by hand";
}

}  // namespace

Result<PruneStats> PruneVersions(Store& store, uint64_t keep_anchors, bool dry_run, AnchorCheck anchor_check) {
  if (keep_anchors == 0) {
    return Status::InvalidArgument("--keep-anchors must be at least 1: a bucket without an anchor cannot start a replica");
  }
  const std::string where = store.Describe() + "/" + std::string(kManifestKey);
  Result<Store::Versioned> current = store.GetVersioned(kManifestKey);
  if (!current.ok()) {
    if (current.status().code() == ErrorCode::kNotFound) {
      return Status::NotFound(store.Describe() + " has no " + std::string(kManifestKey) + "; nothing to prune");
    }
    return current.status();
  }
  DS_ASSIGN_OR_RETURN(Manifest manifest, Manifest::Parse(current->blob.bytes(), where));

  PruneStats stats;
  stats.dry_run = dry_run;
  std::vector<uint64_t> anchors;
  for (const VersionEntry& v : manifest.versions) {
    if (v.anchor()) anchors.push_back(v.version);
  }
  const size_t first_kept = anchors.size() > keep_anchors ? anchors.size() - keep_anchors : 0;
  stats.kept_anchors.assign(anchors.begin() + static_cast<std::ptrdiff_t>(first_kept), anchors.end());
  const uint64_t oldest_kept = stats.kept_anchors.empty() ? 0 : stats.kept_anchors.front();

  Manifest pruned = manifest;
  pruned.versions.clear();
  std::vector<PartObject> doomed;  // stored objects (a parted version's object has one per part)
  auto doom = [&](const ObjectEntry& o) {
    for (PartObject& stored : StoredObjects(o)) doomed.push_back(std::move(stored));
  };
  std::set<uint64_t> kept;
  std::set<uint64_t> entered;  // kept versions a removed version's delta leads into
  // Side file objects: content-addressed, so shared between versions; one is
  // doomed when only removed versions list it.
  std::map<std::string, uint64_t> removed_files, kept_files;  // key -> size
  for (const VersionEntry& v : manifest.versions) {
    if (v.version < oldest_kept) {
      stats.removed_versions.push_back(v.version);
      for (const ObjectEntry& o : v.objects) doom(o);
      if (v.files) {
        for (const auto& [name, f] : *v.files) removed_files.emplace(f.key, f.size);
      }
      continue;
    }
    VersionEntry entry = v;
    // The oldest kept version may inherit its side files from a removed
    // one: it lists the set itself from now on.
    if (kept.empty() && !entry.files) {
      FileSet inherited = manifest.FilesAt(v.version);
      if (!inherited.empty()) entry.files = std::move(inherited);
    }
    if (entry.files) {
      for (const auto& [name, f] : *entry.files) kept_files.emplace(f.key, f.size);
    }
    entry.objects.clear();
    for (const ObjectEntry& o : v.objects) {
      // A delta from a removed version is of no use to anyone any more.
      if (o.kind == PatchKind::kDelta && !kept.count(*o.base_version)) {
        doom(o);
        entered.insert(v.version);
      } else {
        entry.objects.push_back(o);
      }
    }
    kept.insert(v.version);
    pruned.versions.push_back(std::move(entry));
  }
  stats.kept_versions = pruned.versions.size();
  std::vector<PartObject> doomed_files;  // deleted last, after a second look at the manifest
  for (const auto& [key, size] : removed_files) {
    // Only key and size are read below.
    if (!kept_files.count(key)) doomed_files.push_back(PartObject{key, size, ""});
  }
  for (const PartObject& o : doomed) stats.bytes_deleted += o.size;
  for (const PartObject& o : doomed_files) stats.bytes_deleted += o.size;
  if (!stats.removed_versions.empty()) {
    DS_RETURN_IF_ERROR(CheckKeptRoutes(store, manifest, pruned, entered, keep_anchors, anchor_check, &stats));
  }
  if (dry_run || (doomed.empty() && doomed_files.empty())) {
    stats.objects_deleted = dry_run ? doomed.size() + doomed_files.size() : 0;
    return stats;
  }

  // The manifest first: from here on no reader is sent to the doomed objects.
  // The writer stamp stays the publisher's, so its own conflict check still
  // recognises its commits.
  std::string json = pruned.ToJson();
  ByteSpan bytes(reinterpret_cast<const uint8_t*>(json.data()), json.size());
  Result<std::string> written = store.PutIfUnchanged(kManifestKey, std::span<const ByteSpan>(&bytes, 1), current->token);
  if (!written.ok()) {
    if (written.status().code() == ErrorCode::kConflict) {
      return Status::Conflict(where + " changed while pruning (a publish landed); nothing was deleted, run gc again");
    }
    return written.status().WithContext("pruning " + where);
  }
  for (const PartObject& o : doomed) {
    Status deleted = store.Delete(o.key);
    if (!deleted.ok() && deleted.code() != ErrorCode::kNotFound) {
      return deleted.WithContext(LeftBehind(stats, o.key));
    }
    stats.objects_deleted++;
  }
  if (doomed_files.empty()) return stats;
  // Side file objects are named by their content: a publisher may have
  // uploaded one of them again for its new version and listed it since the
  // write above (CommitManifest rebases onto the pruned list). Those that
  // the manifest lists now stay.
  Result<Manifest> now = FetchManifest(store);
  if (!now.ok()) {
    // Left in the bucket: small, and a later publish may list them again.
    return now.status().WithContext("rereading the manifest before deleting the side file objects only the removed "
                                    "versions listed failed; they stay (do not delete them by hand: a publish may "
                                    "list them again)");
  }
  std::set<std::string> listed;
  for (const VersionEntry& v : now->versions) {
    if (!v.files) continue;
    for (const auto& [name, f] : *v.files) listed.insert(f.key);
  }
  for (const PartObject& o : doomed_files) {
    if (listed.count(o.key)) {
      stats.bytes_deleted -= o.size;
      continue;
    }
    Status deleted = store.Delete(o.key);
    if (!deleted.ok() && deleted.code() != ErrorCode::kNotFound) {
      return deleted.WithContext("deleting the side file object " + o.key + ", which no version lists, failed; it "
                                 "stays (do not delete it by hand: a publish may list it again)");
    }
    stats.objects_deleted++;
  }
  return stats;
}

}  // namespace deltasync
