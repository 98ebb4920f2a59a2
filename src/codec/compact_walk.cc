// The compact decoder's walk (compact_walk.h): per chunk of 64 or 128 Ki
// elements (DecodeChunkElements), one pass over the base counts each
// class's elements per block of 1024 and keeps every element's class byte
// (kernels::ClassCountsBytes16: vector compares and byte sums; a byte per
// element of the chunk, reused per thread); the
// chunk's class totals go to the next chunk through a decoupled look-back;
// then, block by block, only the classes with a change in the block get
// their per-word masks (kernels::ClassMasksOfBytes16, from the class bytes)
// and each change is placed from them (kernels::ClassPlaceDecode16 / PlaceApply16),
// its value checked and its state-hash term summed. A class with no change
// in a block skips it by its count.
#include "codec/compact_walk.h"

#include <algorithm>
#include <cstring>

#include "bf16/simd_kernels.h"

namespace deltasync::compact {
namespace {

constexpr uint64_t kNone = ~uint64_t{0};
constexpr uint64_t kBlock = 1024;  // ClassCountsBytes16's and ClassMasksOfBytes16's block
constexpr size_t kWords = kBlock / 64;

}  // namespace

bool CpuIsIntel() {
#if defined(__x86_64__)
  static const bool intel = __builtin_cpu_is("intel");
  return intel;
#else
  return false;
#endif
}

// Where the walk of a chunk starts, per class: rem class elements to skip
// before change g, whose escape (if it is one) is escapes[e].
struct ChunkWalker::WalkStart {
  std::array<uint64_t, kClasses> rem{}, g{}, e{};
  uint64_t out = 0;  // the chunk's first change in element order
};

ChunkWalker::ChunkWalker(const std::string& label, const std::vector<Bf16Tensor*>& tensors,
                         const std::vector<Chunk>& chunks, CompactUndo::Run* runs, size_t ahead)
    : label_(label), tensors_(tensors), chunks_(chunks), runs_(runs), ahead_(ahead), ready_(new std::atomic<uint32_t>[chunks.size()]),
      upto_(chunks.size()), hash_(chunks.size(), {0, 0}) {
  for (size_t k = 0; k < chunks.size(); ++k) ready_[k].store(0, std::memory_order_relaxed);
  if (runs_) keep_.assign(chunks.size(), {nullptr, nullptr});
}

void ChunkWalker::Keep(size_t k, std::array<uint32_t, kClasses>* before, std::array<uint32_t, kClasses>* after) {
  keep_[k] = {before, after};
}

void ChunkWalker::Hold(size_t k, const std::array<uint32_t, kClasses>* held,
                       const std::array<uint64_t, kClasses>& start) {
  if (held_.empty()) {
    held_.assign(chunks_.size(), nullptr);
    held_start_.resize(chunks_.size());
  }
  held_[k] = held;
  held_start_[k] = start;
}

ChunkWalker::~ChunkWalker() = default;

std::span<const uint16_t> ChunkWalker::AheadOf(size_t k) const {
  if (ahead_ == 0 || k >= chunks_.size() || chunks_.size() - k <= ahead_) return {};
  return BaseOf(k + ahead_);
}

std::span<const uint16_t> ChunkWalker::BaseOf(size_t k) const {
  if (k >= chunks_.size()) return {};
  const Chunk& a = chunks_[k];
  const auto* data = reinterpret_cast<const uint16_t*>(tensors_[a.tensor]->base->data.data());
  return {data + a.begin, static_cast<size_t>(a.end - a.begin)};
}

void AddClassMoves(const uint16_t* old16, const uint16_t* new16, uint64_t n, std::array<int32_t, kClasses>& moves) {
  const auto move = [&](uint64_t from, uint64_t to) {
    for (uint64_t j = from; j < to; ++j) {
      const uint16_t o = old16[j], v = new16[j];
      if (((o ^ v) & 0x7F80) != 0) {
        --moves[ClassOf(o)];
        ++moves[ClassOf(v)];
      }
    }
  };
  // A group's old and new values XORed 4 at a time (u64 words), one test
  // of the exponent bits per group.
  constexpr uint64_t kGroup = 32;
  constexpr uint64_t kExponents = 0x7F807F807F807F80ull;
  uint64_t j = 0;
  for (; j + kGroup <= n; j += kGroup) {
    uint64_t any = 0;
    for (uint64_t w = 0; w < kGroup; w += 4) {
      uint64_t o, v;
      std::memcpy(&o, old16 + j + w, 8);
      std::memcpy(&v, new16 + j + w, 8);
      any |= o ^ v;
    }
    if ((any & kExponents) != 0) move(j, j + kGroup);
  }
  move(j, n);
}

StateHash ChunkWalker::HashDelta() const {
  StateHash sum;
  for (const std::array<uint64_t, 2>& h : hash_) sum += StateHash{h[0], h[1]};
  return sum;
}

// The walk start of a chunk preceded by before[c] class-c elements; `ranks`
// is t.ranks's route.
template <typename Rank>
ChunkWalker::WalkStart ChunkWalker::StartAt(const Bf16Tensor& t, std::span<const Rank> ranks,
                                            const std::array<uint64_t, kClasses>& before) {
  WalkStart s;
  for (int cl = 0; cl < kClasses; ++cl) {
    const Rank* b = ranks.data() + t.class_begin[cl];
    const Rank* e = ranks.data() + t.class_begin[cl + 1];
    const Rank* j = std::lower_bound(b, e, before[cl]);
    s.g[cl] = static_cast<uint64_t>(j - ranks.data());
    s.rem[cl] = j < e ? *j - before[cl] : kNone;
    s.e[cl] = static_cast<uint64_t>(std::lower_bound(t.escaped.begin(), t.escaped.end(), s.g[cl]) - t.escaped.begin());
    s.out += static_cast<uint64_t>(j - b);
  }
  return s;
}

Status ChunkWalker::Walk(size_t k) { return WalkPrefetching(k, AheadOf(k)); }

Status ChunkWalker::Walk(size_t k, size_t next) { return WalkPrefetching(k, BaseOf(next)); }

Status ChunkWalker::WalkPrefetching(size_t k, std::span<const uint16_t> ahead) {
  const Chunk& c = chunks_[k];
  const Bf16Tensor& t = *tensors_[c.tensor];
  uint32_t classes = 0;  // the classes with changes
  for (int cl = 0; cl < kClasses; ++cl) classes |= uint32_t{t.class_begin[cl + 1] > t.class_begin[cl]} << cl;
  const size_t blocks = static_cast<size_t>((c.end - c.begin + kBlock - 1) / kBlock);
  // Per thread, reused: fresh memory would cost page faults every chunk.
  thread_local std::vector<uint16_t> block_counts;
  block_counts.resize(std::max(block_counts.size(), blocks * kClasses));
  // The chunk's class bytes, one per element (64-byte aligned, padded to a
  // whole word), kept for the masks of its blocks (Place).
  thread_local std::vector<uint8_t> class_bytes;
  class_bytes.resize(std::max(class_bytes.size(), blocks * kBlock + 64));
  uint8_t* const bytes = class_bytes.data() + (-reinterpret_cast<uintptr_t>(class_bytes.data()) & 63);
  const uint16_t* data = reinterpret_cast<const uint16_t*>(t.base->data.data());
  const std::array<uint32_t, kClasses>* const held = held_.empty() ? nullptr : held_[k];
  // A chunk whose counts are kept and not held counts every class (the
  // AVX-512 pass costs the same whatever it counts), so that the totals it
  // fills hold all 16 and a later delta's new class still finds them held.
  std::array<uint32_t, kClasses>* const keep_before = keep_.empty() ? nullptr : keep_[k][0];
  std::array<uint32_t, kClasses>* const keep_after = keep_.empty() ? nullptr : keep_[k][1];
  const uint32_t counted = keep_after != nullptr && held == nullptr ? (uint32_t{1} << kClasses) - 1 : classes;
  kernels::ClassCountsBytes16(data + c.begin, static_cast<size_t>(c.end - c.begin), counted, block_counts.data(),
                              bytes);
  std::array<uint64_t, kClasses> counts{};
  for (size_t b = 0; b < blocks; ++b) {
    for (int cl = 0; cl < kClasses; ++cl) counts[cl] += block_counts[b * kClasses + cl];
  }
  std::array<uint64_t, kClasses> start_at{};
  if (held) {
    // Held totals: the start is known; this chunk's own counts must be the
    // held ones (they give every later chunk's start), or nothing is placed.
    for (uint32_t left = classes; left != 0; left &= left - 1) {
      const int cl = __builtin_ctz(left);
      if (counts[cl] != (*held)[cl]) {
        stale_.store(true, std::memory_order_relaxed);
        return Status::Internal(label_ + ": tensor '" + t.stream->name + "': the held class totals of elements " +
                                std::to_string(c.begin) + ".." + std::to_string(c.end) +
                                " are stale (redone with the look-back)");
      }
    }
    start_at = held_start_[k];
  } else if (c.begin > 0) {
    // Chunk k - 1 was handed out before this one and publishes before
    // its walk, so this wait is short and cannot deadlock. On a condition
    // variable, not std::atomic::wait: with GCC 12's libstdc++ that lost a
    // wakeup (session 39: three walker threads asleep in it for five
    // minutes, chunk k - 1 published, until a debugger's attach woke them;
    // docs/benchmarks.md).
    if (ready_[k - 1].load(std::memory_order_acquire) == 0) {
      std::unique_lock<std::mutex> lock(ready_mutex_);
      ready_cv_.wait(lock, [&] { return ready_[k - 1].load(std::memory_order_acquire) != 0; });
    }
    start_at = upto_[k - 1];
  }
  std::array<uint64_t, kClasses> end_at = start_at;
  for (int cl = 0; cl < kClasses; ++cl) end_at[cl] += counts[cl];
  if (!c.last && !held) {
    upto_[k] = end_at;
    ready_[k].store(1, std::memory_order_release);
    // Taken once after the store, so that a waiter that saw 0 under the
    // mutex is already waiting when notified.
    { std::lock_guard<std::mutex> lock(ready_mutex_); }
    ready_cv_.notify_all();
  }
  // Only the start is searched for (binary searches of the class's ranks,
  // missing the caches): where the walk ends is checked in O(1) per class.
  const WalkStart start = t.ranks.Visit([&](auto ranks) { return StartAt(t, ranks, start_at); });
  CompactUndo::Run* const run = runs_ ? &runs_[k] : nullptr;
  std::array<int32_t, kClasses> moves{};
  Status s = Place(t, c, blocks, classes, block_counts.data(), bytes, start, c.last ? nullptr : &end_at,
                   hash_[k].data(), run, ahead, keep_after ? &moves : nullptr);
  if (!s.ok() || keep_after == nullptr) return s;
  // The chunk's class counts before and after (CompactClassTotals).
  std::array<uint32_t, kClasses>& after = *keep_after;
  if (held) {
    for (int cl = 0; cl < kClasses; ++cl) after[cl] = (*held)[cl] + static_cast<uint32_t>(moves[cl]);
  } else {
    for (int cl = 0; cl < kClasses; ++cl) {
      after[cl] = static_cast<uint32_t>(counts[cl]) + static_cast<uint32_t>(moves[cl]);
      if (keep_before) (*keep_before)[cl] = static_cast<uint32_t>(counts[cl]);
    }
  }
  return s;
}

// The walk of a chunk from `start` over its blocks' class masks, then
// the values; `end_at` holds the class elements up to the chunk's end
// (nullptr for the tensor's last chunk).
Status ChunkWalker::Place(const Bf16Tensor& t, const Chunk& chunk, size_t blocks, uint32_t classes,
                          const uint16_t* counts, const uint8_t* bytes, const WalkStart& start,
                          const std::array<uint64_t, kClasses>* end_at, uint64_t hash[2], CompactUndo::Run* run,
                          std::span<const uint16_t> ahead, std::array<int32_t, kClasses>* moves) {
  const uint16_t* data = reinterpret_cast<const uint16_t*>(t.base->data.data());
  kernels::ClassWalkCursor cur;
  std::array<uint64_t, kClasses> end;
  for (int cl = 0; cl < kClasses; ++cl) {
    cur.rem[cl] = start.rem[cl];
    cur.g[cl] = start.g[cl];
    cur.e[cl] = start.e[cl];
    end[cl] = t.class_begin[cl + 1];
  }
  // The ranks of one route (the other pointer null).
  const kernels::ClassWalkStreams streams{t.ranks.is_narrow ? nullptr : t.ranks.wide.data(),
                                          t.ranks.is_narrow ? t.ranks.narrow.data() : nullptr, end.data(),
                                          t.diffs.data(), t.escapes.data()};
  uint64_t masks[kClasses * kWords];
  uint32_t before[kClasses * (kWords + 1)];
  uint64_t k = start.out;
  const uint64_t k0 = k;
  // Past the tensor's last change no block has one; a chunk's own last
  // change is not known (its blocks after it need no class: cheap). The
  // walk places exactly the changes of the class elements it counted,
  // which are the counts chunk k + 1 starts from, so it never reaches the
  // next chunk's slots (unless the counts were wrong: the check below).
  const uint64_t k_end = t.count;
  // The hash's side values of the chunk's changes (a fused apply's new
  // ones, a decode's old ones), hashed once per chunk: per block, a few
  // changes each, most would fall in the hash kernel's scalar tail. At most
  // one change per element (per thread, reused).
  thread_local std::vector<uint16_t> side;
  side.resize(std::max<size_t>(side.size(), static_cast<size_t>(chunk.end - chunk.begin)));
  uint16_t* const side16 = side.data();
  // A fused apply (run != nullptr) writes into the base itself. That is
  // safe: the class counts and class bytes of all this chunk's blocks were
  // taken (Walk) before anything is placed; a block's masks are built from
  // its own elements' class bytes only; ClassPlaceApply16 reads only
  // the elements of the block it places, before it writes them; each element changes at most
  // once (a class's ranks strictly ascend, classes are disjoint); and every
  // other chunk reads and writes only its own elements, sharing with this one
  // only class counts. So every read sees the base's value. run->written
  // counts every value written (ClassPlaceApply16 logs each before writing it).
  uint16_t* const target = t.target;
  uint32_t* const undo_pos = t.undo_pos;
  uint16_t* const undo_old = t.undo_old;
  if (run) {
    *run = {reinterpret_cast<uint8_t*>(target), 2, chunk.begin, undo_pos + k, nullptr,
            reinterpret_cast<const uint8_t*>(undo_old + k), 0};
  }
  uint64_t* const indices = run ? nullptr : t.out->indices.data();
  uint8_t* const values = run ? nullptr : t.out->values.data();
  const bool prefetch_next = !CpuIsIntel();
  for (size_t blk = 0; blk < blocks && k < k_end; ++blk) {
    const uint64_t at = chunk.begin + blk * kBlock;
    // Block blk's share of the chunk walked next (AheadOf), into L2
    // (prefetcht1): its counting pass then reads the base from L2 instead
    // of memory, while this walk, bound by its compute, leaves the memory
    // idle (session 32: the pass's samples fell by more than half; into L1,
    // or every other line, did no better).
    if (blk * kBlock < ahead.size()) {
      const auto* p = reinterpret_cast<const uint8_t*>(ahead.data() + blk * kBlock);
      const size_t share = 2 * std::min<size_t>(kBlock, ahead.size() - blk * kBlock);
      for (size_t b = 0; b < share; b += 64) __builtin_prefetch(p + b, 0, 2);
    }
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kBlock, chunk.end - at));
    // The classes with a change in this block: only their masks are built;
    // the others skip the block's elements of their class.
    const uint16_t* in_block = counts + blk * kClasses;
    uint32_t need = 0;
    for (uint32_t left = classes; left != 0; left &= left - 1) {
      const int cl = __builtin_ctz(left);
      if (cur.rem[cl] < in_block[cl]) {
        need |= uint32_t{1} << cl;
      } else if (cur.rem[cl] != kNone) {
        cur.rem[cl] -= in_block[cl];
      }
    }
    if (need == 0) continue;
    // The next block's base and class bytes into L1 while this one is
    // placed: they are in L2 (the counting pass read them), and the walk's
    // loads of them otherwise wait on L2 about once per change. Not on
    // Intel: there the burst of 48 prefetches a block cost more than it
    // saved (docs/benchmarks.md, session 50 h1).
    if (prefetch_next && blk + 1 < blocks) {
      const auto* next_base = reinterpret_cast<const uint8_t*>(data + at + kBlock);
      for (size_t b = 0; b < 2 * kBlock; b += 64) __builtin_prefetch(next_base + b);
      for (size_t b = 0; b < kBlock; b += 64) __builtin_prefetch(bytes + (blk + 1) * kBlock + b);
    }
    kernels::ClassMasksOfBytes16(bytes + blk * kBlock, len, need, masks, before);
    const uint64_t* m = masks;
    const uint32_t* p = before;
    if (run) {
      // Placed, logged and written in class order by the kernel; every
      // change it placed is logged, so the undo covers a failing block too.
      size_t placed = 0;
      const kernels::ClassApplyOut o{static_cast<uint32_t>(at - chunk.begin), undo_pos + k, undo_old + k,
                                     side16 + (k - k0)};
      const size_t wrong = kernels::ClassPlaceApply16(m, p, need, target + at, len, streams, cur, o, &placed);
      run->written += placed;
      if (wrong < len) {
        return CorruptTensor(label_, t.stream->name, "element " + std::to_string(at + wrong) + ": non-canonical change code");
      }
      k += placed;
      continue;
    }
    // The block's changes straight into the outputs, in element order
    // (their old values into `side`).
    size_t placed = 0;
    const kernels::ClassDecodeOut o{at, indices + k, values + 2 * k, side16 + (k - k0)};
    const size_t wrong = kernels::ClassPlaceDecode16(m, p, need, data + at, len, streams, cur, o, &placed);
    if (wrong < len) {
      return CorruptTensor(label_, t.stream->name, "element " + std::to_string(at + wrong) + ": non-canonical change code");
    }
    k += placed;
  }
  // The chunk's hash change in one call. A fused apply's old values come
  // straight from the undo log (u16 little-endian, as HashTermDiffs16 reads
  // them), its new ones from the kernel; a decode's changes from its output
  // itself (indices, and values as u16 little-endian bytes), their old values
  // from `side`: one store per change besides the output.
  if (run) {
    kernels::HashTermDiffs16At(chunk.begin, undo_pos + k0, reinterpret_cast<const uint8_t*>(side16),
                               reinterpret_cast<const uint8_t*>(undo_old + k0), k - k0, t.seeds.element_seed, hash);
    // The class moves: from the undo log's old values and `side`'s new
    // ones, both in change order.
    if (moves) AddClassMoves(undo_old + k0, side16, k - k0, *moves);
  } else {
    kernels::HashTermDiffs16(indices + k0, values + 2 * k0, reinterpret_cast<const uint8_t*>(side16), k - k0,
                             t.seeds.element_seed, hash);
  }
  return t.ranks.Visit([&](auto ranks) { return CheckEnd(t, ranks, chunk, cur.g, end_at); });
}

