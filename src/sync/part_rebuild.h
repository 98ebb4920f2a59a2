// Rebuilding one part's blocks of a bucket's newest version, reading only
// the objects the part needs (docs/format.md, "Parts": restarting with
// another layout). What PartPublisher::Open does when it joins a bucket that
// holds versions. Internal to src/sync/.
//
// The chain is the one a replica plans (PlanCatchUp: the cheapest route from
// an anchor to the newest version, around objects found bad). Walking it
// backwards gives, for each step, the parts of that step's layout that the
// wanted blocks depend on: a parted step needs the parts whose blocks overlap
// what the next step needs (a part's delta decodes against that part's whole
// base blocks: its gaps and contexts come from them), an unparted step needs
// the whole model (its objects are verified only by the whole state's hash).
// Only those parts' objects are fetched; each is checked (size, XXH3-128,
// metadata, the manifest's part hash) before it is used.
#pragma once

#include <cstdint>

#include "deltasync/manifest.h"
#include "deltasync/parts.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/store.h"
#include "deltasync/weight_state.h"

namespace deltasync {

struct RebuiltPart {
  uint64_t version = 0;  // the manifest's newest
  WeightState blocks;    // part `part` of the layout: one tensor per block, named by its tensor
  StateHash hash;        // HashPart of `blocks`
};

// Part `part` of `layout` (validated) at `manifest`'s newest version. Errors:
// the layout's tensors are not the bucket's (kInvalidArgument), no route
// without damaged objects (their error, naming them), store failures.
Result<RebuiltPart> RebuildPart(Store& store, const Manifest& manifest, const PartLayout& layout, uint32_t part,
                                int threads);

// OK when `got` (a version's tensors: names, dtypes, shapes, in name order)
// are exactly the layout's, tensors with no elements included (they have no
// block, so only this sees them). kInvalidArgument naming the first tensor
// that differs and `version` of `store` otherwise.
Status SameTensors(const PartLayout& target, const std::vector<TensorDesc>& got, uint64_t version, Store& store);

}  // namespace deltasync
