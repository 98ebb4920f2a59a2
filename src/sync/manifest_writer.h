// Writing the manifest by compare-and-swap (internal to src/sync/): the
// Publisher's and the PartCommitter's commit step.
#pragma once

#include <optional>
#include <string>

#include "deltasync/manifest.h"
#include "deltasync/status.h"
#include "deltasync/store.h"

namespace deltasync {

// A random writer id: "<host>-<pid>-<64 random bits>" (WriterStamp::id).
std::string NewWriterId();

// Writes `next`, stamped with `writer_id`, over the manifest this writer read
// as `current` (its store token `token`; nullopt: none yet), with
// Store::PutIfUnchanged. A conflict is resolved when the manifest now is
// this writer's own commit (a retried PUT that landed) or when another
// writer only pruned versions (gc) and the newest version is still
// `current`'s: then `next`'s new version is appended to the pruned list.
// Before each write, the side file objects the new version lists and no
// version before it does must be in the store with their size (a gc
// pruning the versions that listed them may just have deleted them):
// kNotFound naming the file otherwise, nothing written. On
// success `current` and `token` become the written manifest; otherwise
// kConflict (another publisher) or the store's error, and they are unchanged.
Status CommitManifest(Store& store, const std::string& writer_id, Manifest& current,
                      std::optional<std::string>& token, Manifest next);

// CheckNoOtherCommit's kConflict (also PartPublisher's): the manifest lists
// `stored_newest` (0: none), this publisher's newest is `own_newest`.
Status OtherPublisherConflict(Store& store, uint64_t stored_newest, uint64_t own_newest, uint64_t version);

// Asked right before a publish uploads the objects of `version`: their keys
// are the version's (ds/deltas/step_<version>...), the same for every
// publisher, so a publisher whose view of the bucket is stale (a zombie
// trainer beside its restarted successor) would overwrite the objects of a
// version another publisher committed, and destroy it, before its own
// commit fails. OK when manifest.json still has `token` (this writer's last
// read or write), or when only older versions were pruned (gc: the newest
// version and its state hash are still `current`'s), or when the newest
// version is `version` committed by `writer_id` itself (its write reported a
// failure but landed: a retry); otherwise kConflict naming what the other
// publisher committed, with nothing uploaded.
Status CheckNoOtherCommit(Store& store, const std::string& writer_id, const Manifest& current,
                          const std::optional<std::string>& token, uint64_t version);

}  // namespace deltasync
