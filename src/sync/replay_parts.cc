// Checked replay steps (replay.h) over a parted version's parts: each
// part's object fetched and checked against its listing, decoded part by
// part, merged into one change list per tensor, and applied with each
// part's hash checked, the parts applied before a failure restored. The
// steps over whole objects are in replay.cc.
#include "sync/replay.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "codec/compact_bf16.h"
#include "common/pages.h"
#include "common/parallel.h"
#include "deltasync/safetensors.h"
#include "sync/replay_checks.h"

namespace deltasync::replay {
namespace {

std::string PartOf(const ObjectEntry& object, size_t p) {
  return object.parts[p].key + " (part " + std::to_string(p) + " of " + std::to_string(object.parts.size()) + ")";
}

// The metadata of a part's object against its listing.
Status CheckPartListed(const PatchInfo& info, const ObjectEntry& object, size_t p, uint64_t version) {
  ObjectEntry one = object;
  one.key = object.parts[p].key;
  return CheckListed(info, one, version);
}

// A part's decoded block tensors must be exactly its blocks: names, dtypes, shapes.
Status CheckBlocks(const std::vector<WeightState::Tensor>& got, const PartLayout& layout, size_t p,
                   const std::string& label) {
  const std::vector<Block>& blocks = layout.parts[p];
  if (got.size() != blocks.size()) {
    return Status::Corruption(label + ": holds " + std::to_string(got.size()) + " tensors; the layout gives the part " +
                              std::to_string(blocks.size()) + " blocks");
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    const TensorDesc& d = layout.tensors[blocks[i].tensor];
    if (got[i].name != d.name || got[i].dtype != d.dtype || got[i].shape != blocks[i].shape) {
      return Status::Corruption(label + ": tensor '" + got[i].name + "' (" + std::string(DTypeName(got[i].dtype)) + " " +
                                ShapeToString(got[i].shape) + ") is not the layout's block of '" + d.name + "' (" +
                                std::string(DTypeName(d.dtype)) + " " + ShapeToString(blocks[i].shape) + ")");
    }
  }
  return Status::OK();
}

}  // namespace

Result<std::vector<Blob>> FetchParts(Store& store, const ObjectEntry& object, int threads, uint64_t* downloaded,
                                     size_t* bad_part) {
  const size_t n = object.parts.size();
  std::vector<std::optional<Result<Blob>>> got(n);
  std::vector<uint64_t> bytes(n, 0);
  ParallelFor(n, std::min(ResolveThreads(threads), 16), [&](size_t p) {
    got[p] = FetchListed(store, object.parts[p], &bytes[p]);
  });
  *downloaded += std::accumulate(bytes.begin(), bytes.end(), uint64_t{0});
  std::vector<Blob> out;
  out.reserve(n);
  for (size_t p = 0; p < n; ++p) {
    if (!got[p]->ok()) {
      if (bad_part) *bad_part = p;
      return got[p]->status();
    }
    out.push_back(std::move(**got[p]));
  }
  return out;
}

Result<DecodedAnchor> CheckAnchorPart(Blob bytes, const VersionEntry& entry, const ObjectEntry& object,
                                      const PartLayout& layout, size_t p, int threads) {
  const std::string label = PartOf(object, p);
  DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(std::move(bytes), object.parts[p].key));
  if (!IsCompressedAnchor(file)) return Status::Corruption(label + ": the manifest lists a compressed anchor, the file is not one");
  DS_ASSIGN_OR_RETURN(DecodedAnchor d, DecodeCompressedAnchor(file, threads));
  PatchInfo info;
  info.kind = PatchKind::kAnchor;
  info.model_version = d.model_version;
  DS_RETURN_IF_ERROR(CheckPartListed(info, object, p, entry.version));
  DS_RETURN_IF_ERROR(CheckBlocks(d.tensors, layout, p, label));
  StateHash hash;
  for (size_t i = 0; i < d.tensors.size(); ++i) {
    hash += HashBlock(d.tensors[i].name, d.tensors[i].dtype, layout.Geometry(layout.parts[p][i]), d.tensors[i].data,
                      threads);
  }
  if (hash != entry.parts[p].state_hash) {
    return Status::Integrity(label + ": its blocks hash to " + hash.Hex() + ", the manifest says " +
                             entry.parts[p].state_hash.Hex());
  }
  return d;
}

