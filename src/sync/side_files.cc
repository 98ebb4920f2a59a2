// Side files in a bucket (side_files.h): content-addressed, hash-checked.
#include "deltasync/side_files.h"

#include <string>

namespace deltasync {

Result<FileSet> DescribeSideFiles(std::span<const SideFile> files) {
  FileSet set;
  for (const SideFile& f : files) {
    DS_RETURN_IF_ERROR(ValidateSideFileName(f.name));
    std::string hash = Xxh3Hex(f.bytes.bytes());
    FileEntry entry{FileObjectKey(hash), f.bytes.size(), hash};
    if (!set.emplace(f.name, std::move(entry)).second) {
      return Status::InvalidArgument("side file " + f.name + " is given twice");
    }
  }
  return set;
}

Status UploadSideFiles(Store& store, std::span<const SideFile> files, const FileSet& set) {
  for (const SideFile& f : files) {
    auto it = set.find(f.name);
    if (it == set.end()) return Status::Internal("side file " + f.name + " is not in its own listing");
    DS_RETURN_IF_ERROR(store.Put(it->second.key, f.bytes.bytes()).WithContext("uploading side file " + f.name));
  }
  return Status::OK();
}

Result<Blob> FetchSideFile(Store& store, const std::string& name, const FileEntry& entry, std::string_view what) {
  const std::string at =
      (what.empty() ? "" : std::string(what) + ": ") + "side file " + name + " (" + entry.key + ")";
  Result<Blob> blob = store.Get(entry.key);
  if (!blob.ok()) return blob.status().WithContext(at);
  if (blob->size() != entry.size) {
    return Status::Integrity(at + ": " + std::to_string(blob->size()) + " bytes, the manifest lists " +
                             std::to_string(entry.size));
  }
  std::string hash = Xxh3Hex(blob->bytes());
  if (hash != entry.xxh3_128) {
    return Status::Integrity(at + ": XXH3-128 " + hash + ", the manifest lists " + entry.xxh3_128);
  }
  return blob;
}

Result<std::vector<SideFile>> FetchSideFiles(Store& store, const FileSet& set, std::string_view what) {
  std::vector<SideFile> out;
  out.reserve(set.size());
  for (const auto& [name, entry] : set) {
    DS_ASSIGN_OR_RETURN(Blob blob, FetchSideFile(store, name, entry, what));
    out.push_back(SideFile{name, std::move(blob)});
  }
  return out;
}

Status WriteReplicaFolder(Store& store, const Replica& replica, const std::string& dir, HfWriteOptions options) {
  if (replica.version() == 0) return Status::FailedPrecondition("the replica holds no version yet; update it first");
  DS_RETURN_IF_ERROR(CheckOutsideBucket(&store, dir, "the model folder"));
  const std::string what = "version " + std::to_string(replica.version());
  DS_ASSIGN_OR_RETURN(std::vector<SideFile> files,
                      FetchSideFiles(store, replica.manifest().FilesAt(replica.version()), what));
  options.model_version = replica.version();
  std::vector<TensorView> views = replica.state().views();
  return WriteHfFolder(dir, views, files, options);
}

}  // namespace deltasync
