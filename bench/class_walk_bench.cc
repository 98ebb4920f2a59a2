// The floor of the compact decoder's O(model) walk (issue 15), on one core:
// the class-counting pass (kernels::ClassCountsBytes16, chunk by chunk as
// codec/compact_walk.cc runs it, class bytes kept), and the walk's pair
// (ClassCountsBytes16 per chunk, then ClassMasksOfBytes16 for every block
// and class: a dense delta's worst case), over a bf16 buffer far larger
// than the caches, each against a plain read of the same bytes (a vector
// sum of the u16 lanes), measured in the same run. Prints figures, never
// pass/fail.
//
//   class_walk_bench [--mib 512] [--reps 5] [--classes all|present]
//
// Values ~N(0, 0.02) as bf16 (the demo's weights), one element in 64 set to
// 1.0 (norms): about nine exponent classes present. --classes present counts
// only the classes present (what a delta changing every class asks for);
// all asks for all 16.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "bf16/simd_kernels.h"
#include "codec/compact_bf16.h"

namespace {

using Clock = std::chrono::steady_clock;

// The plain read: the sum of every u16 lane, vectorised (AVX2 where the CPU
// has it), so that only the memory bounds it.
#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t SumAvx2(const uint16_t* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  const __m256i ones = _mm256_set1_epi16(1);
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const auto* v = reinterpret_cast<const __m256i*>(p + i);
    a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_loadu_si256(v), ones));
    a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_loadu_si256(v + 1), ones));
    a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_loadu_si256(v + 2), ones));
    a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_loadu_si256(v + 3), ones));
  }
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)));
  uint64_t s = 0;
  for (int32_t l : lanes) s += static_cast<uint32_t>(l);
  for (; i < n; ++i) s += p[i];
  return s;
}
#endif

uint64_t Sum(const uint16_t* p, size_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) return SumAvx2(p, n);
#endif
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) s += p[i];
  return s;
}

template <class F>
double BestSeconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace deltasync;
  size_t mib = 512;
  int reps = 5;
  std::string which = "present";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--mib") mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--classes") which = argv[i + 1];
  }
  const size_t n = mib * (size_t{1} << 20) / 2;
  std::vector<uint16_t> data(n);
  {
    // 1 Mi distinct values, tiled: the buffer still comes from memory.
    std::mt19937_64 rng(15);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    const size_t tile = std::min<size_t>(n, size_t{1} << 20);
    for (size_t i = 0; i < tile; ++i) {
      float f = i % 64 == 5 ? 1.0f : normal(rng);
      uint32_t b;
      std::memcpy(&b, &f, 4);
      data[i] = static_cast<uint16_t>(b >> 16);
    }
    for (size_t i = tile; i < n; i += tile) std::memcpy(&data[i], &data[0], std::min(tile, n - i) * 2);
  }
  uint32_t present = 0;
  for (size_t i = 0; i < std::min<size_t>(n, size_t{1} << 20); ++i) present |= 1u << compact::ClassOf(data[i]);
  const uint32_t classes = which == "all" ? 0xFFFFu : present;
  const double gb = 2.0 * static_cast<double>(n) / 1e9;

  volatile uint64_t sink = 0;
  const double t_read = BestSeconds(reps, [&] { sink = sink + Sum(data.data(), n); });

  // The counting pass as the walk runs it: chunks of 64 Ki elements, the
  // counts of their 64 blocks and their class bytes into reused buffers.
  constexpr size_t kChunk = size_t{1} << 16, kBlock = 1024;
  std::vector<uint16_t> counts(kChunk / kBlock * 16);
  std::vector<uint8_t> bytes_buf(kChunk + 64);
  uint8_t* const bytes = bytes_buf.data() + (-reinterpret_cast<uintptr_t>(bytes_buf.data()) & 63);
  uint64_t total = 0;
  const double t_count = BestSeconds(reps, [&] {
    total = 0;
    for (size_t at = 0; at < n; at += kChunk) {
      const size_t len = std::min(kChunk, n - at);
      kernels::ClassCountsBytes16(data.data() + at, len, classes, counts.data(), bytes);
      for (size_t b = 0; b < (len + kBlock - 1) / kBlock; ++b) {
        for (int c = 0; c < 16; ++c) total += counts[16 * b + c];
      }
    }
  });

  // The walk as compact_walk.cc runs it when every block needs every
  // class's masks (a dense delta): per chunk, counts and class bytes, then
  // per block the masks from those bytes.
  uint64_t masks[16 * 16];
  uint32_t before[16 * 17];
  const int k = __builtin_popcount(classes);
  uint64_t walk_total = 0;
  const double t_walk = BestSeconds(reps, [&] {
    walk_total = 0;
    for (size_t at = 0; at < n; at += kChunk) {
      const size_t len = std::min(kChunk, n - at);
      kernels::ClassCountsBytes16(data.data() + at, len, classes, counts.data(), bytes);
      for (size_t b = 0; b * kBlock < len; ++b) {
        kernels::ClassMasksOfBytes16(bytes + b * kBlock, std::min(kBlock, len - b * kBlock), classes, masks, before);
        for (int s = 0; s < k; ++s) walk_total += before[17 * s + 16];
      }
    }
  });

  std::printf("class walk floor, 1 thread, target %s: %.0f MiB of bf16, %d classes counted (%s), best of %d\n",
              kernels::ActiveTargetName().c_str(), static_cast<double>(mib), k, which.c_str(), reps);
  std::printf("  read (u16 sum)        %6.2f GB/s\n", gb / t_read);
  std::printf("  ClassCountsBytes16 pass  %6.2f GB/s  (%.3f x read)\n", gb / t_count, t_read / t_count);
  std::printf("  counts + bytes, then masks of the bytes, every block  %6.2f GB/s  (%.3f x read)\n", gb / t_walk,
              t_read / t_walk);
  if (which == "all" && (total != n || walk_total != n)) {
    std::fprintf(stderr, "class_walk_bench: counted %llu / %llu of %zu elements\n",
                 static_cast<unsigned long long>(total), static_cast<unsigned long long>(walk_total), n);
    return 1;
  }
  return 0;
}
