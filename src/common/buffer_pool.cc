// BufferPool (deltasync/blob.h): released BlobBuffer pages kept mapped for
// reuse, so that a download into memory does not pay the kernel's fault and
// clear of every fresh page again.
#include <sys/mman.h>

#include <vector>

#include "deltasync/blob.h"

namespace deltasync {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;  // smaller mappings are not kept

}  // namespace

BufferPool::~BufferPool() {
  for (const Mapping& m : held_) ::munmap(m.data, m.bytes);
}

size_t BufferPool::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_bytes_;
}

size_t BufferPool::held_mappings() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_.size();
}

BufferPool::Mapping BufferPool::Take(size_t bytes) {
  std::vector<Mapping> drop;
  Mapping m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t best = held_.size();
    for (size_t i = 0; i < held_.size(); ++i) {
      const size_t b = held_[i].bytes;
      if (b >= bytes && b / 2 <= bytes && (best == held_.size() || b < held_[best].bytes)) best = i;
    }
    if (best < held_.size()) {
      misses_ = 0;
      m = held_[best];
      held_.erase(held_.begin() + static_cast<std::ptrdiff_t>(best));
      held_bytes_ -= m.bytes;
    } else if (!held_.empty() && ++misses_ >= kMaxMisses) {
      drop.swap(held_);  // nothing held fits what is asked for any more
      held_bytes_ = 0;
      misses_ = 0;
    }
  }
  for (const Mapping& d : drop) ::munmap(d.data, d.bytes);  // outside the lock
  return m;
}

void BufferPool::Give(Mapping m) {
  if (m.data == nullptr || m.bytes == 0) return;
  std::vector<Mapping> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (m.bytes < kHugePage || m.bytes > max_bytes_) {
      drop.push_back(m);
    } else {
      while (held_bytes_ + m.bytes > max_bytes_) {
        drop.push_back(held_.front());
        held_bytes_ -= held_.front().bytes;
        held_.erase(held_.begin());
      }
      held_.push_back(m);
      held_bytes_ += m.bytes;
    }
  }
  for (const Mapping& d : drop) ::munmap(d.data, d.bytes);  // outside the lock
}

}  // namespace deltasync
