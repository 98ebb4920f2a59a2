// What replay.cc's steps over whole objects and replay_parts.cc's steps
// over a parted version's parts share: a version's name in messages, an
// object's metadata checked against its listing, and a fused apply's
// counts. Internal to src/sync/.
#pragma once

#include <cstdint>
#include <string>

#include "deltasync/compact_class_totals.h"
#include "deltasync/manifest.h"
#include "deltasync/patch.h"
#include "deltasync/status.h"
#include "sync/replay.h"

namespace deltasync::replay {

// "version N".
std::string V(uint64_t version);

// Checks a decoded object's metadata against the manifest's listing.
Status CheckListed(const PatchInfo& info, const ObjectEntry& object, uint64_t version);

// Adds one fused compact apply to `out`'s counts: `totals`'s counters now
// against `held` and `stale`, theirs before the apply.
void CountApply(const CompactClassTotals& totals, uint64_t held, uint64_t stale, AppliedDelta& out);

}  // namespace deltasync::replay
