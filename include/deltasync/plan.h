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
#pragma once

#include <cstdint>
#include <optional>
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

// held: the version the replica holds (nullopt or 0: nothing). Requires
// target in the manifest and target >= held. kNotFound when no chain of
// listed objects reaches the target (e.g. gc removed the anchors it needs).
Result<CatchUpPlan> PlanCatchUp(const Manifest& manifest, std::optional<uint64_t> held, uint64_t target);

}  // namespace deltasync
