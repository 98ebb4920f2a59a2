// Part layouts (parts.h): validation, digest, keys, block states.
#include "deltasync/parts.h"

#include <cinttypes>
#include <cstdio>

#include "deltasync/manifest.h"

namespace deltasync {
namespace {

void AppendU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

bool Overlap(const Block& a, const Block& b) {
  for (size_t d = 0; d < a.offset.size(); ++d) {
    if (a.offset[d] + a.shape[d] <= b.offset[d] || b.offset[d] + b.shape[d] <= a.offset[d]) return false;
  }
  return true;
}

std::string Where(const PartLayout& l, size_t part, const Block& b) {
  const std::string name = b.tensor < l.tensors.size() ? "'" + l.tensors[b.tensor].name + "'" : "a tensor";
  return "part " + std::to_string(part) + ", block of " + name;
}

}  // namespace

Status PartLayout::Validate() const {
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (t > 0 && !(tensors[t - 1].name < tensors[t].name)) {
      return Status::InvalidArgument("layout: tensor '" + tensors[t].name + "' is not after '" + tensors[t - 1].name +
                                     "'; tensors are listed once each, in name order");
    }
    if (!CheckedElementCount(tensors[t].shape)) {
      return Status::InvalidArgument("layout: tensor '" + tensors[t].name + "' has a shape that overflows");
    }
  }
  if (parts.empty()) return Status::InvalidArgument("layout: no parts");
  std::vector<uint64_t> covered(tensors.size(), 0);
  std::vector<std::vector<const Block*>> by_tensor(tensors.size());
  for (size_t p = 0; p < parts.size(); ++p) {
    if (parts[p].empty()) return Status::InvalidArgument("layout: part " + std::to_string(p) + " has no blocks");
    for (size_t i = 0; i < parts[p].size(); ++i) {
      const Block& b = parts[p][i];
      if (b.tensor >= tensors.size()) {
        return Status::InvalidArgument("layout: part " + std::to_string(p) + " names tensor " +
                                       std::to_string(b.tensor) + " of " + std::to_string(tensors.size()));
      }
      if (i > 0 && parts[p][i - 1].tensor >= b.tensor) {
        return Status::InvalidArgument("layout: " + Where(*this, p, b) +
                                       ": blocks of a part are in tensor order, one per tensor");
      }
      Result<BlockGeometry> g = BlockGeometry::Make(tensors[b.tensor].shape, b.offset, b.shape);
      if (!g.ok()) return Status::InvalidArgument("layout: " + Where(*this, p, b) + ": " + g.status().message());
      if (g->elements() == 0) return Status::InvalidArgument("layout: " + Where(*this, p, b) + ": the block is empty");
      for (const Block* other : by_tensor[b.tensor]) {
        if (Overlap(*other, b)) {
          return Status::InvalidArgument("layout: " + Where(*this, p, b) + " at offset " + ShapeToString(b.offset) +
                                         " overlaps another part's block at offset " + ShapeToString(other->offset));
        }
      }
      by_tensor[b.tensor].push_back(&b);
      covered[b.tensor] += g->elements();
    }
  }
  for (size_t t = 0; t < tensors.size(); ++t) {
    const uint64_t n = *CheckedElementCount(tensors[t].shape);
    if (covered[t] != n) {
      return Status::InvalidArgument("layout: the blocks of tensor '" + tensors[t].name + "' cover " +
                                     std::to_string(covered[t]) + " of its " + std::to_string(n) +
                                     " elements; the parts must cover every element exactly once");
    }
  }
  return Status::OK();
}

std::string PartLayout::Digest() const {
  std::string bytes = "deltasync-layout-1";
  AppendU64(bytes, tensors.size());
  for (const TensorDesc& t : tensors) {
    AppendU64(bytes, t.name.size());
    bytes += t.name;
    const std::string_view dtype = DTypeName(t.dtype);
    AppendU64(bytes, dtype.size());
    bytes += dtype;
    AppendU64(bytes, t.shape.size());
    for (uint64_t d : t.shape) AppendU64(bytes, d);
  }
  AppendU64(bytes, parts.size());
  for (const std::vector<Block>& part : parts) {
    AppendU64(bytes, part.size());
    for (const Block& b : part) {
      AppendU64(bytes, b.tensor);
      AppendU64(bytes, b.offset.size());
      for (uint64_t d : b.offset) AppendU64(bytes, d);
      for (uint64_t d : b.shape) AppendU64(bytes, d);
    }
  }
  return Xxh3Hex(ByteSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

uint64_t PartLayout::total_elements() const {
  uint64_t n = 0;
  for (const TensorDesc& t : tensors) n += CheckedElementCount(t.shape).value_or(0);
  return n;
}

uint64_t PartLayout::PartElements(size_t part) const {
  uint64_t n = 0;
  for (const Block& b : parts[part]) n += CheckedElementCount(b.shape).value_or(0);
  return n;
}

BlockGeometry PartLayout::Geometry(const Block& block) const {
  return *BlockGeometry::Make(tensors[block.tensor].shape, block.offset, block.shape);
}

StateHash PartLayout::DescriptorTerms() const {
  StateHash h;
  for (const TensorDesc& t : tensors) h += DescriptorTerm(t.name, t.dtype, t.shape);
  return h;
}

std::string PartAnchorKey(uint64_t version, size_t part, size_t parts) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "ds/parts/step_%06" PRIu64 ".anchor.part_%05zu_of_%05zu.safetensors", version, part,
                parts);
  return buf;
}

std::string PartDeltaKey(uint64_t version, uint64_t base_version, size_t part, size_t parts) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "ds/parts/step_%06" PRIu64 ".delta_from_%06" PRIu64 ".part_%05zu_of_%05zu.safetensors",
                version, base_version, part, parts);
  return buf;
}

Result<WeightState> ExtractPart(const PartLayout& layout, size_t part, const WeightState& full) {
  std::vector<WeightState::Tensor> blocks;
  blocks.reserve(layout.parts[part].size());
  for (const Block& b : layout.parts[part]) {
    const TensorDesc& d = layout.tensors[b.tensor];
    const WeightState::Tensor* t = full.Find(d.name);
    if (!t || t->dtype != d.dtype || t->shape != d.shape) {
      return Status::InvalidArgument("tensor '" + d.name + "' of the layout (" + std::string(DTypeName(d.dtype)) + " " +
                                     ShapeToString(d.shape) + ") is " +
                                     (t ? std::string(DTypeName(t->dtype)) + " " + ShapeToString(t->shape)
                                        : std::string("missing")) +
                                     " in the state");
    }
    const BlockGeometry g = layout.Geometry(b);
    WeightState::Tensor& out = blocks.emplace_back();
    out.name = d.name;
    out.dtype = d.dtype;
    out.shape = b.shape;
    out.data.resize(g.elements() * DTypeSize(d.dtype));
    CopyBlockOut(g, DTypeSize(d.dtype), t->data.data(), out.data.data());
  }
  return WeightState::FromTensors(std::move(blocks));
}

StateHash HashPart(const PartLayout& layout, size_t part, const WeightState& blocks, int threads) {
  StateHash h;
  for (const Block& b : layout.parts[part]) {
    const TensorDesc& d = layout.tensors[b.tensor];
    const WeightState::Tensor* t = blocks.Find(d.name);
    if (!t) continue;  // breaks the REQUIRES; the hash will not match
    h += HashBlock(d.name, d.dtype, layout.Geometry(b), t->data, threads);
  }
  return h;
}

}  // namespace deltasync
