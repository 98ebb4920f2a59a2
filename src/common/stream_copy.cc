#include "common/stream_copy.h"

#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define DS_STREAM_COPY_SSE2 1
#endif

namespace deltasync {

void CopyToUncached(uint8_t* dst, const uint8_t* src, size_t n) {
#ifdef DS_STREAM_COPY_SSE2
  // Head: plain stores up to the destination's next 64-byte line.
  size_t head = static_cast<size_t>(-reinterpret_cast<uintptr_t>(dst) & 63);
  if (head >= n) {
    std::memcpy(dst, src, n);
    return;
  }
  std::memcpy(dst, src, head);
  size_t i = head;
  // Whole lines: four 16-byte non-temporal stores each.
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);  // tail: under one line
  _mm_sfence();  // non-temporal stores are weakly ordered: publish them
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace deltasync
