// VerifyBucket (verify.h): replays a bucket's objects with the Replica's own
// checked steps (replay.h), holding one state at a time.
//
// Without `all`, the cheapest chain to the target is replayed; an object that
// fails is set aside and the next cheapest chain without it is tried, until
// the target is reached or no chain is left.
//
// With `all`, the versions are walked in ascending order with one state `cur`.
// At each version its anchor is checked on its own bytes, and once the
// version's state is held, every delta based on it (the next step delta and
// any cumulative delta listed further on) is decoded against it and its
// resulting hash checked, without applying it. The state then moves to the
// next version through that version's step delta (kept from the check) or
// its anchor; only when neither is good but another delta reached it (from an
// older base) is the state rebuilt along a chain of objects already found
// good.
#include "deltasync/verify.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "deltasync/manifest.h"
#include "deltasync/plan.h"
#include "deltasync/side_files.h"
#include "sync/replay.h"

namespace deltasync {
namespace {

// A state the checker holds: version 0 means none.
struct Held {
  WeightState state;
  StateHash hash;
  uint64_t version = 0;
};

class Checker {
 public:
  Checker(Store& store, Manifest manifest, int threads)
      : store_(store), manifest_(std::move(manifest)), threads_(threads) {}

  // Without --all: the cheapest chain to `target` that avoids bad objects.
  Status CheckTarget(uint64_t target) {
    Held held;
    DS_ASSIGN_OR_RETURN(bool reached, ReplayTo(target, held, /*only_known_good=*/false));
    if (!reached) unreachable_.insert(target);
    return Status::OK();
  }

  // --all.
  Status CheckAll() {
    // Every delta by the version it is based on.
    std::map<uint64_t, std::vector<std::pair<const VersionEntry*, const ObjectEntry*>>> by_base;
    for (const VersionEntry& v : manifest_.versions) {
      for (const ObjectEntry& o : v.objects) {
        if (o.kind == PatchKind::kDelta) by_base[*o.base_version].emplace_back(&v, &o);
      }
    }
    Held cur;
    std::optional<replay::CheckedDelta> next_step;  // from cur to the next version, checked
    uint64_t next_step_to = 0;
    std::set<uint64_t> reached_by_delta;  // targets of deltas found good
    const std::vector<VersionEntry>& versions = manifest_.versions;
    for (size_t i = 0; i < versions.size(); ++i) {
      const VersionEntry& e = versions[i];
      bool have = false;
      if (next_step && next_step_to == e.version) {
        ApplyChanges(cur.state, next_step->changes, threads_);
        cur.hash = next_step->next;
        cur.version = e.version;
        have = true;
      }
      next_step.reset();
      if (const ObjectEntry* anchor = e.anchor()) {
        // Checked on its own bytes; loaded only when the state did not get here by its delta.
        DS_ASSIGN_OR_RETURN(bool good, CheckAnchor(e, *anchor, have ? nullptr : &cur, /*discard_first=*/false));
        have = have || good;
      }
      if (!have && reached_by_delta.count(e.version)) {
        DS_ASSIGN_OR_RETURN(have, ReplayTo(e.version, cur, /*only_known_good=*/true));
      }
      if (!have) {
        unreachable_.insert(e.version);
        continue;  // cur stays where it was; every delta based on it was checked already
      }
      verified_.insert(e.version);
      const uint64_t next_version = i + 1 < versions.size() ? versions[i + 1].version : 0;
      for (const auto& [entry, object] : by_base[e.version]) {
        DS_ASSIGN_OR_RETURN(std::optional<replay::CheckedDelta> d, CheckDelta(*entry, *object, cur));
        if (!d) continue;
        reached_by_delta.insert(entry->version);
        if (entry->version == next_version) {
          next_step = std::move(d);
          next_step_to = next_version;
        }
      }
    }
    // Deltas never replayed (their base is unreachable): their bytes at least.
    for (const VersionEntry& v : manifest_.versions) {
      for (const ObjectEntry& o : v.objects) {
        for (const PartObject& stored : StoredObjects(o)) {
          if (outcomes_.count(stored.key)) continue;
          Result<Blob> blob = replay::FetchListed(store_, stored, &downloaded_);
          if (!blob.ok()) {
            if (blob.status().code() == ErrorCode::kIOError) return blob.status();
            outcomes_.emplace(stored.key, blob.status());
            continue;  // recorded as bad
          }
          unchecked_.push_back({v.version, stored.key, ErrorCode::kFailedPrecondition,
                                "not replayed: its base version " + std::to_string(o.base_version.value_or(0)) +
                                    " is unreachable (size and xxh3-128 are good)"});
        }
      }
    }
    return Status::OK();
  }