Result<CheckedAnchor> CheckPartedAnchor(std::vector<Blob> parts, const VersionEntry& entry, const ObjectEntry& object,
                                        const PartLayout& layout, int threads, size_t* bad_part) {
  DecodedAnchor full;
  full.model_version = entry.version;
  full.tensors.reserve(layout.tensors.size());
  std::vector<std::vector<uint8_t>*> data;
  std::vector<size_t> sizes;
  for (const TensorDesc& d : layout.tensors) {
    WeightState::Tensor& t = full.tensors.emplace_back();
    t.name = d.name;
    t.dtype = d.dtype;
    t.shape = d.shape;
    data.push_back(&t.data);
    sizes.push_back(static_cast<size_t>(CheckedElementCount(d.shape).value_or(0) * DTypeSize(d.dtype)));
  }
  ResizeFresh(data, sizes, threads);
  for (size_t p = 0; p < parts.size(); ++p) {
    if (bad_part) *bad_part = p;
    DS_ASSIGN_OR_RETURN(DecodedAnchor d, CheckAnchorPart(std::move(parts[p]), entry, object, layout, p, threads));
    for (size_t i = 0; i < d.tensors.size(); ++i) {
      const Block& b = layout.parts[p][i];
      CopyBlockIn(layout.Geometry(b), DTypeSize(d.tensors[i].dtype), d.tensors[i].data.data(),
                  full.tensors[b.tensor].data.data());
    }
  }
  if (bad_part) *bad_part = SIZE_MAX;
  CheckedAnchor out;
  out.decoded = std::move(full);
  out.views = out.decoded->views();
  // Each part checked above; the whole once more, from the assembled tensors.
  out.hash = HashTensors(out.views, threads);
  if (out.hash != entry.state_hash) {
    return Status::Integrity("the assembled parts hash to " + out.hash.Hex() + ", the manifest says " +
                             entry.state_hash.Hex());
  }
  return out;
}

Result<std::vector<TensorChanges>> CheckDeltaPart(Blob bytes, const VersionEntry& entry, const ObjectEntry& object,
                                                  const PartLayout& layout, size_t p,
                                                  std::span<const TensorView> blocks, const StateHash& part_base,
                                                  int threads) {
  const std::string label = PartOf(object, p);
  DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(std::move(bytes), object.parts[p].key));
  if (!IsCompactDelta(file)) return Status::Corruption(label + ": the manifest lists a compact delta, the file is not one");
  Result<CompactDelta> d = DecodeCompactDelta(file, blocks, part_base, threads);
  if (!d.ok()) return d.status().WithContext(label);
  d->info.kind = PatchKind::kDelta;
  DS_RETURN_IF_ERROR(CheckPartListed(d->info, object, p, entry.version));
  StateHash part_hash = part_base;
  for (const TensorChanges& c : d->changes) {
    const TensorView* before =
        &*std::find_if(blocks.begin(), blocks.end(), [&](const TensorView& v) { return v.name == c.name; });
    const size_t width = DTypeSize(c.dtype);
    auto b = std::find_if(layout.parts[p].begin(), layout.parts[p].end(),
                          [&](const Block& blk) { return layout.tensors[blk.tensor].name == c.name; });
    std::vector<uint8_t> old(c.values.size());
    for (size_t k = 0; k < c.indices.size(); ++k) {
      std::memcpy(old.data() + k * width, before->data.data() + c.indices[k] * width, width);
    }
    part_hash += HashBlockChanges(c.name, c.dtype, layout.Geometry(*b), c.indices, old, c.values);
  }
  if (part_hash != entry.parts[p].state_hash) {
    return Status::Integrity(label + ": its blocks would hash to " + part_hash.Hex() + ", the manifest says " +
                             entry.parts[p].state_hash.Hex());
  }
  return std::move(d->changes);
}

