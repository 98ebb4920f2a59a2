// Replica: plan a chain (anchor and/or deltas) to the target version, then
// fetch, verify and apply one version at a time. Each step is all-or-nothing:
// an anchor is hashed from the downloaded bytes before it replaces anything,
// and a delta's effect on the state hash is computed from the current values
// before any of them is overwritten.
#include "deltasync/replica.h"

#include <algorithm>

#include "common/clock.h"
#include "deltasync/patch.h"
#include "deltasync/safetensors.h"

namespace deltasync {
namespace {

std::string V(uint64_t version) { return "version " + std::to_string(version); }

struct Plan {
  std::optional<uint64_t> anchor;  // load this anchor first
  std::vector<uint64_t> deltas;    // then apply these versions' deltas, ascending
};

// Walks back from `target` through delta bases. With `from` > 0, succeeds only
// when the walk meets `from` exactly; with from == 0, stops at the first
// version that has an anchor.
Result<Plan> PlanChain(const Manifest& m, uint64_t from, uint64_t target) {
  Plan plan;
  uint64_t v = target;
  for (;;) {
    if (from > 0 && v == from) break;
    const VersionEntry* e = m.Find(v);
    if (!e) return Status::NotFound(V(v) + " is not in the manifest");
    if (from == 0 && e->anchor()) {
      plan.anchor = v;
      break;
    }
    const ObjectEntry* d = e->delta();
    if (!d || (from > 0 && *d->base_version < from)) {
      return Status::NotFound("no delta chain from " + V(from) + " to " + V(target));
    }
    plan.deltas.push_back(v);
    v = *d->base_version;
  }
  std::reverse(plan.deltas.begin(), plan.deltas.end());
  return plan;
}

}  // namespace

std::unique_ptr<Replica> Replica::Create(std::shared_ptr<Store> store, ReplicaOptions options) {
  return std::unique_ptr<Replica>(new Replica(std::move(store), options));
}

WeightState Replica::ReleaseState() && {
  version_ = 0;
  state_hash_ = {};
  return std::move(state_);
}

Status Replica::Refresh() {
  Result<Blob> bytes = store_->Get(kManifestKey);
  if (!bytes.ok()) {
    if (bytes.status().code() == ErrorCode::kNotFound) {
      return Status::NotFound(store_->Describe() + " has no " + std::string(kManifestKey) +
                              " (nothing published yet, or not a deltasync bucket)");
    }
    return bytes.status();
  }
  DS_ASSIGN_OR_RETURN(Manifest m, Manifest::Parse(bytes->bytes(), store_->Describe() + "/" + std::string(kManifestKey)));
  // The manifest only grows; a replica must never be led backwards.
  if (version_ > 0 && (!m.Latest() || m.Latest()->version < version_)) {
    return Status::Integrity(store_->Describe() + "/" + std::string(kManifestKey) +
                             " lists no version at or above the held " + V(version_) +
                             " (the bucket was rolled back or replaced)");
  }
  manifest_ = std::move(m);
  return Status::OK();
}

Result<UpdateStats> Replica::Update(std::optional<uint64_t> target) {
  DS_RETURN_IF_ERROR(Refresh());
  UpdateStats stats;
  stats.from_version = stats.to_version = version_;
  const VersionEntry* latest = manifest_.Latest();
  if (!latest) return Status::NotFound(store_->Describe() + ": the manifest lists no versions yet");
  uint64_t want = target.value_or(latest->version);
  if (want < version_) {
    return Status::InvalidArgument(V(want) + " is older than the held " + V(version_) +
                                   "; replicas only move forward");
  }
  if (want == version_) return stats;
  if (!manifest_.Find(want)) {
    return Status::NotFound(V(want) + " is not in " + store_->Describe() + "/" + std::string(kManifestKey) +
                            " (latest is " + std::to_string(latest->version) + ")");
  }

  // Deltas from the held version when they reach the target, else the
  // nearest anchor below it.
  Result<Plan> plan = Status::NotFound("no version held");
  if (version_ > 0) plan = PlanChain(manifest_, version_, want);
  if (!plan.ok()) plan = PlanChain(manifest_, 0, want);
  if (!plan.ok()) return plan.status().WithContext("cannot reach " + V(want));

  if (plan->anchor) DS_RETURN_IF_ERROR(LoadAnchor(*manifest_.Find(*plan->anchor), stats));
  for (uint64_t v : plan->deltas) DS_RETURN_IF_ERROR(ApplyDelta(*manifest_.Find(v), stats));
  stats.to_version = version_;
  return stats;
}

Result<Blob> Replica::FetchVerified(const ObjectEntry& object, UpdateStats& stats) {
  Stopwatch clock;
  Result<Blob> blob = store_->Get(object.key);
  if (!blob.ok()) {
    if (blob.status().code() == ErrorCode::kNotFound) {
      return Status::NotFound(store_->Describe() + ": object '" + object.key +
                              "' listed in the manifest is missing");
    }
    return blob.status();
  }
  stats.download_ms += clock.ElapsedMs();
  stats.bytes_downloaded += blob->size();
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

// Decodes `blob` as the patch the manifest says it is.
static Result<DecodedPatch> DecodeExpected(Blob blob, const ObjectEntry& object, uint64_t version) {
  DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(std::move(blob), object.key));
  DS_ASSIGN_OR_RETURN(DecodedPatch patch, DecodePatch(std::move(file)));
  if (patch.info.kind != object.kind) {
    return Status::Corruption(object.key + ": the manifest lists it as " +
                              (object.kind == PatchKind::kAnchor ? "an anchor" : "a delta") +
                              " but its metadata says otherwise");
  }
  if (patch.info.model_version != version) {
    return Status::Corruption(object.key + ": model_version " + std::to_string(patch.info.model_version) +
                              " but the manifest lists it under " + V(version));
  }
  return patch;
}

Status Replica::LoadAnchor(const VersionEntry& entry, UpdateStats& stats) {
  const ObjectEntry& object = *entry.anchor();
  auto fail = [&](const Status& s) { return s.WithContext("loading anchor of " + V(entry.version)); };
  Result<Blob> blob = FetchVerified(object, stats);
  if (!blob.ok()) return fail(blob.status());
  Stopwatch clock;
  Result<DecodedPatch> patch = DecodeExpected(std::move(*blob), object, entry.version);
  if (!patch.ok()) return fail(patch.status());
  // Verify before copying: the held state stays untouched on any mismatch.
  StateHash hash = HashTensors(patch->dense, options_.threads);
  if (hash != entry.state_hash) {
    return fail(Status::Integrity("state hash " + hash.Hex() + " does not match the manifest's " +
                                  entry.state_hash.Hex()));
  }
  Result<WeightState> state = WeightState::FromViews(patch->dense);
  if (!state.ok()) return fail(state.status());
  state_ = std::move(*state);
  state_hash_ = hash;
  version_ = entry.version;
  stats.anchors_applied++;
  stats.apply_ms += clock.ElapsedMs();
  return Status::OK();
}

Status Replica::ApplyDelta(const VersionEntry& entry, UpdateStats& stats) {
  const ObjectEntry& object = *entry.delta();
  auto fail = [&](const Status& s) { return s.WithContext("applying delta of " + V(entry.version)); };
  if (object.base_version != version_) {
    return fail(Status::FailedPrecondition("its base is " + V(object.base_version.value_or(0)) +
                                           " but the replica holds " + V(version_)));
  }
  Result<Blob> blob = FetchVerified(object, stats);
  if (!blob.ok()) return fail(blob.status());
  Stopwatch clock;
  Result<DecodedPatch> patch = DecodeExpected(std::move(*blob), object, entry.version);
  if (!patch.ok()) return fail(patch.status());
  if (patch->info.base_version && *patch->info.base_version != version_) {
    return fail(Status::Corruption(object.key + ": deltasync_base_version " +
                                   std::to_string(*patch->info.base_version) + " but the manifest says " +
                                   std::to_string(version_)));
  }
  Status valid = ValidateChanges(state_, patch->changes);
  if (!valid.ok()) return fail(valid.WithContext(object.key));
  StateHash next = state_hash_ + HashChanges(state_, patch->changes, options_.threads);
  if (next != entry.state_hash) {
    return fail(Status::Integrity("the state after it would hash to " + next.Hex() + ", the manifest says " +
                                  entry.state_hash.Hex() + "; the replica stays on " + V(version_)));
  }
  ApplyChanges(state_, patch->changes, options_.threads);
  state_hash_ = next;
  version_ = entry.version;
  stats.deltas_applied++;
  stats.apply_ms += clock.ElapsedMs();
  return Status::OK();
}

}  // namespace deltasync
