// Handing chunks that finish in any order to a step that must see them in
// chunk order (internal): DetectChanges copies each chunk's changes into its
// tensor's output as soon as every chunk before it is done, while the
// chunk's scratch is still in cache, rather than all of them after the scan.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace deltasync::bf16 {

class InOrder {
 public:
  explicit InOrder(size_t chunks) : done_(chunks, 0) {}

  // Marks chunk `c` finished. Then, unless another thread is running `step`
  // (it will see `c` before it stops), runs step(first, end) for each run of
  // finished chunks from the first not yet stepped, in order, outside the
  // lock. Every chunk reaches `step` exactly once, after every chunk before
  // it, and only once all of those are finished: a chunk never marked
  // finished (a failed one) holds back every chunk after it. Calls of `step`
  // never overlap, and each happens after the Finish of its chunks.
  template <typename Step>
  void Finish(size_t c, const Step& step) {
    std::unique_lock<std::mutex> lock(mu_);
    done_[c] = 1;
    if (stepping_) return;
    stepping_ = true;
    while (next_ < done_.size() && done_[next_]) {
      const size_t first = next_;
      size_t end = first;
      while (end < done_.size() && done_[end]) ++end;
      lock.unlock();
      step(first, end);
      lock.lock();
      next_ = end;
    }
    stepping_ = false;
  }

  // Chunks stepped so far (a prefix of all chunks).
  size_t stepped() {
    std::lock_guard<std::mutex> lock(mu_);
    return next_;
  }

 private:
  std::mutex mu_;
  std::vector<uint8_t> done_;
  size_t next_ = 0;
  bool stepping_ = false;
};

}  // namespace deltasync::bf16
