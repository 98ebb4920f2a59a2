// Fuzz target for the manifest parser and the catch-up planner (a replica
// parses whatever manifest.json the bucket holds, then plans over it).
// Properties, per input:
//   1. arbitrary bytes never crash Manifest::Parse;
//   2. a manifest that parses serialises deterministically, and that JSON
//      parses back to a manifest that serialises to the same bytes;
//   3. PlanCatchUp over it, for every (held, target) pair of listed versions
//      (bounded), returns a real chain: it starts at the held version or an
//      anchor, each delta's base is what the previous step reached, it ends at
//      the target, and its byte count is the sum of its objects. The first
//      version is an anchor, so every target is reachable from nothing.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "deltasync/manifest.h"
#include "deltasync/plan.h"

using namespace deltasync;

namespace {

void CheckPlan(const Manifest& m, uint64_t held, uint64_t target) {
  Result<CatchUpPlan> plan = PlanCatchUp(m, held, target);
  if (!plan.ok()) {
    if (held == 0) std::abort();  // a valid manifest starts with an anchor
    return;
  }
  if (held == target) {
    if (!plan->steps.empty()) std::abort();
    return;
  }
  uint64_t at = held, bytes = 0;
  for (size_t i = 0; i < plan->steps.size(); ++i) {
    const PlanStep& s = plan->steps[i];
    if (s.object.kind == PatchKind::kAnchor) {
      if (i != 0) std::abort();
    } else if (!s.object.base_version || *s.object.base_version != at || s.version <= at) {
      std::abort();
    }
    at = s.version;
    bytes += s.object.size;
  }
  if (at != target || bytes != plan->bytes || plan->steps.empty()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<Manifest> m = Manifest::Parse(ByteSpan(data, size), "fuzz");
  if (!m.ok()) return 0;
  const std::string json = m->ToJson();
  Result<Manifest> again = Manifest::Parse(ByteSpan(reinterpret_cast<const uint8_t*>(json.data()), json.size()));
  if (!again.ok() || again->ToJson() != json) std::abort();

  const auto& versions = m->versions;
  const size_t n = std::min<size_t>(versions.size(), 24);
  for (size_t t = 0; t < n; ++t) {
    CheckPlan(*m, 0, versions[t].version);
    for (size_t h = 0; h <= t; ++h) CheckPlan(*m, versions[h].version, versions[t].version);
  }
  return 0;
}
