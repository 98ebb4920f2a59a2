#include "codec/stream_buffers.h"

#include <algorithm>

namespace deltasync::compact {

std::vector<uint8_t> StreamBuffers::Take() {
  if (spare_.empty()) return {};
  std::vector<uint8_t> out = std::move(spare_.back());
  spare_.pop_back();
  out.clear();
  return out;
}

void StreamBuffers::Give(std::vector<std::vector<uint8_t>> buffers, uint64_t used_bytes) {
  const size_t max_count = buffers.size();
  for (std::vector<uint8_t>& b : buffers) {
    if (b.capacity() == 0) continue;
    b.clear();
    spare_.push_back(std::move(b));
  }
  std::sort(spare_.begin(), spare_.end(),
            [](const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) { return a.capacity() < b.capacity(); });
  // Too large: drop the largest.
  const uint64_t limit = kSlack * used_bytes + kFloor;
  uint64_t total = capacity_bytes();
  while (total > limit && !spare_.empty()) {
    total -= spare_.back().capacity();
    spare_.pop_back();
  }
  // Too many: drop the smallest (cheap to allocate again).
  if (spare_.size() > max_count) spare_.erase(spare_.begin(), spare_.begin() + (spare_.size() - max_count));
}

void StreamBuffers::Release() {
  spare_.clear();
  spare_.shrink_to_fit();
}

uint64_t StreamBuffers::capacity_bytes() const {
  uint64_t total = 0;
  for (const std::vector<uint8_t>& b : spare_) total += b.capacity();
  return total;
}

}  // namespace deltasync::compact
