// A sharded Hugging Face model folder published one part per weight file
// (`deltasync publish BUCKET DIR --parts per-file`; docs/format.md, "Model
// folders" and "Parts"): the layout holds every tensor whole, in the part of
// the file that holds it; each part is encoded and uploaded by its own
// PartPublisher, in parallel, and one PartCommitter commits the version with
// the folder's side files. Like `publish`, it is stateless: the newest state
// is rebuilt from the bucket (once, for every part).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deltasync/hf_folder.h"
#include "deltasync/parts.h"
#include "deltasync/publisher.h"
#include "deltasync/status.h"
#include "deltasync/store.h"

namespace deltasync {

// The layout of `folder` with one part per weight file that holds at least
// one element (a tensor with no elements has no block), tensors in the
// published dtypes (PublishedDType). part_files[p] is the index in
// folder.shards of part p's file.
struct FolderLayout {
  PartLayout layout;
  std::vector<size_t> part_files;
};
Result<FolderLayout> MakeFolderLayout(const HfFolder& folder, const PublisherOptions& options);

struct FolderPartsStats {
  // The committer's (upload_ms: the commit), with detect_encode_ms the parts'
  // wall time (scan, encode and upload, in parallel).
  PublishStats stats;
  uint32_t parts = 0;
  // The bucket settings --change-settings changed ("anchor_interval 10 -> 5"), as Publisher::changed_settings.
  std::vector<std::string> changed_settings;
};

// Publishes `folder` as `version` of `store`, one part per weight file.
// options.threads is shared between the parts (0: every core). Refused
// (kFailedPrecondition, naming the setting): what parted publishing does not
// support (an encoding other than compact, cumulative deltas, adaptive
// anchors), and a folder with fewer than two weight files (one part is an
// unparted version: publish it with Publisher). When any part fails, nothing
// is committed (its error is returned, naming the part's file); objects the
// other parts uploaded stay unlisted and are overwritten by the next attempt.
Result<FolderPartsStats> PublishFolderParts(std::shared_ptr<Store> store, uint64_t version, const HfFolder& folder,
                                            PublisherOptions options);

}  // namespace deltasync