  // The side files of the targets (each target's full set, Manifest::FilesAt,
  // as the version whose `files` holds it lists them): each distinct object
  // downloaded once, its size and XXH3-128 checked. A bad one is reported for
  // every such listing that holds it.
  Status CheckSideFiles(const std::vector<uint64_t>& targets) {
    std::set<uint64_t> listings;
    for (uint64_t target : targets) {
      const VersionEntry* listing = nullptr;
      for (const VersionEntry& v : manifest_.versions) {
        if (v.version <= target && v.files) listing = &v;
      }
      if (listing) listings.insert(listing->version);
    }
    for (const VersionEntry& v : manifest_.versions) {
      if (!listings.count(v.version)) continue;
      for (const auto& [name, entry] : *v.files) {
        auto it = file_outcomes_.find(entry.key);
        if (it == file_outcomes_.end()) {
          Result<Blob> blob = FetchSideFile(store_, name, entry, "");
          if (!blob.ok() && blob.status().code() == ErrorCode::kIOError) return blob.status();
          if (blob.ok()) downloaded_ += blob->size();
          it = file_outcomes_.emplace(entry.key, blob.status()).first;
        }
        if (!it->second.ok()) file_problems_.push_back({v.version, entry.key, it->second.code(), it->second.message()});
      }
    }
    return Status::OK();
  }

  VerifyReport Report(std::vector<uint64_t> targets) && {
    VerifyReport r;
    r.bucket = store_.Describe();
    r.targets = std::move(targets);
    r.verified.assign(verified_.begin(), verified_.end());
    r.unreachable.assign(unreachable_.begin(), unreachable_.end());
    for (const VersionEntry& v : manifest_.versions) {
      if (!v.changed_elements) r.recovered.push_back(v.version);
      for (const ObjectEntry& o : v.objects) {
        for (const PartObject& stored : StoredObjects(o)) {
          auto it = outcomes_.find(stored.key);
          if (it != outcomes_.end() && !it->second.ok()) {
            r.bad_objects.push_back(Problem(v.version, stored.key, it->second));
          }
        }
      }
    }
    // Side files with the objects, in manifest order.
    r.bad_objects.insert(r.bad_objects.end(), file_problems_.begin(), file_problems_.end());
    std::stable_sort(r.bad_objects.begin(), r.bad_objects.end(),
                     [](const ObjectProblem& a, const ObjectProblem& b) { return a.version < b.version; });
    r.unchecked = std::move(unchecked_);
    r.objects_checked = outcomes_.size() + r.unchecked.size() + file_outcomes_.size();
    r.bytes_downloaded = downloaded_;
    return r;
  }

 private:
  static ObjectProblem Problem(uint64_t version, const std::string& key, const Status& s) {
    std::string reason = s.message();
    // Messages about an object usually start with its key; the report names it already.
    if (reason.starts_with(key + ": ")) reason.erase(0, key.size() + 2);
    return {version, key, s.code(), std::move(reason)};
  }

  // Records the first outcome of each object; a store failure is returned
  // (the object could not be checked), anything else is the object's fault.
  // A parted version's object: the outcome is recorded for the part to
  // blame (`bad_part`; the others are good) or, when none is, for every part.
  Status Record(const ObjectEntry& object, const Status& s, size_t bad_part = SIZE_MAX) {
    if (s.code() == ErrorCode::kIOError) return s;
    const std::vector<PartObject> stored = StoredObjects(object);
    for (size_t p = 0; p < stored.size(); ++p) {
      const Status& outcome = !s.ok() && bad_part < stored.size() && p != bad_part ? Status::OK() : s;
      auto [it, inserted] = outcomes_.emplace(stored[p].key, outcome);
      if (!inserted && it->second.ok() && !outcome.ok()) it->second = outcome;  // good before, bad now: the store changed
    }
    return Status::OK();
  }

