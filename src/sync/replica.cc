// Replica: plan the cheapest chain (plan.h) to the target version, then
// fetch, verify and apply one object at a time; when an object turns out bad,
// plan again without it from where the replica got. Each step is all-or-nothing:
// an anchor is hashed from the downloaded bytes before it replaces anything,
// and a delta's effect on the state hash is computed from the current values
// before any of them is overwritten.
#include "deltasync/replica.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <utility>

#include "common/clock.h"
#include "common/parallel.h"
#include "deltasync/compact.h"
#include "deltasync/patch.h"
#include "deltasync/plan.h"
#include "deltasync/safetensors.h"
#include "sync/replay.h"

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

Replica::Replica(std::shared_ptr<Store> store, ReplicaOptions options)
    : store_(std::move(store)), options_(options), part_totals_(std::make_unique<replay::PartTotals>()) {}

Replica::~Replica() = default;

std::unique_ptr<Replica> Replica::Create(std::shared_ptr<Store> store, ReplicaOptions options) {
  return std::unique_ptr<Replica>(new Replica(std::move(store), options));
}

std::vector<WeightState> Replica::TakeReplacedStates() { return std::exchange(replaced_, {}); }

WeightState Replica::ReleaseState() && {
  version_ = 0;
  state_hash_ = {};
  return std::move(state_);
}

Status Replica::Refresh() {
  DS_ASSIGN_OR_RETURN(Manifest m, FetchManifest(*store_));
  // The manifest only grows; a replica must never be led backwards.
  if (version_ > 0 && (!m.Latest() || m.Latest()->version < version_)) {
    return Status::Integrity(store_->Describe() + "/" + std::string(kManifestKey) +
                             " lists no version at or above the held " + V(version_) +
                             " (the bucket was rolled back or replaced)");
  }
  // The held version listed with another state: the bucket was replaced (or
  // its manifest rewritten). The held weights are not that version's, and
  // no delta of this manifest applies to them.
  if (version_ > 0) {
    const VersionEntry* held = m.Find(version_);
    if (held != nullptr && held->state_hash != state_hash_) {
      return Status::Integrity(store_->Describe() + "/" + std::string(kManifestKey) + " lists the held " +
                               V(version_) + " with state hash " + held->state_hash.Hex() + ", not the " +
                               state_hash_.Hex() + " held (the bucket was replaced or its history rewritten)");
    }
  }
  manifest_ = std::move(m);
  // Bad objects stay bad while the manifest lists them with the same content.
  ObjectSet listed;
  for (const VersionEntry& v : manifest_.versions) {
    for (const ObjectEntry& o : v.objects) {
      for (const PartObject& stored : StoredObjects(o)) {
        if (bad_set_.count(RefOf(stored))) listed.insert(RefOf(stored));
      }
    }
  }
  std::erase_if(bad_, [&](const BadObject& b) { return !listed.count(ObjectRef{b.key, b.xxh3_128}); });
  bad_set_ = std::move(listed);
  return Status::OK();
}

std::string Replica::DescribeBad(uint64_t target) const {
  std::string out;
  for (const BadObject& b : bad_) {
    if (b.version > target) continue;
    out += (out.empty() ? "" : "; ") + b.key + " (" + V(b.version) + ": " + std::string(ErrorCodeName(b.code)) + ")";
  }
  return out;
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

  // The chain that downloads the fewest bytes (deltas from the held version,
  // or an anchor and deltas from it) among the objects not known bad; again
  // from where the replica got whenever a step finds its object bad.
  Status last_failure;
  for (;;) {
    Result<CatchUpPlan> plan = PlanCatchUp(manifest_, version_, want, bad_set_);
    if (!plan.ok()) {
      if (bad_.empty()) return plan.status().WithContext("cannot reach " + V(want));
      const std::string blocked = "no route to " + V(want) + " is left without the object(s) found bad: " +
                                  DescribeBad(want) + "; holding " + V(version_);
      if (!last_failure.ok()) return Status(last_failure.code(), last_failure.message() + "; " + blocked);
      // Found bad by an earlier update (not fetched again): that failure's kind.
      ErrorCode code = plan.status().code();
      for (const BadObject& b : bad_) {
        if (b.version <= want) code = b.code;
      }
      return Status(code, blocked);
    }
    // Routing around bad objects never takes the replica below the version
    // it holds (a route from an older anchor that then failed would leave a
    // follower serving older weights than before): stop on the held version.
    // A replica that held nothing when this update began (a fresh one, which
    // may have loaded a newer anchor in it) served nothing older: it may.
    if (!bad_set_.empty() && stats.from_version > 0 && !plan->steps.empty() &&
        plan->steps.front().object.kind == PatchKind::kAnchor && plan->steps.front().version < version_) {
      const std::string blocked = "the only route to " + V(want) + " left without the object(s) found bad (" +
                                  DescribeBad(want) + ") starts from the older anchor " +
                                  V(plan->steps.front().version) + "; holding " + V(version_);
      return Status(last_failure.ok() ? ErrorCode::kFailedPrecondition : last_failure.code(),
                    last_failure.ok() ? blocked : last_failure.message() + "; " + blocked);
    }
    bool replan = false;
    for (const PlanStep& step : plan->steps) {
      if (options_.progress) options_.progress(stats.bytes_downloaded, plan->bytes);
      const VersionEntry& entry = *manifest_.Find(step.version);
      size_t bad_part = SIZE_MAX;
      Status s = step.object.kind == PatchKind::kAnchor ? LoadAnchor(entry, step.object, stats, &bad_part)
                                                        : ApplyDelta(entry, step.object, stats, &bad_part);
      if (s.ok()) continue;
      if (!replay::ObjectFault(s)) return s;
      // A parted version's object: the part to blame, or (a mismatch of the
      // whole) every part.
      std::vector<PartObject> blamed = StoredObjects(step.object);
      if (step.object.parted() && bad_part < blamed.size()) blamed = {blamed[bad_part]};
      for (const PartObject& b : blamed) {
        bad_.push_back(BadObject{step.version, b.key, b.xxh3_128, s.code(), s.message()});
        bad_set_.insert(RefOf(b));
      }
      last_failure = s;
      replan = true;
      break;
    }
    if (!replan) {
      if (options_.progress) options_.progress(stats.bytes_downloaded, plan->bytes);
      break;
    }
  }
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
  Result<Blob> blob = replay::FetchListed(*store_, object, &stats.bytes_downloaded);
  stats.download_ms += clock.ElapsedMs();
  return blob;
}

