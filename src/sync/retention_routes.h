// The check PruneVersions runs before it changes anything (retention.h):
// every kept version that a fresh replica reaches today through objects
// that are there and intact stays reachable after the pruning.
#pragma once

#include <cstdint>
#include <set>

#include "deltasync/manifest.h"
#include "deltasync/retention.h"
#include "deltasync/status.h"
#include "deltasync/store.h"

namespace deltasync {

// `before`: the stored manifest; `pruned`: what gc would write (its first
// version the oldest kept anchor). `entered`: the kept versions that a
// removed object leads into (a delta whose base is removed), the only ones
// whose routes pruning can cut (retention.h). Fills stats->anchor_checked,
// anchor_bytes_read, routes_checked, check_objects and check_bytes_read.
// kFailedPrecondition naming the version and the objects when a kept
// version reachable before would not be after; a store failure other than a
// missing or damaged object is returned as it is.
Status CheckKeptRoutes(Store& store, const Manifest& before, const Manifest& pruned, const std::set<uint64_t>& entered,
                       uint64_t keep_anchors, AnchorCheck check, PruneStats* stats);

}  // namespace deltasync
