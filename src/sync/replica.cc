// Replica: plan the cheapest chain (plan.h) to the target version, then
// fetch, verify and apply one object at a time. Each step is all-or-nothing:
// an anchor is hashed from the downloaded bytes before it replaces anything,
// and a delta's effect on the state hash is computed from the current values
// before any of them is overwritten.
#include "deltasync/replica.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "common/clock.h"
#include "common/parallel.h"
#include "deltasync/compact.h"
#include "deltasync/patch.h"
#include "deltasync/plan.h"
#include "deltasync/safetensors.h"

namespace deltasync {
namespace {

std::string V(uint64_t version) { return "version " + std::to_string(version); }

// Adds `indices` (ascending) into `into` (ascending, unique).
void MergeIndices(std::vector<uint64_t>& into, const std::vector<uint64_t>& indices) {
  if (into.empty()) {
    into = indices;
    return;
  }
  std::vector<uint64_t> merged;
  merged.reserve(into.size() + indices.size());
  std::set_union(into.begin(), into.end(), indices.begin(), indices.end(), std::back_inserter(merged));
  into = std::move(merged);
}

// Same names, dtypes and shapes in the same (name) order.
bool SameLayout(const WeightState& state, std::span<const TensorView> views) {
  if (state.tensors().size() != views.size()) return false;
  for (size_t i = 0; i < views.size(); ++i) {
    const WeightState::Tensor& t = state.tensors()[i];
    if (t.name != views[i].name || t.dtype != views[i].dtype || t.shape != views[i].shape) return false;
  }
  return true;
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

  // The chain that downloads the fewest bytes: deltas from the held version,
  // or an anchor and deltas (step or cumulative) from it.
  Result<CatchUpPlan> plan = PlanCatchUp(manifest_, version_, want);
  if (!plan.ok()) return plan.status().WithContext("cannot reach " + V(want));
  for (const PlanStep& step : plan->steps) {
    if (options_.progress) options_.progress(stats.bytes_downloaded, plan->bytes);
    const VersionEntry& entry = *manifest_.Find(step.version);
    if (step.object.kind == PatchKind::kAnchor) {
      DS_RETURN_IF_ERROR(LoadAnchor(entry, step.object, stats));
    } else {
      DS_RETURN_IF_ERROR(ApplyDelta(entry, step.object, stats));
    }
  }
  if (options_.progress) options_.progress(stats.bytes_downloaded, plan->bytes);
  stats.to_version = version_;
  return stats;
}

Status Replica::Verify() {
  if (version_ == 0) return Status::FailedPrecondition("the replica holds no version yet; nothing to verify");
  const StateHash now = HashState(state_, options_.threads);
  if (now == state_hash_) return Status::OK();
  const uint64_t was = version_;
  const StateHash expected = state_hash_;
  version_ = 0;
  state_hash_ = {};
  pending_ = ChangedElements{};  // everything
  return Status::Integrity("the held state of " + V(was) + " hashes to " + now.Hex() + ", not " + expected.Hex() +
                           ": its memory was changed outside the replica; the next update reloads it from an anchor");
}

ChangedElements Replica::TakeChanges() {
  if (!options_.track_changes) return ChangedElements{};
  ChangedElements out = std::move(pending_);
  pending_ = ChangedElements{false, {}};
  return out;
}

void Replica::RecordChanges(std::span<const TensorChanges> changes) {
  if (!options_.track_changes || pending_.everything) return;
  // Both sorted by name: merge.
  std::vector<std::pair<std::string, std::vector<uint64_t>>> merged;
  merged.reserve(pending_.tensors.size() + changes.size());
  size_t i = 0, j = 0;
  while (i < pending_.tensors.size() || j < changes.size()) {
    if (j == changes.size() || (i < pending_.tensors.size() && pending_.tensors[i].first < changes[j].name)) {
      merged.push_back(std::move(pending_.tensors[i++]));
    } else if (i == pending_.tensors.size() || changes[j].name < pending_.tensors[i].first) {
      if (!changes[j].indices.empty()) merged.emplace_back(changes[j].name, changes[j].indices);
      ++j;
    } else {
      MergeIndices(pending_.tensors[i].second, changes[j].indices);
      merged.push_back(std::move(pending_.tensors[i++]));
      ++j;
    }
  }
  pending_.tensors = std::move(merged);
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

// Checks a decoded object's metadata against the manifest's listing.
static Status CheckListed(const PatchInfo& info, const ObjectEntry& object, uint64_t version) {
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

Status Replica::LoadAnchor(const VersionEntry& entry, const ObjectEntry& object, UpdateStats& stats) {
  auto fail = [&](const Status& s) { return s.WithContext("loading anchor of " + V(entry.version)); };
  Result<Blob> blob = FetchVerified(object, stats);
  if (!blob.ok()) return fail(blob.status());
  Stopwatch clock;
  Result<SafetensorsFile> file = SafetensorsFile::Parse(std::move(*blob), object.key);
  if (!file.ok()) return fail(file.status());
  // Raw anchors are viewed in place (the file owns the bytes); compressed
  // ones are decoded into `decoded`.
  std::optional<DecodedPatch> raw;
  std::optional<DecodedAnchor> decoded;
  std::vector<TensorView> views;
  if (object.encoding == IndexEncoding::kCompact) {
    if (!IsCompressedAnchor(*file)) {
      return fail(Status::Corruption(object.key + ": the manifest lists a compressed anchor, the file is not one"));
    }
    Result<DecodedAnchor> d = DecodeCompressedAnchor(*file, options_.threads);
    if (!d.ok()) return fail(d.status());
    PatchInfo info;
    info.kind = PatchKind::kAnchor;
    info.model_version = d->model_version;
    if (Status s = CheckListed(info, object, entry.version); !s.ok()) return fail(s);
    decoded = std::move(*d);
    views = decoded->views();
  } else {
    Result<DecodedPatch> p = DecodePatch(std::move(*file));
    if (!p.ok()) return fail(p.status());
    if (Status s = CheckListed(p->info, object, entry.version); !s.ok()) return fail(s);
    raw = std::move(*p);
    views = raw->dense;
  }
  // Verify before copying: the held state stays untouched on any mismatch.
  StateHash hash = HashTensors(views, options_.threads);
  if (hash != entry.state_hash) {
    return fail(Status::Integrity("state hash " + hash.Hex() + " does not match the manifest's " +
                                  entry.state_hash.Hex()));
  }
  if (SameLayout(state_, views)) {
    // Into the existing buffers, so that views of the state stay valid.
    std::vector<WeightState::Tensor>& tensors = state_.mutable_tensors();
    ParallelFor(tensors.size(), options_.threads, [&](size_t i) {
      if (!views[i].data.empty()) std::memcpy(tensors[i].data.data(), views[i].data.data(), views[i].data.size());
    });
  } else {
    // A compressed anchor was decoded into owned tensors: take them over.
    Result<WeightState> state =
        decoded ? WeightState::FromTensors(std::move(decoded->tensors)) : WeightState::FromViews(views);
    if (!state.ok()) return fail(state.status());
    state_ = std::move(*state);
  }
  state_hash_ = hash;
  version_ = entry.version;
  pending_ = ChangedElements{};  // everything
  stats.anchors_applied++;
  stats.apply_ms += clock.ElapsedMs();
  return Status::OK();
}

Status Replica::ApplyDelta(const VersionEntry& entry, const ObjectEntry& object, UpdateStats& stats) {
  auto fail = [&](const Status& s) { return s.WithContext("applying delta " + object.key + " of " + V(entry.version)); };
  if (object.base_version != version_) {
    return fail(Status::FailedPrecondition("its base is " + V(object.base_version.value_or(0)) +
                                           " but the replica holds " + V(version_)));
  }
  Result<Blob> blob = FetchVerified(object, stats);
  if (!blob.ok()) return fail(blob.status());
  Stopwatch clock;
  Result<SafetensorsFile> file = SafetensorsFile::Parse(std::move(*blob), object.key);
  if (!file.ok()) return fail(file.status());
  std::vector<TensorChanges> changes;
  if (object.encoding == IndexEncoding::kCompact) {
    // Decoded against the held state, whose hash must be the delta's base.
    Result<CompactDelta> d = DecodeCompactDelta(*file, state_, state_hash_, options_.threads);
    if (!d.ok()) return fail(d.status());
    d->info.kind = PatchKind::kDelta;
    if (Status s = CheckListed(d->info, object, entry.version); !s.ok()) return fail(s);
    changes = std::move(d->changes);
  } else {
    Result<DecodedPatch> p = DecodePatch(std::move(*file));
    if (!p.ok()) return fail(p.status());
    if (Status s = CheckListed(p->info, object, entry.version); !s.ok()) return fail(s);
    Status valid = ValidateChanges(state_, p->changes);
    if (!valid.ok()) return fail(valid.WithContext(object.key));
    changes = std::move(p->changes);
  }
  StateHash next = state_hash_ + HashChanges(state_, changes, options_.threads);
  if (next != entry.state_hash) {
    return fail(Status::Integrity("the state after it would hash to " + next.Hex() + ", the manifest says " +
                                  entry.state_hash.Hex() + "; the replica stays on " + V(version_)));
  }
  ApplyChanges(state_, changes, options_.threads);
  RecordChanges(changes);
  state_hash_ = next;
  version_ = entry.version;
  stats.deltas_applied++;
  stats.apply_ms += clock.ElapsedMs();
  return Status::OK();
}

}  // namespace deltasync