// The walk of `chunk` must stop, per class, at g[cl]: the class's first
// change at or past the chunk's end (that class's lower bound of end_at),
// or for the last chunk (end_at null) past all of the class's changes.
template <typename Rank>
Status ChunkWalker::CheckEnd(const Bf16Tensor& t, std::span<const Rank> ranks, const Chunk& chunk, const uint64_t* g_at,
                             const std::array<uint64_t, kClasses>* end_at) const {
  for (int cl = 0; cl < kClasses; ++cl) {
    const uint64_t g = g_at[cl];
    const uint64_t end = t.class_begin[cl + 1];
    const bool at_end = end_at ? (g == end || ranks[g] >= (*end_at)[cl]) &&
                                     (g == t.class_begin[cl] || ranks[g - 1] < (*end_at)[cl])
                               : g == end;
    if (!at_end) {
      if (end_at) {
        return Status::Internal(label_ + ": tensor '" + t.stream->name + "': the walk of elements " +
                                std::to_string(chunk.begin) + ".." + std::to_string(chunk.end) +
                                " disagrees with the class counts (decoder bug)");
      }
      return CorruptTensor(label_, t.stream->name, "gaps run past the elements of exponent class " + std::to_string(cl));
    }
  }
  return Status::OK();
}

}  // namespace deltasync::compact
