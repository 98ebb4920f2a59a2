#include "bf16/scratch.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace deltasync::bf16 {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUp(size_t n, size_t unit) { return (n + unit - 1) / unit * unit; }

}  // namespace

#if defined(__linux__)

namespace {

// A fresh mapping of `bytes` (a multiple of 2 MiB), 2 MiB-aligned so that
// all of it can be backed by huge pages. nullptr when out of memory.
uint8_t* MapHugeAligned(size_t bytes) {
  void* raw =
      mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const auto aligned = RoundUp(start, kHugePage);
  if (aligned > start) munmap(raw, aligned - start);
  const size_t tail = start + bytes + kHugePage - (aligned + bytes);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  AdviseHugePages(reinterpret_cast<void*>(aligned), bytes);
  return reinterpret_cast<uint8_t*>(aligned);
}

}  // namespace

// Small buffers grow by mremap (page tables move, bytes are not copied);
// from 2 MiB on, each growth maps a fresh huge-page-aligned region and
// copies (the copies add up to less than the final size).
ScratchBuffer::~ScratchBuffer() {
  if (data_ != nullptr) munmap(data_, capacity_);
}

bool ScratchBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_) return true;
  const size_t wanted = std::max({bytes, capacity_ * 2, size_t{64} << 10});
  if (wanted >= kHugePage) {
    const size_t grown = RoundUp(wanted, kHugePage);
    uint8_t* p = MapHugeAligned(grown);
    if (p == nullptr) return false;
    if (data_ != nullptr) {
      std::memcpy(p, data_, capacity_);
      munmap(data_, capacity_);
    }
    data_ = p;
    capacity_ = grown;
    return true;
  }
  const size_t grown = RoundUp(wanted, kPage);
  void* p = nullptr;
  if (data_ == nullptr) {
    p = mmap(nullptr, grown, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
  } else {
    p = GrowMapping(data_, capacity_, grown);  // mremap (common/pages.h)
    if (p == nullptr) return false;
  }
  data_ = static_cast<uint8_t*>(p);
  capacity_ = grown;
  return true;
}

#else  // portable fallback

ScratchBuffer::~ScratchBuffer() { std::free(data_); }

bool ScratchBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_) return true;
  const size_t grown = std::max({bytes, capacity_ * 2, size_t{64} << 10});
  void* p = std::realloc(data_, grown);
  if (p == nullptr) return false;
  data_ = static_cast<uint8_t*>(p);
  capacity_ = grown;
  return true;
}

#endif

}  // namespace deltasync::bf16
