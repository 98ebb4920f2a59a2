// Catch-up planning: which objects a replica downloads to move from the
// version it holds to a target version. A manifest offers, per version, an
// anchor (a full state), the step delta from the previous version, and
// possibly a cumulative delta from the last anchor; these form a graph whose
// nodes are versions and whose edges are objects (an anchor reaches its
// version from nothing, a delta from its base). The plan is the path to the
// target that downloads the fewest bytes (ties: fewer objects), found by
// dynamic programming over the versions in ascending order (every edge points
// to a newer version): O(objects). Only chains through versions at or above
// the held one are considered (a failure midway then never leaves a replica
// older than it was), unless no such chain exists: then any chain, which
// starts at an anchor below the held version.
//
// Objects to avoid (known bad: damaged, missing) are left out of the graph:
// the one reachability analysis behind a replica's replanning around failures
// and the `verify` command.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "deltasync/manifest.h"
#include "deltasync/status.h"

namespace deltasync {

struct PlanStep {
  uint64_t version = 0;  // the version this object produces
  ObjectEntry object;    // an anchor (first step only) or a delta whose base the previous step reached
};

struct CatchUpPlan {
  std::vector<PlanStep> steps;  // in application order; empty when held == target
  uint64_t bytes = 0;           // sum of the objects' sizes
};

// An object as the manifest lists it: a key with its content (a key listed
// again with another hash is another object).
struct ObjectRef {
  std::string key;
  std::string xxh3_128;
  auto operator<=>(const ObjectRef&) const = default;
};
inline ObjectRef RefOf(const ObjectEntry& object) { return ObjectRef{object.key, object.xxh3_128}; }
inline ObjectRef RefOf(const PartObject& object) { return ObjectRef{object.key, object.xxh3_128}; }
using ObjectSet = std::set<ObjectRef>;
// True when `avoid` holds the object or, for a parted version's object, any
// of its parts (a version is reached only through all of its parts).
bool Avoided(const ObjectEntry& object, const ObjectSet& avoid);

// held: the version the replica holds (nullopt or 0: nothing). Requires
// target in the manifest and target >= held. Objects in `avoid` are not used.
// kNotFound when no chain of listed objects (outside `avoid`) reaches the
// target (e.g. gc removed the anchors it needs, or they are all bad).
Result<CatchUpPlan> PlanCatchUp(const Manifest& manifest, std::optional<uint64_t> held, uint64_t target,
                                const ObjectSet& avoid = {});

}  // namespace deltasync
