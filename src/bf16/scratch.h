// Growable scratch memory for change detection's per-chunk results
// (internal).
//
// Why not std::vector: outputs grow while a chunk is scanned, and
// std::vector::resize would zero-fill before the kernel writes. And why huge
// pages: first-touch page faults, not copying, dominate the cost of fresh
// output memory (measured ~3 us per 4 KiB page in a VM, i.e. ~1.3 GB/s;
// with 2 MiB pages ~15x less). Large buffers are therefore advised to use
// transparent huge pages where the kernel offers them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/pages.h"  // AdviseHugePages

namespace deltasync::bf16 {

class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ~ScratchBuffer();

  // Makes room for `bytes` bytes in total, keeping the contents (the buffer
  // may move). False when out of memory; the old contents then stay valid.
  bool Reserve(size_t bytes);
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace deltasync::bf16
