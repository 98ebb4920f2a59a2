// Checked replay steps (replay.h), shared by Replica and VerifyBucket: the
// steps over whole objects. A parted version's steps, part by part, are in
// replay_parts.cc.
#include "sync/replay.h"

#include <string>
#include <utility>

#include "deltasync/safetensors.h"
#include "sync/replay_checks.h"

namespace deltasync::replay {

std::string V(uint64_t version) { return "version " + std::to_string(version); }

// Checks a decoded object's metadata against the manifest's listing.
Status CheckListed(const PatchInfo& info, const ObjectEntry& object, uint64_t version) {
  if (info.kind != object.kind) {
    return Status::Corruption(object.key + ": the manifest lists it as " +
                              (object.kind == PatchKind::kAnchor ? "an anchor" : "a delta") +
                              " but its metadata says otherwise");
  }
  if (info.model_version != version) {
    return Status::Corruption(object.key + ": model_version " + std::to_string(info.model_version) +
                              " but the manifest lists it under " + V(version));
  }
  if (info.kind == PatchKind::kDelta && info.base_version && info.base_version != object.base_version) {
    return Status::Corruption(object.key + ": deltasync_base_version " + std::to_string(*info.base_version) +
                              " but the manifest says " + std::to_string(object.base_version.value_or(0)));
  }
  return Status::OK();
}

// Adds one fused compact apply to `out`'s counts: `totals`'s counters now
// against `held` and `stale`, theirs before the apply.
void CountApply(const CompactClassTotals& totals, uint64_t held, uint64_t stale, AppliedDelta& out) {
  out.compact_applies++;
  out.held_applies += totals.held_applies - held;
  out.stale_applies += totals.stale - stale;
}

Result<Blob> FetchListed(Store& store, const ObjectEntry& object, uint64_t* downloaded) {
  return FetchListed(store, PartObject{object.key, object.size, object.xxh3_128}, downloaded);
}

Result<Blob> FetchListed(Store& store, const PartObject& object, uint64_t* downloaded) {
  Result<Blob> blob = store.Get(object.key);
  if (!blob.ok()) {
    if (blob.status().code() == ErrorCode::kNotFound) {
      return Status::NotFound(store.Describe() + ": object '" + object.key + "' listed in the manifest is missing");
    }
    return blob.status();
  }
  *downloaded += blob->size();
  if (blob->size() != object.size) {
    return Status::Integrity(object.key + ": size " + std::to_string(blob->size()) + " bytes, manifest says " +
                             std::to_string(object.size) + " (truncated or replaced object)");
  }
  std::string got = Xxh3Hex(blob->bytes());
  if (got != object.xxh3_128) {
    return Status::Integrity(object.key + ": xxh3-128 mismatch (manifest " + object.xxh3_128 + ", object " + got +
                             ")");
  }
  return blob;
}

Result<CheckedAnchor> CheckAnchor(Blob bytes, const VersionEntry& entry, const ObjectEntry& object, int threads) {
  DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(std::move(bytes), object.key));
  CheckedAnchor out;
  if (object.encoding == IndexEncoding::kCompact) {
    if (!IsCompressedAnchor(file)) {
      return Status::Corruption(object.key + ": the manifest lists a compressed anchor, the file is not one");
    }
    DS_ASSIGN_OR_RETURN(DecodedAnchor d, DecodeCompressedAnchor(file, threads));
    PatchInfo info;
    info.kind = PatchKind::kAnchor;
    info.model_version = d.model_version;
    DS_RETURN_IF_ERROR(CheckListed(info, object, entry.version));
    out.decoded = std::move(d);
    out.views = out.decoded->views();
  } else {
    DS_ASSIGN_OR_RETURN(DecodedPatch p, DecodePatch(std::move(file)));
    DS_RETURN_IF_ERROR(CheckListed(p.info, object, entry.version));
    out.raw = std::move(p);
    out.views = out.raw->dense;
  }
  out.hash = HashTensors(out.views, threads);
  if (out.hash != entry.state_hash) {
    return Status::Integrity("state hash " + out.hash.Hex() + " does not match the manifest's " +
                             entry.state_hash.Hex());
  }
  return out;
}

