// The walk from a chunk's gap stream to its changes' indices (internal):
// one loop for the in-scan apply (ApplyGapBlock: one block's gaps, all of
// 16 bits) and the undo (UndoGapChunk: a whole chunk's, with the gaps past
// 16 bits from its list of wide gaps).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

namespace deltasync::bf16 {

// Change 0 of a stream is at `first`; change k > 0 is at change k - 1's
// index + gap + 1, its gap being gaps[k] unless `wide` lists (k, gap) for it
// (k ascending, every k > 0). gaps[0] is not read. Next() hands the indices
// out in pieces of any size.
class GapWalk {
 public:
  GapWalk(uint64_t first, const uint16_t* gaps, std::span<const std::pair<size_t, uint64_t>> wide = {})
      : at_(first), gaps_(gaps), wide_(wide.data()), wide_end_(wide.data() + wide.size()) {}

  // Writes the next n changes' indices to indices[0, n).
  void Next(size_t n, uint64_t* indices) {
    size_t j = 0;
    if (k_ == 0 && n > 0) {
      indices[j++] = at_;
      k_ = 1;
    }
    while (j < n) {
      // The 16-bit gaps up to the next wide one, in one tight loop.
      const size_t run = wide_ == wide_end_ ? n - j : std::min(n - j, wide_->first - k_);
      const uint16_t* const g = gaps_ + k_;
      uint64_t* const out = indices + j;
      uint64_t at = at_;
      for (size_t i = 0; i < run; ++i) {
        at += uint64_t{g[i]} + 1;
        out[i] = at;
      }
      at_ = at;
      j += run;
      k_ += run;
      if (j < n) {  // change k_ has a wide gap
        at_ += wide_->second + 1;
        indices[j++] = at_;
        ++k_;
        ++wide_;
      }
    }
  }

 private:
  uint64_t at_;  // the index of change k_ - 1 (of change 0 while k_ is 0)
  size_t k_ = 0;  // the next change
  const uint16_t* gaps_;
  const std::pair<size_t, uint64_t>* wide_;  // the next wide gap
  const std::pair<size_t, uint64_t>* wide_end_;
};

}  // namespace deltasync::bf16
