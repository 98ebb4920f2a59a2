// PlanCatchUp (plan.h): cheapest path by bytes through the version graph.
#include "deltasync/plan.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

namespace deltasync {
namespace {

struct Best {
  uint64_t bytes = 0;
  uint64_t objects = 0;
  const VersionEntry* entry = nullptr;  // the version reached
  const ObjectEntry* via = nullptr;     // nullptr: the held version itself
  uint64_t from = 0;                    // the base version of `via` (deltas)
};

// Strictly better: fewer bytes, then fewer objects.
bool Better(uint64_t bytes, uint64_t objects, const Best& than) {
  return bytes != than.bytes ? bytes < than.bytes : objects < than.objects;
}

// The cheapest chain to `target` through versions >= floor only (plus the
// held version); nullopt when there is none.
std::optional<CatchUpPlan> Cheapest(const Manifest& manifest, uint64_t start, uint64_t target, uint64_t floor,
                                    const ObjectSet& avoid) {
  std::unordered_map<uint64_t, Best> best;
  if (start > 0 && manifest.Find(start)) best[start] = Best{0, 0, manifest.Find(start), nullptr, 0};
  for (const VersionEntry& v : manifest.versions) {
    if (v.version > target) break;
    if (v.version < floor || v.version == start) continue;  // the held version is reached for free
    std::optional<Best> here;
    for (const ObjectEntry& o : v.objects) {
      if (!avoid.empty() && Avoided(o, avoid)) continue;
      uint64_t bytes = o.size, objects = 1, from = 0;
      if (o.kind == PatchKind::kDelta) {
        auto base = best.find(*o.base_version);
        if (base == best.end()) continue;
        bytes += base->second.bytes;
        objects += base->second.objects;
        from = *o.base_version;
      }
      if (!here || Better(bytes, objects, *here)) here = Best{bytes, objects, &v, &o, from};
    }
    if (here) best[v.version] = *here;
  }
  auto reached = best.find(target);
  if (reached == best.end()) return std::nullopt;
  CatchUpPlan plan;
  plan.bytes = reached->second.bytes;
  for (uint64_t v = target; v != start;) {
    const Best& b = best.at(v);
    plan.steps.push_back(PlanStep{v, *b.via});
    if (b.via->kind == PatchKind::kAnchor) break;
    v = b.from;
  }
  std::reverse(plan.steps.begin(), plan.steps.end());
  return plan;
}

}  // namespace

bool Avoided(const ObjectEntry& object, const ObjectSet& avoid) {
  if (!object.parted()) return avoid.count(RefOf(object)) > 0;
  for (const PartObject& p : object.parts) {
    if (avoid.count(RefOf(p))) return true;
  }
  return false;
}

Result<CatchUpPlan> PlanCatchUp(const Manifest& manifest, std::optional<uint64_t> held, uint64_t target,
                                const ObjectSet& avoid) {
  const uint64_t start = held.value_or(0);
  if (!manifest.Find(target)) {
    return Status::NotFound("version " + std::to_string(target) + " is not in the manifest");
  }
  if (target < start) {
    return Status::InvalidArgument("version " + std::to_string(target) + " is older than the held version " +
                                   std::to_string(start));
  }
  if (target == start) return CatchUpPlan{};
  // Forward only when possible, so that a failure midway leaves the replica
  // no older than it was; through an older anchor only when nothing else
  // reaches the target.
  if (std::optional<CatchUpPlan> forward = Cheapest(manifest, start, target, start, avoid)) return std::move(*forward);
  if (std::optional<CatchUpPlan> any = Cheapest(manifest, start, target, 0, avoid)) return std::move(*any);
  return Status::NotFound("no chain of listed objects reaches version " + std::to_string(target) +
                          (start > 0 ? " from version " + std::to_string(start) : std::string()) +
                          (avoid.empty() ? " (no anchor at or below it, or its chain was removed)"
                                         : " without the " + std::to_string(avoid.size()) +
                                               " object(s) known bad (no anchor at or below it, or its chain was "
                                               "removed or damaged)"));
}

}  // namespace deltasync
