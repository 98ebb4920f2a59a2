// Fresh memory without the page-fault toll (internal).
//
// The first touch of fresh anonymous memory costs a page fault per 4 KiB
// page (~262,000 per GiB: measured here as most of the time of copying a
// checkpoint into fresh buffers, well above the copy itself). Two remedies,
// both advisory (contents never change): transparent huge pages (one fault
// per 2 MiB, where the kernel offers them on request) and faulting a range in
// ahead of use with one madvise(MADV_POPULATE_WRITE) per large piece, from
// several threads. A file mapping's pages need neither: the kernel maps
// whole page-cache folios per fault.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/tsan.h"
#include "deltasync/tensor.h"
#include "deltasync/uninit_vector.h"

namespace deltasync {

// Whether MovePages and GrowMapping move page tables (mremap) rather than
// copy bytes. False in a ThreadSanitizer build: TSan has no mremap
// interceptor, so pages moved by it keep the old address's access history
// in TSan's shadow and take over whatever the new address had, and TSan then
// reports races between unrelated buffers (one thread's earlier buffer at
// the address another thread's buffer was moved to; docs/benchmarks.md,
// session 53). There they copy (mmap, memcpy, munmap: all seen), slower,
// the same contents.
inline constexpr bool kPagesMoveByMremap = !DS_UNDER_TSAN;

#if defined(__linux__)
// Puts the bytes of the mapping [from, from + bytes) at `to` (the start of a
// writable mapping of at least `bytes` that the caller owns; its pages there
// are replaced) and unmaps `from`. False, nothing changed, when the system
// refuses (mremap).
bool MovePages(void* from, size_t bytes, void* to);
// Grows the anonymous read-write mapping [p, p + old_bytes) to new_bytes
// (page multiples), keeping its bytes; it may move. The new start, or
// nullptr (the old mapping unchanged) when out of memory.
void* GrowMapping(void* p, size_t old_bytes, size_t new_bytes);
#endif

// Advises the kernel to back the whole 2 MiB pages inside [p, p + bytes)
// with transparent huge pages; ranges under 2 MiB are left alone. A no-op
// where unsupported.
void AdviseHugePages(void* p, size_t bytes);

// Prepares fresh (never touched) memory for writing: advises huge pages for
// each range when `huge`, then faults in the whole pages inside the ranges
// with one madvise(MADV_POPULATE_WRITE) per piece of up to 16 MiB, the
// pieces spread over up to `threads` threads (0: all cores). Contents are
// unchanged; the ranges must be memory the caller owns (a reserved
// std::vector's capacity qualifies). Under 16 MiB in all, nothing is
// faulted in ahead (the writes do it). A no-op where MADV_POPULATE_WRITE is
// missing (Linux before 5.14).
void PrepareFreshPages(std::span<const MutableByteSpan> ranges, int threads, bool huge);

// Sizes each empty vectors[i] to sizes[i] bytes as fresh memory: the
// capacities are reserved and faulted in ahead on up to `threads` threads
// (PrepareFreshPages), then the vectors resized (their zero fill now runs
// over pages already there), several at once. A plain resize faults every
// 4 KiB page in on the calling thread alone: a replica's anchor load spent
// over a quarter of its CPU there, on one thread. No huge pages: with them
// the same load took 2-3x as long as without whenever the kernel had to
// compact memory for them (docs/benchmarks.md, session 42).
void ResizeFresh(std::span<std::vector<uint8_t>* const> vectors, std::span<const size_t> sizes, int threads);

// Gives `v` capacity for `n` elements for an output that is refilled call
// after call: kept as is when it holds enough; otherwise its memory (and
// contents) dropped for a fresh allocation of n elements, or of n + n/8 when
// it had memory before (so that a slowly growing count does not reallocate
// every call), advised to huge pages when `huge`. v's size (and, when kept,
// contents) is the caller's to set. Returns whether it allocated (then v's
// memory is fresh: PrepareFreshPages can fault it in).
template <typename T, typename A>
bool ReserveForReuse(std::vector<T, A>& v, size_t n, bool huge) {
  if (v.capacity() >= n) return false;
  const size_t room = n + (v.capacity() > 0 ? n / 8 : 0);
  v = std::vector<T, A>();
  v.reserve(room);
  if (huge) AdviseHugePages(v.data(), room * sizeof(T));
  return true;
}

// Sizes `v` to n elements without writing any, for a buffer whose every
// slot read is written first: grown as ReserveForReuse grows it (exactly n
// the first time, n + n/8 past that), then only its end moved. When it
// allocated, the fresh memory (n elements) joins *fresh where given, to be
// faulted in ahead by PrepareFreshPages on several threads; else the
// writes fault it in.
template <typename T>
void SizeUninit(UninitVector<T>& v, size_t n, std::vector<MutableByteSpan>* fresh) {
  const bool grown = ReserveForReuse(v, n, /*huge=*/false);
  v.resize(n);
  if (grown && fresh) fresh->emplace_back(reinterpret_cast<uint8_t*>(v.data()), n * sizeof(T));
}

}  // namespace deltasync
