// CheckKeptRoutes (retention_routes.h): the routes gc would leave, checked
// before it changes anything.
#include "sync/retention_routes.h"

#include <xxhash.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deltasync/plan.h"
#include "sync/xxh_hex.h"

namespace deltasync {
namespace {

// Checks one stored object against its listing (size, then with kFull its
// XXH3-128), reading it in slices so that a large anchor is never held whole;
// adds the bytes read to *read.
Status CheckStored(Store& store, const PartObject& o, AnchorCheck check, uint64_t* read) {
  DS_ASSIGN_OR_RETURN(uint64_t size, store.Size(o.key));
  if (size != o.size) {
    return Status::Integrity(o.key + " is " + std::to_string(size) + " bytes, the manifest lists " +
                             std::to_string(o.size));
  }
  if (check == AnchorCheck::kSize) return Status::OK();
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  if (!state) return Status::Internal("out of memory for a hash state");
  XXH3_128bits_reset(state.get());
  constexpr uint64_t kSlice = uint64_t{64} << 20;
  for (uint64_t offset = 0; offset < size; offset += kSlice) {
    DS_ASSIGN_OR_RETURN(Blob slice, store.GetRange(o.key, offset, std::min(kSlice, size - offset)));
    if (slice.size() != std::min(kSlice, size - offset)) {
      return Status::Integrity(o.key + " gave " + std::to_string(slice.size()) + " bytes at offset " +
                               std::to_string(offset) + ", fewer than its size promises");
    }
    XXH3_128bits_update(state.get(), slice.bytes().data(), slice.size());
    *read += slice.size();
  }
  const std::string hex = Xxh128Hex(XXH3_128bits_digest(state.get()));
  if (o.xxh3_128 != hex) return Status::Integrity(o.key + ": XXH3-128 " + hex + ", the manifest lists " + o.xxh3_128);
  return Status::OK();
}

// Finds routes through intact objects the way a fresh replica does
// (PlanCatchUp, routing around what it found bad), checking each object at
// most once.
class RouteChecker {
 public:
  RouteChecker(Store& store, AnchorCheck check) : store_(store), check_(check) {}

  // Whether a fresh replica reaches `target` in `manifest` through objects
  // that are there and intact.
  Result<bool> Reaches(const Manifest& manifest, uint64_t target) {
    for (;;) {
      Result<CatchUpPlan> plan = PlanCatchUp(manifest, std::nullopt, target, bad_refs_);
      if (!plan.ok()) {
        if (plan.status().code() == ErrorCode::kNotFound) return false;
        return plan.status();
      }
      bool intact = true;
      for (const PlanStep& step : plan->steps) {
        for (const PartObject& o : StoredObjects(step.object)) {
          DS_ASSIGN_OR_RETURN(intact, Intact(o));
          if (!intact) break;
        }
        if (!intact) break;
      }
      if (intact) return true;  // else re-plan around the bad object
    }
  }

  // What was found wrong with the bad objects among `objects`, "; "-separated.
  std::string Faults(const std::vector<PartObject>& objects) const {
    std::string out;
    for (const PartObject& o : objects) {
      auto it = faults_.find(o.key);
      if (it != faults_.end()) out += (out.empty() ? "" : "; ") + it->second;
    }
    return out;
  }

  uint64_t BytesReadFor(const std::vector<PartObject>& objects) const {
    uint64_t sum = 0;
    for (const PartObject& o : objects) {
      auto it = read_.find(RefOf(o));
      if (it != read_.end()) sum += it->second;
    }
    return sum;
  }

  uint64_t objects_checked() const { return read_.size(); }
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  Result<bool> Intact(const PartObject& o) {
    if (auto seen = read_.find(RefOf(o)); seen != read_.end()) return !bad_refs_.count(seen->first);
    uint64_t read = 0;
    Status checked = CheckStored(store_, o, check_, &read);
    bytes_read_ += read;
    if (!checked.ok() && checked.code() != ErrorCode::kNotFound && checked.code() != ErrorCode::kIntegrity) {
      return checked;
    }
    read_[RefOf(o)] = read;
    if (checked.ok()) return true;
    bad_refs_.insert(RefOf(o));
    faults_[o.key] = checked.code() == ErrorCode::kNotFound ? o.key + " is missing" : checked.message();
    return false;
  }

  Store& store_;
  const AnchorCheck check_;
  ObjectSet bad_refs_;
  std::map<ObjectRef, uint64_t> read_;        // object checked -> bytes read checking it
  std::map<std::string, std::string> faults_;  // key -> what is wrong with it
  uint64_t bytes_read_ = 0;
};

}  // namespace

Status CheckKeptRoutes(Store& store, const Manifest& before, const Manifest& pruned, const std::set<uint64_t>& entered,
                       uint64_t keep_anchors, AnchorCheck check, PruneStats* stats) {
  const VersionEntry& oldest = pruned.versions.front();
  // The oldest kept anchor is checked always: it starts every kept chain.
  std::set<uint64_t> targets = entered;
  targets.insert(oldest.version);
  RouteChecker routes(store, check);
  Status refused = Status::OK();
  for (uint64_t target : targets) {
    stats->routes_checked.push_back(target);
    DS_ASSIGN_OR_RETURN(bool after, routes.Reaches(pruned, target));
    if (after) continue;
    // Unreachable after pruning: refused when it is reachable now (one that
    // nothing reaches already is not gc's to save), and always for the
    // oldest kept anchor, the start of every kept chain: pruning before a
    // broken one could leave no version reachable at all.
    if (target != oldest.version) {
      DS_ASSIGN_OR_RETURN(bool now, routes.Reaches(before, target));
      if (!now) continue;
    }
    std::vector<PartObject> kept_objects;  // the kept objects that could be on its routes
    for (const VersionEntry& v : pruned.versions) {
      if (v.version > target) break;
      for (const ObjectEntry& o : v.objects) {
        for (PartObject& p : StoredObjects(o)) kept_objects.push_back(std::move(p));
      }
    }
    std::string faults = routes.Faults(kept_objects);
    if (faults.empty()) faults = "objects that no kept version lists (every route to it starts before that)";
    const std::string why = target == oldest.version
                                ? "is the oldest anchor it keeps, the start of every kept version's chain"
                                : "is reachable today only through objects of the versions before " +
                                      std::to_string(oldest.version) + " that gc would remove";
    refused = Status::FailedPrecondition(
        "not pruning " + store.Describe() + ": version " + std::to_string(target) + ", which --keep-anchors " +
        std::to_string(keep_anchors) + " keeps, " + why + ": its routes through the objects gc keeps need " +
        faults + ". Removing the versions before " + std::to_string(oldest.version) + " would leave version " +
        std::to_string(target) +
        " (and every later version that needs it) unreachable; nothing was changed. Run deltasync verify --all, "
        "and gc with a larger --keep-anchors (or publish a new anchor first)");
    break;
  }
  stats->anchor_checked = oldest.version;
  stats->anchor_bytes_read = routes.BytesReadFor(StoredObjects(*oldest.anchor()));
  stats->check_objects = routes.objects_checked();
  stats->check_bytes_read = routes.bytes_read();
  return refused;
}

}  // namespace deltasync
