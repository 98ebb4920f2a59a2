// A block: a hyper-rectangle of a tensor (docs/format.md, "Parts"). A rank of
// a sharded trainer holds one block of each tensor it owns (FSDP2 Shard(0):
// a range of rows; Shard(k): a range along dimension k). The block's own
// elements are stored row-major in the block's shape; BlockGeometry maps
// them to the tensor's flat indices, run by run (a run is a stretch of block
// elements that is contiguous in the full tensor).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "deltasync/status.h"

namespace deltasync {

class BlockGeometry {
 public:
  BlockGeometry() = default;
  // kInvalidArgument unless offset and shape have the rank of full_shape and
  // offset[d] + shape[d] <= full_shape[d] for every d.
  static Result<BlockGeometry> Make(std::span<const uint64_t> full_shape, std::span<const uint64_t> offset,
                                    std::span<const uint64_t> shape);

  const std::vector<uint64_t>& full_shape() const { return full_; }
  const std::vector<uint64_t>& offset() const { return offset_; }
  const std::vector<uint64_t>& shape() const { return shape_; }
  uint64_t elements() const { return elements_; }
  // Elements per run and number of runs (runs * run_length == elements()).
  uint64_t run_length() const { return run_; }
  uint64_t runs() const { return elements_ == 0 ? 0 : elements_ / run_; }
  // The full tensor's flat index of run r's first element.
  uint64_t RunStart(uint64_t r) const;
  // The full tensor's flat index of block element `local` (row-major in the block).
  uint64_t FullIndex(uint64_t local) const { return RunStart(local / run_) + local % run_; }
  // True when the block is the whole tensor.
  bool whole() const { return full_ == shape_; }

 private:
  std::vector<uint64_t> full_, offset_, shape_;
  std::vector<uint64_t> strides_;  // of the full tensor, in elements
  size_t split_ = 0;               // dims [split_, rank) form one run
  uint64_t run_ = 1;
  uint64_t elements_ = 1;
};

// Copies the block's elements (element_size bytes each) out of the full
// tensor's bytes into `block` (elements() * element_size bytes), or back in.
void CopyBlockOut(const BlockGeometry& g, size_t element_size, const uint8_t* full, uint8_t* block);
void CopyBlockIn(const BlockGeometry& g, size_t element_size, const uint8_t* block, uint8_t* full);

}  // namespace deltasync
