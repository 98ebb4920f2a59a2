// Retention: pruning old versions from a bucket without breaking catch-up.
//
// PruneVersions keeps the newest `keep_anchors` anchors and every version
// from the oldest kept anchor on, so every kept version stays reachable from
// a fresh start (anchor + chain) exactly as before. It removes the older
// versions from the manifest first (compare-and-swap: a publisher that
// commits meanwhile rebases onto the pruned list, see Publisher), and only
// then deletes their objects, plus the objects of kept versions whose base
// was removed (the oldest kept anchor's own step delta), and the side file
// objects (manifest.h, FileSet) that only removed versions list; the oldest
// kept version then lists its side file set itself when it inherited it
// from a removed version. A replica is never
// pointed at a deleted object by a manifest it can read afterwards; one
// that read the old manifest just before may see kNotFound for an object
// and re-plans at its next update. Objects that no version lists (left by a
// failed publish, which the next attempt overwrites) are not touched: a
// publish in flight uploads its objects before listing them. Side file
// objects are deleted last, after reading the manifest again: a publisher
// may have listed one again since (it uploads it again first, and checks it
// is there right before its commit: sync/manifest_writer.h).
//
// Before changing anything (also with dry_run), the oldest kept anchor is
// read and checked against its listing (size, XXH3-128): pruning makes it
// the only start of every kept version's chain, so a damaged or missing
// one, which replicas had routed around through an older anchor, would
// leave every kept version unreachable. kFailedPrecondition naming it then,
// and nothing is changed. That read costs the anchor's size in downloads
// (an S3 bucket of a large model: a long gc); AnchorCheck::kSize checks only
// that every object of it is there with its listed size (a missing or cut
// anchor, not one damaged in place).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deltasync/status.h"
#include "deltasync/store.h"

namespace deltasync {

struct PruneStats {
  std::vector<uint64_t> removed_versions;  // ascending
  std::vector<uint64_t> kept_anchors;      // ascending
  uint64_t kept_versions = 0;
  uint64_t objects_deleted = 0;
  uint64_t bytes_deleted = 0;  // sizes as the manifest listed them
  bool dry_run = false;
  // The oldest kept anchor's check (when versions were removed): its version
  // (0: not checked) and the bytes read to hash it (0 with AnchorCheck::kSize).
  uint64_t anchor_checked = 0;
  uint64_t anchor_bytes_read = 0;
};

// How the oldest kept anchor is checked before pruning: read whole and hashed
// (kFull, exact), or its objects' presence and sizes only (kSize).
enum class AnchorCheck { kFull, kSize };

// keep_anchors >= 1 (kInvalidArgument otherwise). With dry_run, reports what
// would be removed and changes nothing (its objects_deleted and
// bytes_deleted count every object it would delete). kConflict when another writer
// changed the manifest between reading and writing it (run again).
Result<PruneStats> PruneVersions(Store& store, uint64_t keep_anchors, bool dry_run = false,
                                 AnchorCheck anchor_check = AnchorCheck::kFull);

}  // namespace deltasync
