// Retention: pruning old versions from a bucket without breaking catch-up.
//
// PruneVersions keeps the newest `keep_anchors` anchors and every version
// from the oldest kept anchor on, so every kept version stays reachable from
// a fresh start (anchor + chain) exactly as before. It removes the older
// versions from the manifest first (compare-and-swap: a publisher that
// commits meanwhile rebases onto the pruned list, see Publisher), and only
// then deletes their objects, plus the objects of kept versions whose base
// was removed (the oldest kept anchor's own step delta, any other delta from
// a removed version), and the side file
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
// Before changing anything (also with dry_run), gc checks that every kept
// version a fresh replica reaches today, through objects that are there and
// intact, it still reaches in the pruned manifest; otherwise
// kFailedPrecondition naming the version and the damaged or missing objects,
// and nothing is changed. The cheapest sound rule: a route (anchor, then
// deltas, versions ascending) that pruning cuts uses exactly one removed
// object that leads into a kept version T (A's own step delta from A - 1,
// or any delta whose base is removed and whose version is kept: a
// cumulative delta from a removed anchor, whatever base the manifest lists;
// A = the oldest kept anchor), and from T on only kept objects. So it is
// enough that each such T (and A, which starts every kept chain) is still
// reached through kept intact objects: gc plans T's route in the pruned
// manifest the way a replica does (PlanCatchUp) and checks the objects on
// it, re-planning around each bad one. Only when none is left does it look
// at T's routes today (reading removed objects too): T unreachable today is
// not gc's to save and is pruned as it is; reachable only through removed
// objects refuses gc. A itself must always be reached (its anchor intact):
// pruning before a broken A could leave no version reachable at all. The Publisher lists a removed object leading past A
// only as A's step delta (its cumulative deltas start at the last anchor),
// so for its buckets the check reads A's anchor, as before session 50; a
// manifest written otherwise costs the route of each such T.
// AnchorCheck::kFull reads and hashes each checked object (XXH3-128, in 64
// MiB ranges): exact, and it costs their sizes in downloads (A's anchor: for
// a large model on S3 a long gc). AnchorCheck::kSize checks only that each
// is there with its listed size: no bytes read, but an object damaged in
// place passes.
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
  // The whole check: the kept versions whose routes it checked (ascending:
  // the oldest kept anchor and each kept version a removed delta leads
  // into), the objects it checked (each once) and the bytes it read to hash
  // them (anchor_bytes_read included; 0 with AnchorCheck::kSize).
  std::vector<uint64_t> routes_checked;
  uint64_t check_objects = 0;
  uint64_t check_bytes_read = 0;
};

// How the objects of the routes gc keeps are checked before pruning: read
// whole and hashed (kFull, exact), or their presence and sizes only (kSize).
enum class AnchorCheck { kFull, kSize };

// keep_anchors >= 1 (kInvalidArgument otherwise). With dry_run, reports what
// would be removed and changes nothing (its objects_deleted and
// bytes_deleted count every object it would delete). kConflict when another writer
// changed the manifest between reading and writing it (run again).
Result<PruneStats> PruneVersions(Store& store, uint64_t keep_anchors, bool dry_run = false,
                                 AnchorCheck anchor_check = AnchorCheck::kFull);

}  // namespace deltasync