  // The object's bytes: one blob, or one per part.
  Result<std::vector<Blob>> Fetch(const VersionEntry& entry, const ObjectEntry& object) {
    Result<std::vector<Blob>> blobs = Status::Internal("unset");
    size_t bad_part = SIZE_MAX;
    if (object.parted()) {
      blobs = replay::FetchParts(store_, object, threads_, &downloaded_, &bad_part);
    } else {
      Result<Blob> blob = replay::FetchListed(store_, object, &downloaded_);
      if (blob.ok()) {
        std::vector<Blob> one;
        one.push_back(std::move(*blob));
        blobs = std::move(one);
      } else {
        blobs = blob.status();
      }
    }
    if (!blobs.ok()) DS_RETURN_IF_ERROR(Record(object, blobs.status(), bad_part));
    return blobs;
  }

  // true: good (and, with `into`, loaded into it); false: bad (recorded).
  Result<bool> CheckAnchor(const VersionEntry& entry, const ObjectEntry& object, Held* into, bool discard_first) {
    if (into && discard_first) *into = Held{};  // one state at a time
    Result<std::vector<Blob>> blob = Fetch(entry, object);
    if (!blob.ok()) return blob.status().code() == ErrorCode::kIOError ? Result<bool>(blob.status()) : false;
    size_t bad_part = SIZE_MAX;
    Result<replay::CheckedAnchor> anchor =
        object.parted() ? replay::CheckPartedAnchor(std::move(*blob), entry, object, *manifest_.LayoutOf(entry), threads_,
                                                    &bad_part)
                        : replay::CheckAnchor(std::move(blob->front()), entry, object, threads_);
    DS_RETURN_IF_ERROR(Record(object, anchor.status(), bad_part));
    if (!anchor.ok()) return false;
    if (into) {
      Result<WeightState> state = anchor->decoded ? WeightState::FromTensors(std::move(anchor->decoded->tensors))
                                                  : WeightState::FromViews(anchor->views);
      if (!state.ok()) return state.status();
      *into = Held{std::move(*state), anchor->hash, entry.version};
    }
    return true;
  }

  // The delta's changes when it is good on `base` (which it leaves alone);
  // nullopt when it is bad (recorded).
  Result<std::optional<replay::CheckedDelta>> CheckDelta(const VersionEntry& entry, const ObjectEntry& object,
                                                         const Held& base) {
    using Out = std::optional<replay::CheckedDelta>;
    Result<std::vector<Blob>> blob = Fetch(entry, object);
    if (!blob.ok()) {
      if (blob.status().code() == ErrorCode::kIOError) return blob.status();
      return Out();
    }
    size_t bad_part = SIZE_MAX;
    Result<replay::CheckedDelta> d =
        object.parted()
            ? replay::CheckPartedDelta(std::move(*blob), entry, object, *manifest_.LayoutOf(entry), base.state,
                                       base.hash, *manifest_.Find(base.version), threads_, &bad_part)
            : replay::CheckDelta(std::move(blob->front()), entry, object, base.state, base.hash, threads_);
    DS_RETURN_IF_ERROR(Record(object, d.status(), bad_part));
    if (!d.ok()) return Out();
    return Out(std::move(*d));
  }

