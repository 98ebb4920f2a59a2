// Replaying a bucket's objects, one checked step at a time: what a Replica
// does to move, and what VerifyBucket (verify.h) does to check a bucket
// without holding more than one state. Internal to src/sync/.
//
// Every step is all-or-nothing and leaves its inputs untouched: an object is
// checked against its listing (size, XXH3-128, then its metadata), an anchor
// is hashed from its own bytes, and a delta's resulting state hash is computed
// from its base's current values before anything is written.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "deltasync/blob.h"
#include "deltasync/compact.h"
#include "deltasync/compact_class_totals.h"
#include "deltasync/manifest.h"
#include "deltasync/parts.h"
#include "deltasync/patch.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/store.h"
#include "deltasync/weight_state.h"

namespace deltasync::replay {

// A failure that is a bucket object's fault (missing, malformed, not what
// the manifest promises: kNotFound, kCorruption, kIntegrity), not the
// store's (kIOError: an outage, a timeout) or the caller's.
inline bool ObjectFault(const Status& s) {
  return s.code() == ErrorCode::kIntegrity || s.code() == ErrorCode::kNotFound || s.code() == ErrorCode::kCorruption;
}

// Downloads `object` and checks its size and XXH3-128 against the listing.
// Adds the bytes received to *downloaded (also when the check fails).
// kNotFound: the object is missing; kIntegrity: wrong size or hash.
Result<Blob> FetchListed(Store& store, const ObjectEntry& object, uint64_t* downloaded);
Result<Blob> FetchListed(Store& store, const PartObject& object, uint64_t* downloaded);
// Every part of a parted version's `object`, fetched and checked in
// parallel (up to `threads` at once). On failure *bad_part (when given) is
// the part whose object failed.
Result<std::vector<Blob>> FetchParts(Store& store, const ObjectEntry& object, int threads, uint64_t* downloaded,
                                     size_t* bad_part = nullptr);

// An anchor's tensors, checked. `views` point into `raw` (a TRL anchor, read
// in place) or `decoded` (a compressed anchor); move the whole struct.
struct CheckedAnchor {
  std::optional<DecodedPatch> raw;
  std::optional<DecodedAnchor> decoded;
  std::vector<TensorView> views;
  StateHash hash;  // equal to entry.state_hash
};

// Decodes the anchor `object` of `entry` from its fetched bytes, checks its
// metadata against the listing and its state hash against the manifest's.
Result<CheckedAnchor> CheckAnchor(Blob bytes, const VersionEntry& entry, const ObjectEntry& object, int threads);

// A delta's changes, checked against its base: ValidateChanges(base, changes)
// holds and the state after applying them hashes to `next`, which equals
// entry.state_hash.
struct CheckedDelta {
  std::vector<TensorChanges> changes;
  StateHash next;
};

// Decodes the delta `object` of `entry` against `base` (the state of
// object.base_version, hashing to `base_hash`), and checks its metadata and
// the resulting state hash. `base` is only read.
Result<CheckedDelta> CheckDelta(Blob bytes, const VersionEntry& entry, const ObjectEntry& object,
                                const WeightState& base, const StateHash& base_hash, int threads);

// A delta applied in place by ApplyDelta.
struct AppliedDelta {
  StateHash next;                       // equal to entry.state_hash
  std::vector<TensorChanges> changes;   // only when asked for
  // Fused compact applies (a parted delta's parts one each), those of them
  // held (every chunk started from held class totals), and those that
  // found the held totals stale and were redone on the look-back route.
  uint64_t compact_applies = 0;
  uint64_t held_applies = 0;
  uint64_t stale_applies = 0;
};

// CheckDelta and ApplyChanges in one: applies the delta `object` of `entry`
// to `state` (the state of object.base_version, hashing to `state_hash`). A
// gap_delta delta applies straight from its encoded bytes in one pass
// (ApplyGapChanges) and, when the result does not hash to entry.state_hash,
// every overwritten value is put back before the kIntegrity error returns:
// on any error `state` holds what it held. A compact delta (unless
// `want_changes`) applies the same way, decoded straight into `state`
// (ApplyCompactDelta). `undo`, `compact_undo`: scratch, reused across calls.
// `want_changes`: also return the changes (for change tracking).
Result<AppliedDelta> ApplyDelta(Blob bytes, const VersionEntry& entry, const ObjectEntry& object, WeightState& state,
                                const StateHash& state_hash, int threads, bool want_changes,
                                std::vector<uint8_t>& undo, CompactUndo& compact_undo);

// Parted versions (docs/format.md, "Parts"): the same checks, part by part,
// with the parts' blocks assembled into (or mapped onto) full tensors. Each
// part's blocks must hash to the manifest's part hash, and the whole to the
// version's state hash. On a failure that one part's object is to blame for,
// *bad_part is set to that part.
//
// The anchor `object` of parted `entry` (layout `layout`) from its parts' bytes.
Result<CheckedAnchor> CheckPartedAnchor(std::vector<Blob> parts, const VersionEntry& entry, const ObjectEntry& object,
                                        const PartLayout& layout, int threads, size_t* bad_part);
// One part `p` of the parted anchor `object` of `entry`: decoded and checked
// (metadata, its blocks' names, dtypes and shapes, its part hash).
Result<DecodedAnchor> CheckAnchorPart(Blob bytes, const VersionEntry& entry, const ObjectEntry& object,
                                      const PartLayout& layout, size_t p, int threads);
// One part `p` of the parted delta `object` of `entry`, decoded against
// `blocks` (the part's blocks of its base, hashing to `part_base`) and
// checked against the manifest's part hash: its changes at block-local
// indices (ValidateChanges(blocks, changes) holds). `blocks` (views, in
// place or copies) are only read.
Result<std::vector<TensorChanges>> CheckDeltaPart(Blob bytes, const VersionEntry& entry, const ObjectEntry& object,
                                                  const PartLayout& layout, size_t p,
                                                  std::span<const TensorView> blocks, const StateHash& part_base,
                                                  int threads);
// The delta `object` of parted `entry` against the full `base` (the state of
// `base_entry`, hashing to `base_hash`; `base_layout` its layout, nullptr when
// unparted): the changes of every part mapped to full flat indices.
Result<CheckedDelta> CheckPartedDelta(std::vector<Blob> parts, const VersionEntry& entry, const ObjectEntry& object,
                                      const PartLayout& layout, const WeightState& base, const StateHash& base_hash,
                                      const VersionEntry& base_entry, int threads, size_t* bad_part);
// The class totals a replica holds for the parts of the parted versions it
// applies (CompactClassTotals, one per part, in part order) across
// versions, for the layout with digest `layout` only: ApplyPartedDelta
// forgets them for a version of another layout, and whenever it puts parts
// back. Each part's totals are keyed by its blocks' state hash (the part
// hash), as a whole state's are by its state hash.
struct PartTotals {
  std::string layout;
  std::vector<CompactClassTotals> parts;
  void Forget() {
    layout.clear();
    parts.clear();
  }
};

// CheckPartedDelta and the writes in one, for a replica: each part is
// decoded straight into its blocks of `state` where they lie (the fused
// ApplyCompactDelta, old values logged: a block that is one run of its
// tensor, a row range or a whole tensor, is a span of the held tensor; other
// blocks are copied out, applied and copied back), then checked against its
// part hash (from the undo log), and the whole against the version's hash.
// On any error every value written is put back first: `state` holds what it
// held. `want_changes`: also return the changes at full flat indices (for
// change tracking); then every part is decoded and checked before the
// changes are written. `totals` (kept by the caller across versions): each
// part's fused apply starts from its held class totals and leaves them for
// the next version; a wrong held count is caught by the walk and redone
// exactly (stale_applies). Forgotten on any error.
Result<AppliedDelta> ApplyPartedDelta(std::vector<Blob> parts, const VersionEntry& entry, const ObjectEntry& object,
                                      const PartLayout& layout, WeightState& state, const StateHash& state_hash,
                                      const VersionEntry& base_entry, int threads, bool want_changes,
                                      PartTotals& totals, size_t* bad_part);

}  // namespace deltasync::replay
