// Software prefetches shared by the bf16 kernels (internal to src/bf16).
#pragma once

#include <cstddef>
#include <cstdint>

namespace deltasync::kernels {

// The cache line `bytes` past p (kWrite: for writing; kLocality as
// __builtin_prefetch's). p + bytes may lie past the end of p's array: the
// address is formed as an integer, and a prefetch never faults.
template <int kWrite = 0, int kLocality = 3>
inline void PrefetchPast(const void* p, uintptr_t bytes) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + bytes), kWrite, kLocality);
}

// Word w's share of a block read ahead: the lines of its 64 elements of the
// current (elem_size bytes each, at cur_ahead) and of the bf16 base (at
// pub_ahead). Issued word by word between the emits of the block at hand (the
// fused compact scan, the fp32 compare): a block's lines in one burst wait
// for free fill buffers. kLocality as __builtin_prefetch's: 3 (prefetcht0)
// into L1, 1 (prefetcht2) into L2 only, where the lines wait without
// evicting the block at hand's (the compact scan's raw route).
template <int kLocality = 3>
inline void PrefetchWordShare(const uint8_t* cur_ahead, size_t elem_size, const uint8_t* pub_ahead, size_t w) {
  for (size_t b = 0; b < 64 * elem_size; b += 64) __builtin_prefetch(cur_ahead + 64 * elem_size * w + b, 0, kLocality);
  for (size_t b = 0; b < 128; b += 64) __builtin_prefetch(pub_ahead + 128 * w + b, 0, kLocality);
}

}  // namespace deltasync::kernels