  // ReplayTo's step: the delta applied to `held` in place, as a replica
  // applies it (replay::ApplyDelta: a gap_delta delta in one pass from its
  // encoded gaps, undone if the result does not hash right). true: good, and
  // `held` is at entry.version; false: bad (recorded), `held` unchanged.
  Result<bool> ApplyDeltaTo(const VersionEntry& entry, const ObjectEntry& object, Held& held) {
    if (object.parted()) {
      DS_ASSIGN_OR_RETURN(std::optional<replay::CheckedDelta> d, CheckDelta(entry, object, held));
      if (!d) return false;
      ApplyChanges(held.state, d->changes, threads_);
      held.hash = d->next;
      held.version = entry.version;
      return true;
    }
    Result<std::vector<Blob>> blob = Fetch(entry, object);
    if (!blob.ok()) {
      if (blob.status().code() == ErrorCode::kIOError) return blob.status();
      return false;
    }
    Result<replay::AppliedDelta> d = replay::ApplyDelta(std::move(blob->front()), entry, object, held.state, held.hash,
                                                        threads_, /*want_changes=*/false, undo_, compact_undo_);
    DS_RETURN_IF_ERROR(Record(object, d.status()));
    if (!d.ok()) return false;
    held.hash = d->next;
    held.version = entry.version;
    return true;
  }

  // Replays into `held` the cheapest chain to `target` (from held's version
  // when it can) of objects not known bad, or with only_known_good of objects
  // already found good. Returns false when no such chain (or none that
  // checks out) reaches it; `held` then holds some verified state or none.
  Result<bool> ReplayTo(uint64_t target, Held& held, bool only_known_good) {
    for (;;) {
      ObjectSet avoid;
      for (const VersionEntry& v : manifest_.versions) {
        for (const ObjectEntry& o : v.objects) {
          for (const PartObject& stored : StoredObjects(o)) {
            auto it = outcomes_.find(stored.key);
            if (it == outcomes_.end() ? only_known_good : !it->second.ok()) avoid.insert(RefOf(stored));
          }
        }
      }
      std::optional<uint64_t> from;
      if (held.version != 0 && held.version <= target) from = held.version;
      Result<CatchUpPlan> plan = PlanCatchUp(manifest_, from, target, avoid);
      if (!plan.ok()) return false;
      bool failed = false;
      for (const PlanStep& step : plan->steps) {
        const VersionEntry& entry = *manifest_.Find(step.version);
        if (step.object.kind == PatchKind::kAnchor) {
          DS_ASSIGN_OR_RETURN(bool good, CheckAnchor(entry, step.object, &held, /*discard_first=*/true));
          failed = !good;
        } else {
          DS_ASSIGN_OR_RETURN(bool good, ApplyDeltaTo(entry, step.object, held));
          failed = !good;
        }
        if (failed) break;
        verified_.insert(step.version);
      }
      if (!failed) return true;
    }
  }

  Store& store_;
  const Manifest manifest_;
  const int threads_;
  std::map<std::string, Status> outcomes_;  // by key: every object checked
  std::map<std::string, Status> file_outcomes_;  // by key: every side file object checked
  std::vector<ObjectProblem> file_problems_;
  std::set<uint64_t> verified_, unreachable_;
  std::vector<ObjectProblem> unchecked_;
  uint64_t downloaded_ = 0;
  std::vector<uint8_t> undo_;  // ApplyDelta's scratch, reused
  CompactUndo compact_undo_;   // the same, for compact deltas
};

}  // namespace

Result<VerifyReport> VerifyBucket(Store& store, const VerifyOptions& options) {
  DS_ASSIGN_OR_RETURN(Manifest manifest, FetchManifest(store));
  const VersionEntry* latest = manifest.Latest();
  if (!latest) return Status::NotFound(store.Describe() + ": the manifest lists no versions yet");
  std::vector<uint64_t> targets;
  if (options.all) {
    for (const VersionEntry& v : manifest.versions) targets.push_back(v.version);
  } else {
    const uint64_t target = options.version.value_or(latest->version);
    if (!manifest.Find(target)) {
      return Status::NotFound("version " + std::to_string(target) + " is not in " + store.Describe() + "/" +
                              std::string(kManifestKey) + " (latest is " + std::to_string(latest->version) + ")");
    }
    targets.push_back(target);
  }
  Checker checker(store, std::move(manifest), options.threads);
  DS_RETURN_IF_ERROR(options.all ? checker.CheckAll() : checker.CheckTarget(targets.front()));
  DS_RETURN_IF_ERROR(checker.CheckSideFiles(targets));
  return std::move(checker).Report(std::move(targets));
}

}  // namespace deltasync
