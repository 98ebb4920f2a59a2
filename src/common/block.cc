// BlockGeometry (block.h): a block's runs in its full tensor.
#include "deltasync/block.h"

#include <cstring>
#include <string>

#include "deltasync/tensor.h"

namespace deltasync {

Result<BlockGeometry> BlockGeometry::Make(std::span<const uint64_t> full_shape, std::span<const uint64_t> offset,
                                          std::span<const uint64_t> shape) {
  const size_t rank = full_shape.size();
  if (offset.size() != rank || shape.size() != rank) {
    return Status::InvalidArgument("a block of a tensor of shape " + ShapeToString(full_shape) + " has offset " +
                                   ShapeToString(offset) + " and shape " + ShapeToString(shape) +
                                   "; both need its rank " + std::to_string(rank));
  }
  BlockGeometry g;
  g.full_.assign(full_shape.begin(), full_shape.end());
  g.offset_.assign(offset.begin(), offset.end());
  g.shape_.assign(shape.begin(), shape.end());
  for (size_t d = 0; d < rank; ++d) {
    if (offset[d] > full_shape[d] || shape[d] > full_shape[d] - offset[d]) {
      return Status::InvalidArgument("a block at offset " + ShapeToString(offset) + " of shape " +
                                     ShapeToString(shape) + " does not fit in the tensor's shape " +
                                     ShapeToString(full_shape) + " (dimension " + std::to_string(d) + ")");
    }
  }
  if (!CheckedElementCount(full_shape)) return Status::InvalidArgument("tensor shape " + ShapeToString(full_shape) + " overflows");
  g.strides_.assign(rank, 1);
  for (size_t d = rank; d-- > 1;) g.strides_[d - 1] = g.strides_[d] * full_shape[d];
  g.elements_ = *CheckedElementCount(shape);
  // The run: the innermost dimensions where the block spans the whole
  // tensor, plus the next one out.
  g.split_ = rank == 0 ? 0 : rank - 1;
  while (g.split_ > 0 && shape[g.split_] == full_shape[g.split_]) --g.split_;
  g.run_ = 1;
  for (size_t d = g.split_; d < rank; ++d) g.run_ *= shape[d];
  if (g.run_ == 0) g.run_ = 1;  // an empty block has no runs
  return g;
}

uint64_t BlockGeometry::RunStart(uint64_t r) const {
  const size_t rank = full_.size();
  if (rank == 0) return 0;
  uint64_t index = offset_[split_] * strides_[split_];
  for (size_t d = split_; d-- > 0;) {
    index += (offset_[d] + r % shape_[d]) * strides_[d];
    r /= shape_[d];
  }
  return index;
}

void CopyBlockOut(const BlockGeometry& g, size_t element_size, const uint8_t* full, uint8_t* block) {
  const size_t run_bytes = g.run_length() * element_size;
  for (uint64_t r = 0; r < g.runs(); ++r) {
    std::memcpy(block + r * run_bytes, full + g.RunStart(r) * element_size, run_bytes);
  }
}

void CopyBlockIn(const BlockGeometry& g, size_t element_size, const uint8_t* block, uint8_t* full) {
  const size_t run_bytes = g.run_length() * element_size;
  for (uint64_t r = 0; r < g.runs(); ++r) {
    std::memcpy(full + g.RunStart(r) * element_size, block + r * run_bytes, run_bytes);
  }
}

}  // namespace deltasync