Result<CheckedDelta> CheckDelta(Blob bytes, const VersionEntry& entry, const ObjectEntry& object,
                                const WeightState& base, const StateHash& base_hash, int threads) {
  DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(std::move(bytes), object.key));
  CheckedDelta out;
  if (object.encoding == IndexEncoding::kCompact) {
    // Decoded against the base, whose state hash the delta names.
    DS_ASSIGN_OR_RETURN(CompactDelta d, DecodeCompactDelta(file, base, base_hash, threads));
    d.info.kind = PatchKind::kDelta;
    DS_RETURN_IF_ERROR(CheckListed(d.info, object, entry.version));
    out.changes = std::move(d.changes);
    out.next = base_hash + d.hash_delta;  // hashed while decoding
  } else {
    DS_ASSIGN_OR_RETURN(DecodedPatch p, DecodePatch(std::move(file)));
    DS_RETURN_IF_ERROR(CheckListed(p.info, object, entry.version));
    DS_RETURN_IF_ERROR(ValidateChanges(base, p.changes).WithContext(object.key));
    out.changes = std::move(p.changes);
    out.next = base_hash + HashChanges(base, out.changes, threads);
  }
  if (out.next != entry.state_hash) {
    return Status::Integrity("the state after it would hash to " + out.next.Hex() + ", the manifest says " +
                             entry.state_hash.Hex());
  }
  return out;
}

Result<AppliedDelta> ApplyDelta(Blob bytes, const VersionEntry& entry, const ObjectEntry& object, WeightState& state,
                                const StateHash& state_hash, int threads, bool want_changes,
                                std::vector<uint8_t>& undo, CompactUndo& compact_undo) {
  AppliedDelta out;
  if (object.encoding != IndexEncoding::kCompact) {
    DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(std::move(bytes), object.key));
    DS_ASSIGN_OR_RETURN(DecodedPatch p, DecodePatch(std::move(file), DecodePatchOptions{.keep_gaps_encoded = true}));
    DS_RETURN_IF_ERROR(CheckListed(p.info, object, entry.version));
    if (!p.encoded.empty() || p.changes.empty()) {
      DS_RETURN_IF_ERROR(ValidateEncodedChanges(state, p.encoded).WithContext(object.key));
      out.next = state_hash + ApplyGapChanges(state, p.encoded, threads, undo);
      if (out.next != entry.state_hash) {
        UndoGapChanges(state, p.encoded, threads, undo);
        return Status::Integrity("the state after it would hash to " + out.next.Hex() + ", the manifest says " +
                                 entry.state_hash.Hex());
      }
      if (want_changes) out.changes = DecodeGapChanges(p.encoded);
      return out;
    }
    // Raw indices (or the older layout): decoded, then checked and applied.
    DS_RETURN_IF_ERROR(ValidateChanges(state, p.changes).WithContext(object.key));
    out.next = state_hash + HashChanges(state, p.changes, threads);
    if (out.next != entry.state_hash) {
      return Status::Integrity("the state after it would hash to " + out.next.Hex() + ", the manifest says " +
                               entry.state_hash.Hex());
    }
    ApplyChanges(state, p.changes, threads);
    if (want_changes) out.changes = std::move(p.changes);
    return out;
  }
  if (!want_changes) {
    // Decoded straight into the state (the old values logged), put back on
    // any failure.
    DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(std::move(bytes), object.key));
    const uint64_t held = compact_undo.totals.held_applies, stale = compact_undo.totals.stale;
    DS_ASSIGN_OR_RETURN(CompactDelta d, ApplyCompactDelta(file, state, state_hash, threads, compact_undo));
    CountApply(compact_undo.totals, held, stale, out);
    d.info.kind = PatchKind::kDelta;
    out.next = state_hash + d.hash_delta;
    Status listed = CheckListed(d.info, object, entry.version);
    if (!listed.ok()) {
      compact_undo.Restore(threads);
      return listed;
    }
    if (out.next != entry.state_hash) {
      compact_undo.Restore(threads);
      return Status::Integrity("the state after it would hash to " + out.next.Hex() + ", the manifest says " +
                               entry.state_hash.Hex());
    }
    return out;
  }
  DS_ASSIGN_OR_RETURN(CheckedDelta d, CheckDelta(std::move(bytes), entry, object, state, state_hash, threads));
  ApplyChanges(state, d.changes, threads);
  out.next = d.next;
  if (want_changes) out.changes = std::move(d.changes);
  return out;
}

}  // namespace deltasync::replay
