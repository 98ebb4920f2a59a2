// Replica: the inference side. Follows a bucket: loads the nearest anchor,
// replays deltas, and verifies every object (size, XXH3-128) and every state
// (state hash) against the manifest.
//
// Bit-exact or loud: an update either reaches the target version with a
// verified state or returns an error naming the version and the reason, and
// the replica stays on its last good version. A delta is decoded and checked
// completely before any byte of the state changes; a gap_delta delta then
// applies in one pass that also computes its effect on the state hash, keeping
// the values it overwrites (a few bytes per change, never a copy of the
// model) and putting them back when the result does not hash to the
// manifest's state hash. Other deltas have their effect on the hash computed
// before the state changes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "deltasync/changes.h"
#include "deltasync/compact.h"
#include "deltasync/manifest.h"
#include "deltasync/plan.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/store.h"
#include "deltasync/weight_state.h"

namespace deltasync {

namespace replay {
struct PartTotals;  // src/sync/replay.h
}

struct ReplicaOptions {
  int threads = 0;  // 0 = hardware concurrency
  // Record which elements each update changes, for TakeChanges(): costs the
  // changed indices (8 bytes each) between two TakeChanges() calls.
  bool track_changes = false;
  // When set, called from Update() before and after each object is
  // downloaded, with the bytes of this update downloaded so far and the
  // update's total: a front end can show progress (the library draws
  // nothing). The CLI's `pull` draws it on a terminal.
  std::function<void(uint64_t done, uint64_t total)> progress;
  // Keep a state that an anchor of another layout replaced (its buffers) for
  // TakeReplacedStates() instead of freeing it: a front end that handed out
  // views of the buffers (the Python binding) frees them once no view is left.
  bool keep_replaced_states = false;
};

// ReplicaOptions with only `threads` set.
inline ReplicaOptions ReplicaWithThreads(int threads) {
  ReplicaOptions options;
  options.threads = threads;
  return options;
}

// The elements of the held state that changed since the last TakeChanges().
struct ChangedElements {
  // True on the first call, after an anchor was loaded, and always without
  // ReplicaOptions::track_changes: treat every element as changed.
  bool everything = true;
  // When !everything: the tensors with changed elements, sorted by name,
  // each with its flat indices strictly ascending (the union over every
  // delta applied since the last call).
  std::vector<std::pair<std::string, std::vector<uint64_t>>> tensors;
};

struct UpdateStats {
  uint64_t from_version = 0;
  uint64_t to_version = 0;
  uint64_t anchors_applied = 0;
  uint64_t deltas_applied = 0;
  uint64_t bytes_downloaded = 0;
  double download_ms = 0;
  double apply_ms = 0;  // decode + verify + scatter
  // Compact deltas applied in place (ApplyCompactDelta; a parted delta's
  // parts count one each), those of them that started every chunk from
  // the class totals the replica held (CompactClassTotals: no look-back),
  // and those that found the held totals wrong and were redone exactly on
  // the look-back route.
  uint64_t compact_applies = 0;
  uint64_t held_applies = 0;
  uint64_t stale_applies = 0;
};

// A bucket object an update found bad (damaged, missing): not used again
// while the manifest lists it with the same content (key + XXH3-128).
struct BadObject {
  uint64_t version = 0;  // the version the object produces
  std::string key;
  std::string xxh3_128;
  ErrorCode code = ErrorCode::kIntegrity;  // kIntegrity, kNotFound or kCorruption
  std::string reason;                      // the failure, in words
};

class Replica {
 public:
  // Does not download anything yet; call Update().
  static std::unique_ptr<Replica> Create(std::shared_ptr<Store> store, ReplicaOptions options = {});
  ~Replica();

