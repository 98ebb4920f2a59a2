#include "common/pages.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/parallel.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace deltasync {
namespace {

constexpr uintptr_t kPage = 4096;
constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
// Below this in all, ranges are faulted in by their writes: the threads
// would cost about what they save.
constexpr size_t kMinPopulate = size_t{16} << 20;
// Large enough for one madvise to pay off, small enough that the threads
// share the largest range.
constexpr size_t kPiece = size_t{16} << 20;

uintptr_t RoundUp(uintptr_t n, uintptr_t unit) { return (n + unit - 1) / unit * unit; }
uintptr_t RoundDown(uintptr_t n, uintptr_t unit) { return n / unit * unit; }

// Populates the whole pages inside [lo, hi) (one call; no threads).
void PopulateRange(uintptr_t lo, uintptr_t hi) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  lo = RoundUp(lo, kPage);
  hi = RoundDown(hi, kPage);
  if (hi > lo) (void)::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
#else
  (void)lo;
  (void)hi;
#endif
}

}  // namespace

#if defined(__linux__)
bool MovePages(void* from, size_t bytes, void* to) {
  if constexpr (kPagesMoveByMremap) {
    return ::mremap(from, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, to) != MAP_FAILED;
  } else {
    std::memcpy(to, from, bytes);
    ::munmap(from, bytes);
    return true;
  }
}

void* GrowMapping(void* p, size_t old_bytes, size_t new_bytes) {
  if constexpr (kPagesMoveByMremap) {
    void* moved = ::mremap(p, old_bytes, new_bytes, MREMAP_MAYMOVE);
    return moved == MAP_FAILED ? nullptr : moved;
  } else {
    void* fresh = ::mmap(nullptr, new_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (fresh == MAP_FAILED) return nullptr;
    return MovePages(p, old_bytes, fresh) ? fresh : nullptr;
  }
}
#endif

void AdviseHugePages(void* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (bytes < kHugePage) return;
  const uintptr_t begin = RoundUp(reinterpret_cast<uintptr_t>(p), kPage);
  const uintptr_t end = RoundDown(reinterpret_cast<uintptr_t>(p) + bytes, kPage);
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

void PrepareFreshPages(std::span<const MutableByteSpan> ranges, int threads, bool huge) {
  struct Piece {
    uintptr_t begin, end;
  };
  std::vector<Piece> pieces;
  size_t total = 0;
  for (const MutableByteSpan& r : ranges) {
    if (huge) AdviseHugePages(r.data(), r.size());
    // Pieces end on 2 MiB boundaries, so no huge page is split between two.
    const auto end = reinterpret_cast<uintptr_t>(r.data()) + r.size();
    for (auto lo = reinterpret_cast<uintptr_t>(r.data()); lo < end;) {
      const uintptr_t hi = std::min(end, RoundDown(lo + kPiece, kHugePage));
      pieces.push_back({lo, hi});
      lo = hi;
    }
    total += r.size();
  }
  if (total < kMinPopulate) return;
  // Whole pages inside each piece only: a page shared with a neighbour is
  // faulted in by whoever writes it first.
  ParallelFor(pieces.size(), threads, [&](size_t i) { PopulateRange(pieces[i].begin, pieces[i].end); });
}

void ResizeFresh(std::span<std::vector<uint8_t>* const> vectors, std::span<const size_t> sizes, int threads) {
  std::vector<MutableByteSpan> fresh;
  fresh.reserve(vectors.size());
  for (size_t i = 0; i < vectors.size(); ++i) {
    vectors[i]->reserve(sizes[i]);
    fresh.emplace_back(vectors[i]->data(), sizes[i]);
  }
  PrepareFreshPages(fresh, threads, /*huge=*/false);
  ParallelFor(vectors.size(), threads, [&](size_t i) { vectors[i]->resize(sizes[i]); });
}

}  // namespace deltasync
