// --out DIR [--keep N] [--out-layout folder|file]: every held version on
// disk, for engines that load weights from a path.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deltasync/hf_folder.h"
#include "deltasync/server.h"
#include "deltasync/store.h"
#include "server/sink.h"

namespace deltasync::server {

// Layout kFolder (the default): DIR/step_000012/ is a complete Hugging Face
// model folder (WriteHfFolder: the version's original sharding via its side
// file model.safetensors.index.json, or one model.safetensors; metadata
// format "pt" and model_version 12; the version's side files, fetched from the
// bucket and verified), built in a hidden sibling and renamed into place. Then
// the symlink DIR/latest -> step_000012 is switched (a temporary link renamed
// over it) and DIR/latest.json ({"version", "dir", "file", "state_hash",
// "size"}) replaced; both only once the folder is complete.
//
// Layout kFile: DIR/step_000012.safetensors, the full state as one plain
// checkpoint (CheckpointMetadata), written atomically, then latest.json
// ({"version", "file", "state_hash", "size"}); no latest link.
//
// Only the newest `keep` entries of the layout's kind (step_NNNNNN folders,
// or step_NNNNNN.safetensors files) are kept; nothing else in DIR is touched.
class OutDirSink : public StateSink {
 public:
  // Creates DIR when missing. kInvalidArgument for keep < 1;
  // kFailedPrecondition when DIR/latest exists and is not a symlink (kFolder),
  // or when another live process holds DIR (another daemon's --out: two would
  // replace each other's folders, and one behind would point DIR/latest back
  // at an older version). The sink holds an exclusive flock(2) on DIR itself
  // for its lifetime; the kernel drops it when the process dies.
  // `bucket`: where side files are fetched from (kFolder).
  static Result<std::unique_ptr<OutDirSink>> Open(const std::string& dir, int keep, OutLayout layout,
                                                  std::shared_ptr<Store> bucket);

  ~OutDirSink() override;
  OutDirSink(const OutDirSink&) = delete;
  OutDirSink& operator=(const OutDirSink&) = delete;

  Status Export(uint64_t version, const StateHash& hash, const WeightState& state, const FileSet& files) override;
  std::string Describe() const override { return "--out " + dir_; }

  // "step_000012.safetensors" (kFile).
  static std::string FileName(uint64_t version);
  // "step_000012" (kFolder).
  static std::string FolderName(uint64_t version);

 private:
  OutDirSink(std::shared_ptr<LocalStore> store, std::string dir, int keep, OutLayout layout,
             std::shared_ptr<Store> bucket, int lock_fd)
      : store_(std::move(store)),
        dir_(std::move(dir)),
        keep_(keep),
        layout_(layout),
        bucket_(std::move(bucket)),
        lock_fd_(lock_fd) {}
  // What latest.json says of a written version (paths relative to DIR).
  struct Written {
    std::string dir;   // "step_000012" (kFolder) or empty
    std::string file;  // the weights: the .safetensors file, or a folder's index when sharded
    uint64_t size = 0; // bytes of the weight files
  };
  Result<Written> WriteFile(uint64_t version, const WeightState& state);
  Result<Written> WriteFolder(uint64_t version, const WeightState& state, const FileSet& files);
  // The side files of `files`, from the cache or fetched and verified.
  Result<std::vector<SideFile>> SideFilesOf(uint64_t version, const FileSet& files);
  // DIR/latest -> `target`, switched atomically.
  Status PointLatestAt(const std::string& target);
  Status Prune(uint64_t newest);

  std::shared_ptr<LocalStore> store_;
  std::string dir_;
  int keep_;
  OutLayout layout_;
  std::shared_ptr<Store> bucket_;
  // The side files last fetched, and the listing they were fetched for.
  std::optional<FileSet> cached_set_;
  std::vector<SideFile> cached_files_;
  int lock_fd_;  // DIR, opened and flocked (exclusive)
};

}  // namespace deltasync::server
