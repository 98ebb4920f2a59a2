// Side files in a bucket: the small non-weight files of a model folder
// (config.json, tokenizer files; hf_folder.h) stored as content-addressed
// objects "ds/files/<xxh3_128>" and listed per version in the manifest's
// `files` (manifest.h; docs/format.md, "Side files").
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "deltasync/hf_folder.h"
#include "deltasync/manifest.h"
#include "deltasync/replica.h"
#include "deltasync/status.h"
#include "deltasync/store.h"

namespace deltasync {

// The manifest's listing of `files` (sizes, hashes, content keys), without
// uploading anything. kInvalidArgument for a bad or repeated name.
Result<FileSet> DescribeSideFiles(std::span<const SideFile> files);

// Writes every object of `set` from `files` (the same files DescribeSideFiles
// was given). Objects already in the bucket are written again: a `gc` that
// pruned the last version listing one may be deleting it right now.
Status UploadSideFiles(Store& store, std::span<const SideFile> files, const FileSet& set);

// Downloads the object of side file `name` (as `entry` lists it) and checks
// its size and XXH3-128: kNotFound for a missing object, kIntegrity for a
// mismatch, naming the file, its key and `what` (when not empty).
Result<Blob> FetchSideFile(Store& store, const std::string& name, const FileEntry& entry, std::string_view what);

// Downloads the objects of `set` and checks each one's size and XXH3-128
// against it: kNotFound for a missing object, kIntegrity for a mismatch, each
// naming the file, its key and `what` (e.g. "version 12").
Result<std::vector<SideFile>> FetchSideFiles(Store& store, const FileSet& set, std::string_view what);

// Writes the version `replica` holds as a model folder at `dir`
// (WriteHfFolder): its tensors, and its side files fetched from `store` and
// verified. options.model_version is set to the replica's version.
Status WriteReplicaFolder(Store& store, const Replica& replica, const std::string& dir, HfWriteOptions options);

}  // namespace deltasync
