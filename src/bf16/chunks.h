// Splitting tensors into chunks of elements for ParallelFor (internal).
//
// Work is spread by chunk, not by tensor: one embedding can hold a quarter of
// a model, and it must not run on a single thread while the others idle.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace deltasync::bf16 {

// 2 Mi elements: a few MB of input per task, so the per-task costs (a thread
// handoff, output buffers) vanish, while a 0.6B model still gives ~300 tasks
// to balance across threads.
inline constexpr uint64_t kDefaultChunkElements = uint64_t{1} << 21;

// Elements [begin, end) of tensor number `tensor`.
struct Chunk {
  size_t tensor = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Chunks covering every element of every tensor, tensor by tensor in order
// and ascending within a tensor, each at most `chunk_elements` long (0 is
// taken as 1). Empty tensors get no chunk.
inline std::vector<Chunk> SplitIntoChunks(std::span<const uint64_t> element_counts,
                                          uint64_t chunk_elements) {
  chunk_elements = std::max<uint64_t>(chunk_elements, 1);
  std::vector<Chunk> chunks;
  for (size_t t = 0; t < element_counts.size(); ++t) {
    // begin < n, so begin + step cannot wrap when step <= n - begin.
    for (uint64_t begin = 0; begin < element_counts[t];) {
      const uint64_t len = std::min(chunk_elements, element_counts[t] - begin);
      chunks.push_back({t, begin, begin + len});
      begin += len;
    }
  }
  return chunks;
}

}  // namespace deltasync::bf16