  // Moves to `target` (default: the newest version in the manifest). From no
  // state, or when `target` is not reachable by deltas from the current
  // version, starts from the nearest anchor at or below `target`.
  // Routes around damage: when an object of a step is missing (kNotFound),
  // malformed (kCorruption) or does not match its listing or the state hash
  // (kIntegrity), it is remembered as bad (bad_objects()) and the update
  // plans again without it from the version reached so far. While it routes
  // around bad objects it never goes below the version it holds: when the
  // only route left starts from an older anchor, the update stops on the
  // held version with an error saying so (a replica that held nothing when
  // the update began takes that route, even after loading a newer anchor in
  // it). A store failure (kIOError) is returned as is: it says
  // nothing about the object.
  // Errors: target missing from the manifest or older than the held version
  // (kInvalidArgument/kNotFound), or no route left without the bad objects
  // (the code of the last failure; the message lists the bad objects and the
  // versions they produce). On error, the replica holds the last version it
  // fully verified (possibly one between the start and `target`) and
  // nothing else.
  Result<UpdateStats> Update(std::optional<uint64_t> target = std::nullopt);

  // 0 when nothing is loaded yet. The tensors' buffers keep their addresses
  // across updates while the tensor set (names, dtypes, shapes) stays the
  // same: anchors are copied into them after verification.
  uint64_t version() const { return version_; }
  const WeightState& state() const { return state_; }
  // Maintained incrementally; verified against the manifest at every version.
  const StateHash& state_hash() const { return state_hash_; }
  // The manifest as last read.
  const Manifest& manifest() const { return manifest_; }
  // The objects found bad and still listed (with the same content) by the
  // manifest, in the order they were found. Forgotten once the manifest
  // stops listing them with that content.
  const std::vector<BadObject>& bad_objects() const { return bad_; }
  // Re-reads the manifest without moving. kIntegrity, keeping the manifest
  // read before, when the new one cannot describe the held state: it lists
  // nothing at or above the held version (rolled back), or lists the held
  // version with another state hash (the bucket was replaced). Update()
  // starts with it, so it then fails the same way and holds its version.
  Status Refresh();
  // Recomputes the held state's hash from its bytes (O(model), about 0.1 s
  // per GB per thread) and compares it with the manifest's for the held
  // version: catches memory changed behind the replica's back, such as a
  // consumer writing into views of the state. On a mismatch: kIntegrity
  // naming the version, and the replica no longer vouches for its state
  // (version() becomes 0, so the next Update() reloads from an anchor, into
  // the same buffers). kFailedPrecondition when nothing is held.
  Status Verify();
  // What changed since the previous call (see ChangedElements), and resets
  // the record. A consumer that mirrors the state elsewhere (a GPU copy)
  // copies only these elements.
  ChangedElements TakeChanges();
  // The states replaced since the previous call, oldest first (always empty
  // without ReplicaOptions::keep_replaced_states).
  std::vector<WeightState> TakeReplacedStates();
  // Gives up the state (the replica is empty afterwards).
  WeightState ReleaseState() &&;

 private:
  Replica(std::shared_ptr<Store> store, ReplicaOptions options);
  Result<Blob> FetchVerified(const ObjectEntry& object, UpdateStats& stats);
  // Every part of a parted object, fetched in parallel (see *bad_part below).
  Result<std::vector<Blob>> FetchVerifiedParts(const ObjectEntry& object, UpdateStats& stats, size_t* bad_part);
  // For a parted version's object, *bad_part is the part to blame for a
  // failure (SIZE_MAX: none in particular).
  Status LoadAnchor(const VersionEntry& entry, const ObjectEntry& object, UpdateStats& stats, size_t* bad_part);
  Status ApplyDelta(const VersionEntry& entry, const ObjectEntry& object, UpdateStats& stats, size_t* bad_part);
  void RecordChanges(std::span<const TensorChanges> changes);
  // The bad objects of versions up to `target`, in words.
  std::string DescribeBad(uint64_t target) const;

  std::shared_ptr<Store> store_;
  ReplicaOptions options_;
  Manifest manifest_;
  WeightState state_;
  StateHash state_hash_;
  uint64_t version_ = 0;
  ChangedElements pending_;  // since the last TakeChanges()
  std::vector<uint8_t> undo_;  // the values a gap_delta delta overwrote (reused)
  CompactUndo compact_undo_;   // the same for a compact delta (and the class totals it holds)
  std::unique_ptr<replay::PartTotals> part_totals_;  // the class totals held for a parted delta's parts
  std::vector<BadObject> bad_;
  ObjectSet bad_set_;  // the same objects, for PlanCatchUp
  std::vector<WeightState> replaced_;  // ReplicaOptions::keep_replaced_states
};

}  // namespace deltasync
