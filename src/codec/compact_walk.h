// The position walk of the compact decoder (internal to src/codec;
// docs/format.md, "Decoding in parallel inside a tensor"): a bf16 tensor's
// streams, read by compact_read.cc, and the walk over its chunks, all
// chunks of all tensors in parallel.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "bf16/hash_term.h"
#include "codec/compact_bf16.h"
#include "codec/compact_rice.h"
#include "deltasync/changes.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"
#include "deltasync/weight_state.h"

namespace deltasync::compact {

// One bf16 tensor's streams, read, class by class.
struct Bf16Tensor {
  const TensorView* stream = nullptr;
  const TensorView* base = nullptr;  // the base tensor (or a block of one: any span of its bytes)
  TensorChanges* out = nullptr;
  std::array<uint64_t, kClasses + 1> class_begin{};  // class cl: changes [begin[cl], begin[cl+1])
  RankBuffer ranks;               // per change, ascending within its class
  UninitVector<uint8_t> diffs;
  std::vector<uint64_t> escaped;  // the changes (class order) that are escapes
  std::vector<uint8_t> escapes;   // their raw values, u16 little-endian each
  state_hash::TensorSeeds seeds{};
  uint64_t count = 0;  // the tensor's changes
  // The read in parts (compact_read.cc, ReadTensor with pieces): the
  // first class whose gaps ran past its elements (-1: none), whether the
  // rANS pieces were left to the caller, and where the stream's rest starts.
  int past_class = -1;
  bool deferred = false;
  size_t tail = 0;
  // A fused apply (ApplyCompactDelta): the new values go to `target` (the
  // base's own bytes) instead of `out`, change k's position (from the
  // start of its chunk) and old value to undo_pos[k] and undo_old[k] first.
  uint16_t* target = nullptr;
  uint32_t* undo_pos = nullptr;
  uint16_t* undo_old = nullptr;
};

// The class moves of n changes from old16[j] to new16[j] (bf16 bits) added
// to moves: each change of the exponent bits takes one element from its old
// value's class (-1) to its new value's (+1); other changes move nothing.
// Groups of 32 changes whose exponents all stay cost one test (session 43:
// the loop change by change took ~5% of a 2-thread apply's CPU).
void AddClassMoves(const uint16_t* old16, const uint16_t* new16, uint64_t n, std::array<int32_t, kClasses>& moves);

// Whether the CPU is Intel's (x86-64; false elsewhere): the walk's two
// settings tuned apart on Intel (DecodeChunkElements, Place's prefetch).
bool CpuIsIntel();

// A chunk of a tensor's elements.
struct Chunk {
  size_t tensor = 0;
  uint64_t begin = 0, end = 0;  // elements
  bool last = false;            // the tensor's last chunk
};

// The walk of every chunk (Walk(k) for each k, on any threads, chunks
// handed out in ascending order): chunk k counts its classes' elements per
// block, adds its class totals to those chunk k - 1 of the same tensor
// publishes and publishes the sums, then places its changes into the tensor's output
// (indices, values) and sums their state-hash terms.
class ChunkWalker {
 public:
  // `runs` (a fused apply only; else nullptr): one per chunk, where chunk k
  // records what it wrote (written counts whole blocks, set before any
  // error returns).
  // `ahead` (0: no prefetch; the decoder passes 1 where the walk runs on one
  // thread): while a thread places chunk k it prefetches, block by block
  // into L2, the base elements of chunk k + ahead (AheadOf), the one it
  // walks next where `ahead` is its thread count (chunks are handed out in
  // ascending order), so that that chunk's counting pass reads its base
  // from L2 instead of memory.
  ChunkWalker(const std::string& label, const std::vector<Bf16Tensor*>& tensors, const std::vector<Chunk>& chunks,
              CompactUndo::Run* runs = nullptr, size_t ahead = 0);
  ~ChunkWalker();
  Status Walk(size_t k);
  // Walk(k), prefetching (as `ahead` does) chunk `next`'s base instead: the
  // chunk this thread walks next where the caller knows it
  // (ParallelForAhead); none when next is past the last chunk.
  Status Walk(size_t k, size_t next);
  // The held route (a fused apply with held class totals,
  // CompactClassTotals), set before any Walk for every chunk of a tensor or
  // none: chunk k starts after `start` class elements of its tensor, with
  // no look-back (it neither waits nor publishes), once its own counts of
  // the classes with changes equal held[k]'s; if they differ it places
  // nothing, returns an error and Stale() becomes true (the caller undoes
  // the apply and redoes it without held totals).
  void Hold(size_t k, const std::array<uint32_t, kClasses>* held, const std::array<uint64_t, kClasses>& start);
  bool Stale() const { return stale_.load(std::memory_order_relaxed); }
  // A fused walk keeps chunk k's class counts (CompactClassTotals), set
  // before its Walk: after it succeeded, *after holds the chunk's counts of
  // all 16 classes after the apply: those before it (held[k] where held,
  // else the chunk's own counts of every class, which then also go to
  // *before) plus the class moves of its changes (an element leaves its old
  // value's class for its new value's). `before` is ignored where held.
  void Keep(size_t k, std::array<uint32_t, kClasses>* before, std::array<uint32_t, kClasses>* after);
  // The base elements prefetched while chunk k is placed: chunk k + ahead's
  // (of whichever tensor), or none past the last chunk or with ahead 0.
  std::span<const uint16_t> AheadOf(size_t k) const;
  // Chunk k's base elements (of whichever tensor); none past the last chunk.
  std::span<const uint16_t> BaseOf(size_t k) const;
  // The hash change of all chunks' changes (after every Walk).
  StateHash HashDelta() const;

 private:
  struct WalkStart;
  Status WalkPrefetching(size_t k, std::span<const uint16_t> ahead);
  Status Place(const Bf16Tensor& t, const Chunk& chunk, size_t blocks, uint32_t classes, const uint16_t* counts,
               const uint8_t* bytes, const WalkStart& start, const std::array<uint64_t, kClasses>* end_at,
               uint64_t hash[2], CompactUndo::Run* run, std::span<const uint16_t> ahead,
               std::array<int32_t, kClasses>* moves);
  template <typename Rank>
  static WalkStart StartAt(const Bf16Tensor& t, std::span<const Rank> ranks, const std::array<uint64_t, kClasses>& before);
  template <typename Rank>
  Status CheckEnd(const Bf16Tensor& t, std::span<const Rank> ranks, const Chunk& chunk,
                  const uint64_t* g, const std::array<uint64_t, kClasses>* end_at) const;

  const std::string& label_;
  const std::vector<Bf16Tensor*>& tensors_;
  const std::vector<Chunk>& chunks_;
  CompactUndo::Run* runs_;
  size_t ahead_;
  std::unique_ptr<std::atomic<uint32_t>[]> ready_;      // chunk k published upto_[k]
  std::mutex ready_mutex_;                              // with ready_cv_: a chunk waits for ready_[k - 1]
  std::condition_variable ready_cv_;
  std::vector<std::array<uint64_t, kClasses>> upto_;  // class elements up to chunk k's end
  std::vector<std::array<uint64_t, 2>> hash_;         // per chunk, its element-term changes
  std::vector<const std::array<uint32_t, kClasses>*> held_;  // Hold: per chunk (empty: none held)
  std::vector<std::array<uint64_t, kClasses>> held_start_;
  std::vector<std::array<std::array<uint32_t, kClasses>*, 2>> keep_;  // Keep: per chunk, before and after
  std::atomic<bool> stale_{false};
};

}  // namespace deltasync::compact