Result<std::vector<Blob>> Replica::FetchVerifiedParts(const ObjectEntry& object, UpdateStats& stats,
                                                      size_t* bad_part) {
  Stopwatch clock;
  Result<std::vector<Blob>> parts =
      replay::FetchParts(*store_, object, options_.threads, &stats.bytes_downloaded, bad_part);
  stats.download_ms += clock.ElapsedMs();
  return parts;
}

Status Replica::LoadAnchor(const VersionEntry& entry, const ObjectEntry& object, UpdateStats& stats,
                          size_t* bad_part) {
  auto fail = [&](const Status& s) { return s.WithContext("loading anchor of " + V(entry.version)); };
  Result<replay::CheckedAnchor> anchor = Status::Internal("unset");
  Stopwatch clock;
  if (object.parted()) {
    const PartLayout* layout = manifest_.LayoutOf(entry);
    Result<std::vector<Blob>> parts = FetchVerifiedParts(object, stats, bad_part);
    if (!parts.ok()) return fail(parts.status());
    clock = Stopwatch();
    anchor = replay::CheckPartedAnchor(std::move(*parts), entry, object, *layout, options_.threads, bad_part);
  } else {
    Result<Blob> blob = FetchVerified(object, stats);
    if (!blob.ok()) return fail(blob.status());
    clock = Stopwatch();
    // Verified before copying: the held state stays untouched on any mismatch.
    anchor = replay::CheckAnchor(std::move(*blob), entry, object, options_.threads);
  }
  if (!anchor.ok()) return fail(anchor.status());
  const std::vector<TensorView>& views = anchor->views;
  if (SameLayout(state_, views)) {
    // Into the existing buffers, so that views of the state stay valid.
    std::vector<WeightState::Tensor>& tensors = state_.mutable_tensors();
    ParallelFor(tensors.size(), options_.threads, [&](size_t i) {
      if (!views[i].data.empty()) std::memcpy(tensors[i].data.data(), views[i].data.data(), views[i].data.size());
    });
  } else {
    // A compressed anchor was decoded into owned tensors: take them over.
    Result<WeightState> state = anchor->decoded ? WeightState::FromTensors(std::move(anchor->decoded->tensors))
                                                : WeightState::FromViews(views);
    if (!state.ok()) return fail(state.status());
    if (options_.keep_replaced_states && !state_.tensors().empty()) replaced_.push_back(std::move(state_));
    state_ = std::move(*state);
  }
  state_hash_ = anchor->hash;
  version_ = entry.version;
  pending_ = ChangedElements{};  // everything
  stats.anchors_applied++;
  stats.apply_ms += clock.ElapsedMs();
  return Status::OK();
}

Status Replica::ApplyDelta(const VersionEntry& entry, const ObjectEntry& object, UpdateStats& stats,
                          size_t* bad_part) {
  const std::string name = object.parted() ? "the parted delta from " + V(object.base_version.value_or(0)) : object.key;
  auto fail = [&](const Status& s) { return s.WithContext("applying delta " + name + " of " + V(entry.version)); };
  if (object.base_version != version_) {
    return fail(Status::FailedPrecondition("its base is " + V(object.base_version.value_or(0)) +
                                           " but the replica holds " + V(version_)));
  }
  Result<replay::AppliedDelta> delta = Status::Internal("unset");
  Stopwatch clock;
  if (object.parted()) {
    Result<std::vector<Blob>> parts = FetchVerifiedParts(object, stats, bad_part);
    if (!parts.ok()) return fail(parts.status());
    clock = Stopwatch();
    // Applied in place part by part, each checked as it lands; on any error the state is as it was.
    delta = replay::ApplyPartedDelta(std::move(*parts), entry, object, *manifest_.LayoutOf(entry), state_, state_hash_,
                                     *manifest_.Find(version_), options_.threads,
                                     options_.track_changes && !pending_.everything, *part_totals_, bad_part);
  } else {
    Result<Blob> blob = FetchVerified(object, stats);
    if (!blob.ok()) return fail(blob.status());
    clock = Stopwatch();
    // Applied only when it checks out; on any error the state is as it was.
    delta = replay::ApplyDelta(std::move(*blob), entry, object, state_, state_hash_, options_.threads,
                               options_.track_changes && !pending_.everything, undo_, compact_undo_);
  }
  if (!delta.ok()) {
    Status s = delta.status();
    if (s.code() == ErrorCode::kIntegrity) s = Status(s.code(), s.message() + "; the replica stays on " + V(version_));
    return fail(s);
  }
  RecordChanges(delta->changes);
  state_hash_ = delta->next;
  version_ = entry.version;
  stats.deltas_applied++;
  stats.compact_applies += delta->compact_applies;
  stats.held_applies += delta->held_applies;
  stats.stale_applies += delta->stale_applies;
  stats.apply_ms += clock.ElapsedMs();
  return Status::OK();
}

}  // namespace deltasync
