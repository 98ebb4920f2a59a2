// Parts: a version published by several processes (the ranks of a sharded
// trainer), each uploading its own part of the model (docs/format.md,
// "Parts"). A layout names the model's tensors (name, dtype, full shape) and
// splits them into P parts; a part holds, per tensor, at most one block (a
// hyper-rectangle of the tensor, block.h). The parts of a layout never
// overlap and together cover every element exactly once.
//
// The state hash needs no change: it is a sum of terms, so a version's hash
// is the descriptor terms of its tensors plus each part's hash (the element
// terms of its blocks at their flat indices in the full tensors).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "deltasync/block.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"
#include "deltasync/weight_state.h"

namespace deltasync {

struct TensorDesc {
  std::string name;
  DType dtype = DType::kBF16;  // as published (bf16 for fp32 sources, kept fp32 tensors F32)
  std::vector<uint64_t> shape;  // the full tensor's
  friend bool operator==(const TensorDesc&, const TensorDesc&) = default;
};

struct Block {
  uint32_t tensor = 0;  // index into PartLayout::tensors
  std::vector<uint64_t> offset;
  std::vector<uint64_t> shape;
  friend bool operator==(const Block&, const Block&) = default;
};

struct PartLayout {
  std::vector<TensorDesc> tensors;        // strictly ascending by name
  std::vector<std::vector<Block>> parts;  // per part: blocks strictly ascending by tensor

  // Every rule of docs/format.md "Parts" (names ascending, blocks in range
  // and non-empty, each part non-empty, every element of every tensor in
  // exactly one block). kInvalidArgument naming the tensor or part.
  Status Validate() const;
  // XXH3-128 of the canonical bytes (docs/format.md), 32 hex digits.
  std::string Digest() const;
  uint64_t total_elements() const;
  uint64_t PartElements(size_t part) const;
  // REQUIRES: Validate() is OK.
  BlockGeometry Geometry(const Block& block) const;
  // The sum of the descriptor terms of every tensor.
  StateHash DescriptorTerms() const;

  friend bool operator==(const PartLayout&, const PartLayout&) = default;
};

// Keys of a part's objects: "ds/parts/step_000012.anchor.part_00001_of_00004.safetensors",
// "ds/parts/step_000012.delta_from_000011.part_00001_of_00004.safetensors".
std::string PartAnchorKey(uint64_t version, size_t part, size_t parts);
std::string PartDeltaKey(uint64_t version, uint64_t base_version, size_t part, size_t parts);

// The block state of `part`: one tensor per block, named by the full
// tensor's name, of the block's shape, copied out of `full` (which holds the
// layout's tensors). kInvalidArgument when `full` does not match the layout.
Result<WeightState> ExtractPart(const PartLayout& layout, size_t part, const WeightState& full);
// The hash of a part's block state (element terms at full flat indices).
StateHash HashPart(const PartLayout& layout, size_t part, const WeightState& blocks, int threads = 0);

}  // namespace deltasync