namespace {

// A parted delta's parts decoded against their blocks of the held state:
// each part's changes at block-local indices, and the state hash after.
struct DecodedParts {
  std::vector<std::vector<TensorChanges>> parts;
  StateHash next;
};

// Each part decoded against its blocks of `base`, in place where a block is
// one run of its tensor (a row range, a whole tensor), copied out otherwise
// (Shard(1)); each checked against its part hash. `base` is only read.
Result<DecodedParts> DecodeParts(std::vector<Blob> parts, const VersionEntry& entry, const ObjectEntry& object,
                                 const PartLayout& layout, const WeightState& base, const StateHash& base_hash,
                                 const VersionEntry& base_entry, int threads, size_t* bad_part) {
  const bool same_layout = base_entry.layout == entry.layout;
  DecodedParts out;
  out.parts.resize(parts.size());
  out.next = base_hash;
  for (size_t p = 0; p < parts.size(); ++p) {
    if (bad_part) *bad_part = SIZE_MAX;
    // The part's base: its blocks of the held state (which must be the layout's tensors).
    std::vector<TensorView> blocks;
    std::vector<std::vector<uint8_t>> copies;
    StateHash computed_base;
    for (const Block& b : layout.parts[p]) {
      const TensorDesc& d = layout.tensors[b.tensor];
      const WeightState::Tensor* t = base.Find(d.name);
      if (!t || t->dtype != d.dtype || t->shape != d.shape) {
        return Status::InvalidArgument("tensor '" + d.name + "' of the layout of " + V(entry.version) + " (" +
                                       std::string(DTypeName(d.dtype)) + " " + ShapeToString(d.shape) +
                                       ") is not a tensor of the held state");
      }
      const BlockGeometry g = layout.Geometry(b);
      const size_t width = DTypeSize(d.dtype);
      ByteSpan bytes;
      if (g.runs() == 1) {
        bytes = ByteSpan(t->data.data() + g.RunStart(0) * width, g.elements() * width);
      } else {
        std::vector<uint8_t>& copy = copies.emplace_back(g.elements() * width);
        CopyBlockOut(g, width, t->data.data(), copy.data());
        bytes = copy;
      }
      blocks.push_back(TensorView{d.name, d.dtype, b.shape, bytes});
      if (!same_layout) computed_base += HashBlock(d.name, d.dtype, g, bytes, threads);
    }
    // The base hash the part's object must name: the manifest's, when the
    // base version had this layout; else computed from the held blocks.
    const StateHash part_base = same_layout ? base_entry.parts[p].state_hash : computed_base;
    if (bad_part) *bad_part = p;
    DS_ASSIGN_OR_RETURN(out.parts[p],
                        CheckDeltaPart(std::move(parts[p]), entry, object, layout, p, blocks, part_base, threads));
    out.next += entry.parts[p].state_hash;  // checked: what the part's blocks hash to after it
    out.next -= part_base;
  }
  if (bad_part) *bad_part = SIZE_MAX;
  if (out.next != entry.state_hash) {
    return Status::Integrity("the state after its parts would hash to " + out.next.Hex() + ", the manifest says " +
                             entry.state_hash.Hex());
  }
  return out;
}

// The parts' changes at full flat indices, one entry per changed tensor in
// name order, indices ascending.
std::vector<TensorChanges> MergeParts(std::vector<std::vector<TensorChanges>> parts, const PartLayout& layout) {
  std::vector<TensorChanges> merged(layout.tensors.size());
  std::vector<size_t> contributions(layout.tensors.size(), 0);
  for (size_t p = 0; p < parts.size(); ++p) {
    for (TensorChanges& c : parts[p]) {
      auto b = std::find_if(layout.parts[p].begin(), layout.parts[p].end(),
                            [&](const Block& blk) { return layout.tensors[blk.tensor].name == c.name; });
      const BlockGeometry g = layout.Geometry(*b);
      TensorChanges& into = merged[b->tensor];
      into.name = c.name;
      into.dtype = c.dtype;
      for (uint64_t& i : c.indices) i = g.FullIndex(i);
      into.indices.insert(into.indices.end(), c.indices.begin(), c.indices.end());
      into.values.insert(into.values.end(), c.values.begin(), c.values.end());
      contributions[b->tensor]++;
    }
  }
  std::vector<TensorChanges> out;
  for (size_t t = 0; t < merged.size(); ++t) {
    TensorChanges& c = merged[t];
    if (c.indices.empty()) continue;
    if (contributions[t] > 1) {
      // Blocks of several parts: sort by index (each part's run is ascending).
      // The permutation is 32-bit while the changes' count fits (half the
      // memory); a tensor of more than 2^32 changes (a fused expert stack
      // changed entirely) needs 64 bits, or it would wrap and scramble values.
      const size_t width = DTypeSize(c.dtype);
      auto sort_by_index = [&](auto zero) {
        using Position = decltype(zero);
        std::vector<Position> order(c.indices.size());
        std::iota(order.begin(), order.end(), Position{0});
        std::sort(order.begin(), order.end(), [&](Position a, Position b) { return c.indices[a] < c.indices[b]; });
        TensorChanges sorted;
        sorted.name = c.name;
        sorted.dtype = c.dtype;
        sorted.indices.reserve(order.size());
        sorted.values.resize(c.values.size());
        for (size_t k = 0; k < order.size(); ++k) {
          sorted.indices.push_back(c.indices[order[k]]);
          std::memcpy(sorted.values.data() + k * width, c.values.data() + static_cast<size_t>(order[k]) * width, width);
        }
        c = std::move(sorted);
      };
      if (c.indices.size() <= UINT32_MAX) {
        sort_by_index(uint32_t{0});
      } else {
        sort_by_index(uint64_t{0});
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

Result<CheckedDelta> CheckPartedDelta(std::vector<Blob> parts, const VersionEntry& entry, const ObjectEntry& object,
                                      const PartLayout& layout, const WeightState& base, const StateHash& base_hash,
                                      const VersionEntry& base_entry, int threads, size_t* bad_part) {
  DS_ASSIGN_OR_RETURN(DecodedParts d,
                      DecodeParts(std::move(parts), entry, object, layout, base, base_hash, base_entry, threads, bad_part));
  CheckedDelta out;
  out.changes = MergeParts(std::move(d.parts), layout);
  out.next = d.next;
  return out;
}

namespace {

// One part applied in place by ApplyPartedDelta: its undo log and, for each
// block that is not one run of its tensor, the block's copy the part was
// applied to (copied back in after).
struct AppliedPart {
  CompactUndo undo;
  struct Copy {
    BlockGeometry geometry;
    size_t width;
    std::vector<uint8_t> bytes;
    uint8_t* full;
  };
  std::vector<Copy> copies;
};

// Puts back every part in `applied` (newest first): the state holds what it
// held before the first.
void RestoreParts(std::vector<AppliedPart>& applied, int threads) {
  for (auto it = applied.rbegin(); it != applied.rend(); ++it) {
    it->undo.Restore(threads);
    for (const AppliedPart::Copy& c : it->copies) CopyBlockIn(c.geometry, c.width, c.bytes.data(), c.full);
  }
  applied.clear();
}

// The change a fused apply made to its blocks' element terms (in the frame
// of the full tensors, as the part hashes are), from its undo log: each
// run's positions, old values, and the new values now in the blocks.
StateHash PartHashChange(const CompactUndo& undo, std::span<const TensorView> blocks,
                         std::span<uint8_t* const> writable, std::span<const BlockGeometry> geometries) {
  StateHash sum;
  std::vector<uint8_t> now;
  std::vector<uint64_t> at;
  for (const CompactUndo::Run& run : undo.runs) {
    if (run.written == 0) continue;
    size_t b = 0;  // the block written (an empty block may share its start with the next)
    while (writable[b] != run.data || blocks[b].data.empty()) ++b;
    now.resize(run.written * run.esize);
    at.resize(run.written);
    for (uint64_t j = 0; j < run.written; ++j) {
      at[j] = run.Position(j);
      std::memcpy(now.data() + j * run.esize, run.data + at[j] * run.esize, run.esize);
    }
    sum += HashBlockChanges(blocks[b].name, blocks[b].dtype, geometries[b], at,
                            ByteSpan(run.old, run.written * run.esize), now);
  }
  return sum;
}

}  // namespace

Result<AppliedDelta> ApplyPartedDelta(std::vector<Blob> parts, const VersionEntry& entry, const ObjectEntry& object,
                                      const PartLayout& layout, WeightState& state, const StateHash& state_hash,
                                      const VersionEntry& base_entry, int threads, bool want_changes,
                                      PartTotals& totals, size_t* bad_part) {
  if (want_changes) {
    // The changes are wanted at full flat indices: decoded and checked
    // first, then written.
    DS_ASSIGN_OR_RETURN(DecodedParts d, DecodeParts(std::move(parts), entry, object, layout, state, state_hash,
                                                    base_entry, threads, bad_part));
    AppliedDelta out;
    out.changes = MergeParts(std::move(d.parts), layout);
    ApplyChanges(state, out.changes, threads);
    out.next = d.next;
    return out;
  }
  // Each part decoded straight into its blocks of the held state
  // (ApplyCompactDelta: the old values logged), then checked against its part
  // hash; any failure puts back every part written so far.
  // Each part's held class totals (kept across versions of this layout)
  // lent to its undo for the apply, taken back once the version checks out.
  const bool same_layout = base_entry.layout == entry.layout;
  if (totals.layout != entry.layout || totals.parts.size() != parts.size()) {
    totals.Forget();
    totals.layout = entry.layout;
    totals.parts.resize(parts.size());
  }
  std::vector<AppliedPart> applied;
  applied.reserve(parts.size());
  StateHash next = state_hash;
  AppliedDelta out;
  auto fail = [&](Status s) {
    RestoreParts(applied, threads);
    totals.Forget();
    return s;
  };
  for (size_t p = 0; p < parts.size(); ++p) {
    if (bad_part) *bad_part = SIZE_MAX;
    AppliedPart& part = applied.emplace_back();
    std::swap(part.undo.totals, totals.parts[p]);
    std::vector<TensorView> blocks;
    std::vector<uint8_t*> writable;
    std::vector<BlockGeometry> geometries;
    StateHash computed_base;
    part.copies.reserve(layout.parts[p].size());
    for (const Block& b : layout.parts[p]) {
      const TensorDesc& d = layout.tensors[b.tensor];
      WeightState::Tensor* t = state.FindMutable(d.name);
      if (!t || t->dtype != d.dtype || t->shape != d.shape) {
        return fail(Status::InvalidArgument("tensor '" + d.name + "' of the layout of " + V(entry.version) + " (" +
                                            std::string(DTypeName(d.dtype)) + " " + ShapeToString(d.shape) +
                                            ") is not a tensor of the held state"));
      }
      const BlockGeometry g = layout.Geometry(b);
      const size_t width = DTypeSize(d.dtype);
      uint8_t* bytes;
      if (g.runs() == 1) {
        bytes = t->data.data() + g.RunStart(0) * width;
      } else {
        AppliedPart::Copy& copy = part.copies.emplace_back(AppliedPart::Copy{g, width, {}, t->data.data()});
        copy.bytes.resize(g.elements() * width);
        CopyBlockOut(g, width, t->data.data(), copy.bytes.data());
        bytes = copy.bytes.data();
      }
      blocks.push_back(TensorView{d.name, d.dtype, b.shape, ByteSpan(bytes, g.elements() * width)});
      writable.push_back(bytes);
      geometries.push_back(g);
      if (!same_layout) computed_base += HashBlock(d.name, d.dtype, g, blocks.back().data, threads);
    }
    // The base hash the part's object must name: the manifest's, when the
    // base version had this layout; else computed from the held blocks.
    const StateHash part_base = same_layout ? base_entry.parts[p].state_hash : computed_base;
    if (bad_part) *bad_part = p;
    const std::string label = PartOf(object, p);
    Result<SafetensorsFile> file = SafetensorsFile::Parse(std::move(parts[p]), object.parts[p].key);
    if (!file.ok()) return fail(file.status());
    if (!IsCompactDelta(*file)) {
      return fail(Status::Corruption(label + ": the manifest lists a compact delta, the file is not one"));
    }
    // On an error the part has put back what it wrote itself.
    const uint64_t held = part.undo.totals.held_applies, stale = part.undo.totals.stale;
    Result<CompactDelta> d = compact::ApplyCompactDeltaToViews(*file, blocks, writable, part_base, threads, part.undo);
    if (!d.ok()) return fail(d.status().WithContext(label));
    CountApply(part.undo.totals, held, stale, out);
    d->info.kind = PatchKind::kDelta;
    Status listed = CheckPartListed(d->info, object, p, entry.version);
    if (!listed.ok()) return fail(listed);
    const StateHash part_hash = part_base + PartHashChange(part.undo, blocks, writable, geometries);
    if (part_hash != entry.parts[p].state_hash) {
      return fail(Status::Integrity(label + ": its blocks would hash to " + part_hash.Hex() + ", the manifest says " +
                                    entry.parts[p].state_hash.Hex()));
    }
    // The totals of the blocks after it, held under the part hash the next
    // version names as its base (the apply keyed them in the blocks' frame).
    part.undo.totals.Rename(part_base + d->hash_delta, part_hash);
    for (const AppliedPart::Copy& c : part.copies) CopyBlockIn(c.geometry, c.width, c.bytes.data(), c.full);
    next += entry.parts[p].state_hash;  // checked: what the part's blocks hash to after it
    next -= part_base;
  }
  if (bad_part) *bad_part = SIZE_MAX;
  if (next != entry.state_hash) {
    return fail(Status::Integrity("the state after its parts would hash to " + next.Hex() + ", the manifest says " +
                                  entry.state_hash.Hex()));
  }
  for (size_t p = 0; p < parts.size(); ++p) std::swap(totals.parts[p], applied[p].undo.totals);
  out.next = next;
  return out;
}

}  // namespace deltasync::replay
