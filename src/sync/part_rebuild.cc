// RebuildPart (part_rebuild.h): one part's blocks of the newest version,
// from the objects that part depends on only.
#include "sync/part_rebuild.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <optional>

#include "common/parallel.h"
#include "deltasync/plan.h"
#include "sync/replay.h"

namespace deltasync {
namespace {

std::string V(uint64_t version) { return "version " + std::to_string(version); }

bool Overlap(const Block& a, const Block& b) {
  if (a.tensor != b.tensor) return false;
  for (size_t d = 0; d < a.offset.size(); ++d) {
    if (a.offset[d] + a.shape[d] <= b.offset[d] || b.offset[d] + b.shape[d] <= a.offset[d]) return false;
  }
  return true;
}

// Copies the elements blocks `src` and `dst` of one tensor have in common
// (each block's bytes row-major in its own shape); returns how many.
uint64_t CopyOverlap(const Block& src, const uint8_t* src_data, const Block& dst, uint8_t* dst_data, size_t width) {
  if (!Overlap(src, dst)) return 0;
  const size_t rank = dst.shape.size();
  if (rank == 0) {
    std::memcpy(dst_data, src_data, width);
    return 1;
  }
  std::vector<uint64_t> lo(rank), hi(rank), src_stride(rank, 1), dst_stride(rank, 1);
  for (size_t d = 0; d < rank; ++d) {
    lo[d] = std::max(src.offset[d], dst.offset[d]);
    hi[d] = std::min(src.offset[d] + src.shape[d], dst.offset[d] + dst.shape[d]);
  }
  for (size_t d = rank - 1; d > 0; --d) {
    src_stride[d - 1] = src_stride[d] * src.shape[d];
    dst_stride[d - 1] = dst_stride[d] * dst.shape[d];
  }
  const uint64_t run = hi[rank - 1] - lo[rank - 1];
  std::vector<uint64_t> at = lo;  // odometer over dims [0, rank - 1)
  uint64_t copied = 0;
  for (;;) {
    uint64_t s = 0, t = 0;
    for (size_t d = 0; d < rank; ++d) {
      s += (at[d] - src.offset[d]) * src_stride[d];
      t += (at[d] - dst.offset[d]) * dst_stride[d];
    }
    std::memcpy(dst_data + t * width, src_data + s * width, run * width);
    copied += run;
    int d = static_cast<int>(rank) - 2;
    for (; d >= 0; --d) {
      if (++at[d] < hi[d]) break;
      at[d] = lo[d];
    }
    if (d < 0) return copied;
  }
}

// What the rebuild holds between steps: some parts of one layout, each as
// its blocks (one tensor per block, in block order).
struct Held {
  const PartLayout* layout = nullptr;
  std::string digest;
  std::map<size_t, WeightState> parts;
};

// Parts `want` of `to` (digest `to_digest`), from what `held` holds (which
// covers them: the backward pass chose it so). Moves when the layout is the same.
Result<std::map<size_t, WeightState>> Reshape(Held& held, const PartLayout& to, const std::string& to_digest,
                                              const std::vector<size_t>& want) {
  std::map<size_t, WeightState> out;
  if (held.digest == to_digest &&
      std::all_of(want.begin(), want.end(), [&](size_t p) { return held.parts.count(p) > 0; })) {
    for (size_t p : want) out.emplace(p, std::move(held.parts.at(p)));
    held.parts.clear();
    return out;
  }
  for (size_t p : want) {
    std::vector<WeightState::Tensor> blocks;
    for (const Block& b : to.parts[p]) {
      const TensorDesc& d = to.tensors[b.tensor];
      const size_t width = DTypeSize(d.dtype);
      WeightState::Tensor& t = blocks.emplace_back();
      t.name = d.name;
      t.dtype = d.dtype;
      t.shape = b.shape;
      const uint64_t elements = CheckedElementCount(b.shape).value_or(0);
      t.data.resize(elements * width);
      uint64_t covered = 0;
      for (auto& [hp, state] : held.parts) {
        const std::vector<Block>& from = held.layout->parts[hp];
        for (size_t i = 0; i < from.size(); ++i) {
          if (from[i].tensor != b.tensor) continue;
          covered += CopyOverlap(from[i], state.tensors()[i].data.data(), b, t.data.data(), width);
        }
      }
      if (covered != elements) {
        return Status::Internal("rebuilding the block of '" + d.name + "' at offset " + ShapeToString(b.offset) +
                                ": the held blocks cover " + std::to_string(covered) + " of its " +
                                std::to_string(elements) + " elements");
      }
    }
    DS_ASSIGN_OR_RETURN(WeightState state, WeightState::FromTensors(std::move(blocks)));
    out.emplace(p, std::move(state));
  }
  held.parts.clear();
  return out;
}

// The parts of the step objects a replay of `plan` needs for part `part` of
// `target`: backwards from the target's blocks, each step needs the parts of
// its layout that overlap what the next step needs.
std::vector<std::vector<size_t>> NeededParts(const std::vector<const PartLayout*>& layouts, const PartLayout& target,
                                             uint32_t part) {
  std::vector<std::vector<size_t>> needed(layouts.size());
  std::vector<Block> need = target.parts[part];
  for (size_t s = layouts.size(); s-- > 0;) {
    const PartLayout& l = *layouts[s];
    std::vector<Block> before;
    for (size_t p = 0; p < l.parts.size(); ++p) {
      const bool overlaps = std::any_of(l.parts[p].begin(), l.parts[p].end(), [&](const Block& b) {
        return std::any_of(need.begin(), need.end(), [&](const Block& n) { return Overlap(b, n); });
      });
      if (!overlaps) continue;
      needed[s].push_back(p);
      before.insert(before.end(), l.parts[p].begin(), l.parts[p].end());
    }
    need = std::move(before);
  }
  return needed;
}

// The parts `which` of the parted `object`, fetched and checked in parallel.
Result<std::map<size_t, Blob>> FetchSomeParts(Store& store, const ObjectEntry& object, const std::vector<size_t>& which,
                                              int threads, std::optional<ObjectRef>* bad) {
  std::vector<std::optional<Result<Blob>>> got(which.size());
  std::vector<uint64_t> bytes(which.size(), 0);
  ParallelFor(which.size(), std::min(ResolveThreads(threads), 16), [&](size_t i) {
    got[i] = replay::FetchListed(store, object.parts[which[i]], &bytes[i]);
  });
  std::map<size_t, Blob> out;
  for (size_t i = 0; i < which.size(); ++i) {
    if (!got[i]->ok()) {
      *bad = RefOf(object.parts[which[i]]);
      return got[i]->status();
    }
    out.emplace(which[i], std::move(**got[i]));
  }
  return out;
}

// One replay of `plan`. On a failure one stored object is to blame for,
// *bad names it.
Result<RebuiltPart> Replay(Store& store, const Manifest& manifest, const CatchUpPlan& plan, const PartLayout& target,
                           const std::string& target_digest, uint32_t part, int threads,
                           std::optional<ObjectRef>* bad) {
  // Unparted versions: the whole model, as one part of whole-tensor blocks.
  PartLayout whole;
  whole.tensors = target.tensors;
  whole.parts.resize(1);
  for (uint32_t t = 0; t < target.tensors.size(); ++t) {
    const std::vector<uint64_t>& shape = target.tensors[t].shape;
    whole.parts[0].push_back(Block{t, std::vector<uint64_t>(shape.size(), 0), shape});
  }
  const std::string whole_digest = whole.Digest();
  std::vector<const PartLayout*> layouts;
  for (const PlanStep& step : plan.steps) {
    const VersionEntry& entry = *manifest.Find(step.version);
    const PartLayout* l = entry.parted() ? manifest.LayoutOf(entry) : &whole;
    DS_RETURN_IF_ERROR(SameTensors(target, l->tensors, entry.version, store));
    layouts.push_back(l);
  }
  const std::vector<std::vector<size_t>> needed = NeededParts(layouts, target, part);

  Held held;
  for (size_t s = 0; s < plan.steps.size(); ++s) {
    const VersionEntry& entry = *manifest.Find(plan.steps[s].version);
    const ObjectEntry& object = plan.steps[s].object;
    const PartLayout& layout = *layouts[s];
    const std::string digest = entry.parted() ? entry.layout : whole_digest;
    const std::vector<size_t>& want = needed[s];
    const bool anchor = object.kind == PatchKind::kAnchor;
    auto fail = [&](const Status& st) {
      return st.WithContext((anchor ? "loading anchor of " : "applying delta of ") + V(entry.version));
    };
    uint64_t downloaded = 0;
    if (!entry.parted()) {
      // One object holding every tensor, verified by the whole state's hash:
      // decoded against (or into) the whole model.
      Result<Blob> blob = replay::FetchListed(store, object, &downloaded);
      if (!blob.ok()) {
        *bad = RefOf(object);
        return fail(blob.status());
      }
      WeightState state;
      if (anchor) {
        Result<replay::CheckedAnchor> a = replay::CheckAnchor(std::move(*blob), entry, object, threads);
        if (!a.ok()) {
          *bad = RefOf(object);
          return fail(a.status());
        }
        Result<WeightState> full = a->decoded ? WeightState::FromTensors(std::move(a->decoded->tensors))
                                              : WeightState::FromViews(a->views);
        if (!full.ok()) return fail(full.status());
        std::vector<TensorDesc> got;
        for (const WeightState::Tensor& t : full->tensors()) got.push_back({t.name, t.dtype, t.shape});
        DS_RETURN_IF_ERROR(SameTensors(target, got, entry.version, store));
        state = std::move(*full);
      } else {
        DS_ASSIGN_OR_RETURN(auto base, Reshape(held, layout, digest, want));
        state = std::move(base.at(0));
        std::vector<uint8_t> undo;
        CompactUndo compact_undo;
        const StateHash base_hash = manifest.Find(*object.base_version)->state_hash;
        Result<replay::AppliedDelta> d =
            replay::ApplyDelta(std::move(*blob), entry, object, state, base_hash, threads, false, undo, compact_undo);
        if (!d.ok()) {
          if (replay::ObjectFault(d.status())) *bad = RefOf(object);
          return fail(d.status());
        }
      }
      held.parts.clear();
      held.parts.emplace(0, std::move(state));
    } else {
      std::optional<ObjectRef> fetch_bad;
      Result<std::map<size_t, Blob>> blobs = FetchSomeParts(store, object, want, threads, &fetch_bad);
      if (!blobs.ok()) {
        *bad = fetch_bad;
        return fail(blobs.status());
      }
      std::map<size_t, WeightState> parts;
      if (anchor) {
        held.parts.clear();
        for (auto& [p, blob] : *blobs) {
          Result<DecodedAnchor> d = replay::CheckAnchorPart(std::move(blob), entry, object, layout, p, threads);
          if (!d.ok()) {
            *bad = RefOf(object.parts[p]);
            return fail(d.status());
          }
          DS_ASSIGN_OR_RETURN(WeightState blocks, WeightState::FromTensors(std::move(d->tensors)));
          parts.emplace(p, std::move(blocks));
        }
      } else {
        const VersionEntry& base_entry = *manifest.Find(*object.base_version);
        DS_ASSIGN_OR_RETURN(parts, Reshape(held, layout, digest, want));
        for (auto& [p, blob] : *blobs) {
          WeightState& blocks = parts.at(p);
          // The part's base hash: the manifest's when the base version had
          // this layout; else computed from the blocks put together from
          // the parts checked at the base (the object names the hash it
          // decodes against, so a wrong base is refused, not decoded).
          const StateHash part_base = base_entry.layout == entry.layout ? base_entry.parts[p].state_hash
                                                                        : HashPart(layout, p, blocks, threads);
          Result<std::vector<TensorChanges>> changes =
              replay::CheckDeltaPart(std::move(blob), entry, object, layout, p, blocks.views(), part_base, threads);
          if (!changes.ok()) {
            if (replay::ObjectFault(changes.status())) *bad = RefOf(object.parts[p]);
            return fail(changes.status());
          }
          ApplyChanges(blocks, *changes, threads);
        }
      }
      held.parts = std::move(parts);
    }
    held.layout = &layout;
    held.digest = digest;
  }

  const VersionEntry& last = *manifest.Find(plan.steps.back().version);
  DS_ASSIGN_OR_RETURN(auto mine, Reshape(held, target, target_digest, {part}));
  RebuiltPart out;
  out.version = last.version;
  out.blocks = std::move(mine.at(part));
  out.hash = HashPart(target, part, out.blocks, threads);
  // The same layout: the blocks against the manifest's hash of this part.
  // (Another layout: each part decoded on the way was checked against its
  // own part hash, or the whole state against the version's hash.)
  if (last.layout == target_digest && out.hash != last.parts[part].state_hash) {
    return Status::Integrity("the rebuilt blocks of part " + std::to_string(part) + " of " + V(last.version) +
                             " hash to " + out.hash.Hex() + ", the manifest says " +
                             last.parts[part].state_hash.Hex());
  }
  return out;
}

}  // namespace

Status SameTensors(const PartLayout& target, const std::vector<TensorDesc>& got, uint64_t version, Store& store) {
  if (got == target.tensors) return Status::OK();
  for (size_t i = 0; i < std::max(got.size(), target.tensors.size()); ++i) {
    if (i < got.size() && i < target.tensors.size() && got[i] == target.tensors[i]) continue;
    auto say = [](const std::vector<TensorDesc>& ts, size_t i) {
      return i < ts.size() ? "'" + ts[i].name + "' (" + std::string(DTypeName(ts[i].dtype)) + " " +
                                 ShapeToString(ts[i].shape) + ")"
                           : std::string("nothing");
    };
    return Status::InvalidArgument("the layout's " + std::to_string(target.tensors.size()) + " tensors are not the " +
                                   std::to_string(got.size()) + " tensors of " + V(version) + " in " +
                                   store.Describe() + ": tensor " + std::to_string(i) + " is " +
                                   say(target.tensors, i) + " in the layout, " + say(got, i) + " in the bucket");
  }
  return Status::OK();
}

Result<RebuiltPart> RebuildPart(Store& store, const Manifest& manifest, const PartLayout& layout, uint32_t part,
                                int threads) {
  const VersionEntry* latest = manifest.Latest();
  if (!latest) return Status::NotFound(store.Describe() + ": the manifest lists no versions yet");
  const std::string digest = layout.Digest();
  // Around objects found bad, as a replica routes (plan.h).
  ObjectSet avoid;
  std::string bad_list;
  Status last_failure;
  for (;;) {
    Result<CatchUpPlan> plan = PlanCatchUp(manifest, std::nullopt, latest->version, avoid);
    if (!plan.ok()) {
      if (last_failure.ok()) return plan.status();
      return Status(last_failure.code(), last_failure.message() + "; no route to " + V(latest->version) +
                                             " is left without the object(s) found bad: " + bad_list);
    }
    std::optional<ObjectRef> bad;
    Result<RebuiltPart> rebuilt = Replay(store, manifest, *plan, layout, digest, part, threads, &bad);
    if (rebuilt.ok() || !bad || !replay::ObjectFault(rebuilt.status()) || avoid.count(*bad)) return rebuilt;
    avoid.insert(*bad);
    bad_list += (bad_list.empty() ? "" : ", ") + bad->key;
    last_failure = rebuilt.status();
  }
}

}  // namespace deltasync
