// Applying a gap_delta delta straight from its encoded bytes (patch.h,
// EncodedChanges): per chunk of changes, one pass decodes the gaps into a
// small stack block, gathers the old values (into the undo log), scatters the
// new ones and adds the state-hash terms, the terms of one block computed
// while the next block's state elements are prefetched. No 64-bit index vector is built and
// the state is walked once. Chunks are independent (their first index comes
// from the chunk starts computed when decoding), so they run in parallel
// across and within tensors; their hash sums add mod 2^64 in any order.
#include <algorithm>
#include <array>
#include <cstring>
#include <unordered_set>

#include "bf16/hash_term.h"
#include "bf16/simd_kernels.h"
#include "codec/change_checks.h"
#include "codec/index_codec.h"
#include "common/parallel.h"
#include "deltasync/patch.h"

namespace deltasync {
namespace {

constexpr size_t kChunk = EncodedChanges::kGapChunk;
// Changes decoded at once: the kernel's input arrays stay in L1.
constexpr size_t kBlock = 512;
// Changes hashed between two rounds of prefetches (ApplyTask).
constexpr size_t kHashStep = 64;
// The locality of those prefetches: 1 (prefetcht2, to L2; the compiler
// emits no prefetchw for these, so the write hint does nothing). A block's
// kBlock changes touch ~kBlock distinct lines (at 3.4% changed, ~1.1
// changes per touched 64-byte line): 512 lines are 32 KiB, all of L1d, so
// at locality 3 (prefetcht0) they evicted each other and the block's own
// lines before the scatter reached them. Into L2 (1 MiB), the 1-thread
// ApplyGapChanges took ~0.018 s of CPU where it took ~0.033 (scale 0.25).
constexpr int kPrefetchLocality = 1;

inline void PrefetchState(const void* p) { __builtin_prefetch(p, 1, kPrefetchLocality); }

struct Task {
  WeightState::Tensor* tensor;
  const EncodedChanges* changes;
  size_t tensor_index;
  size_t begin, end;  // changes [begin, end)
  size_t undo_offset;  // byte offset of change `begin`'s old value in the undo log
};

std::vector<Task> Plan(WeightState& state, std::span<const EncodedChanges> changes, size_t* value_bytes) {
  std::vector<Task> tasks;
  size_t offset = 0;
  for (size_t i = 0; i < changes.size(); ++i) {
    const EncodedChanges& c = changes[i];
    WeightState::Tensor* t = state.FindMutable(c.name);
    const size_t size = DTypeSize(c.dtype);
    for (size_t b = 0; b < c.count; b += kChunk) {
      tasks.push_back({t, &c, i, b, std::min(b + kChunk, c.count), offset + b * size});
    }
    offset += c.count * size;
  }
  *value_bytes = offset;
  return tasks;
}

// idx[begin - 1] (uint64_t(-1) for the first change): chunk starts minus the
// chunk's first gap, mod 2^64.
uint64_t PrevOf(const EncodedChanges& c, size_t begin) {
  return c.chunk_starts[begin / kChunk] - indexcodec::GapAt(c.index_dtype, c.gaps.data(), begin) - 1;
}

// One chunk's worth runs faster here than a thread starts.
int ThreadsFor(const std::vector<Task>& tasks, int threads) { return tasks.size() <= 1 ? 1 : threads; }

// Adds block `cur`'s state-hash terms in steps of kHashStep changes and,
// before each step, prefetches the state elements of the same changes of
// the next block (`next`, n_next of them; written next, so for writing).
// Without this the hash arithmetic and the next block's cache misses take
// turns; with it the misses are in flight while the terms are computed.
template <typename T>
void HashBlockPrefetchingNext(const uint64_t* cur, const uint8_t* in, const uint8_t* log,
                              [[maybe_unused]] const uint64_t* new_bits, [[maybe_unused]] const uint64_t* old_bits,
                              size_t n, const T* state, const uint64_t* next, size_t n_next, const uint64_t seed[2],
                              uint64_t sums[2]) {
  for (size_t s = 0; s < n; s += kHashStep) {
    const size_t m = std::min(kHashStep, n - s);
    for (size_t j = s; j < std::min(s + m, n_next); ++j) PrefetchState(state + next[j]);
    // bf16 (16-bit) terms from the values where they lie, the new ones in
    // the patch and the old ones just logged: no 64-bit copies, and products
    // of values below 2^32 take one multiply less.
    if constexpr (sizeof(T) == 2) {
      kernels::HashTermDiffs16(cur + s, in + 2 * s, log + 2 * s, m, seed, sums);
    } else {
      kernels::HashTermDiffs(cur + s, new_bits + s, old_bits + s, m, seed, sums);
    }
  }
  for (size_t j = n; j < n_next; ++j) PrefetchState(state + next[j]);
}

// One task's changes in blocks of kBlock, software-pipelined: block b's
// values are logged and scattered, block b+1's gaps decoded, then block b's
// hash terms summed while block b+1's state elements are prefetched.
template <typename T>
void ApplyTask(const Task& task, const uint64_t seed[2], uint8_t* undo, uint64_t sums[2]) {
  const EncodedChanges& c = *task.changes;
  T* state = reinterpret_cast<T*>(task.tensor->data.data());
  const uint8_t* values = c.values.data();
  uint64_t index[2][kBlock];
  [[maybe_unused]] uint64_t new_bits[kBlock], old_bits[kBlock];
  uint64_t* cur = index[0];
  uint64_t* next = index[1];
  size_t n = std::min(kBlock, task.end - task.begin);
  uint64_t prev = indexcodec::DecodeGapRun(c.index_dtype, c.gaps.data(), task.begin, n, PrevOf(c, task.begin), cur);
  for (size_t k = task.begin; k < task.end;) {
    uint8_t* log = undo + (k - task.begin) * sizeof(T);
    const uint8_t* in = values + k * sizeof(T);
    for (size_t j = 0; j < n; ++j) {
      T old_value, new_value;
      std::memcpy(&old_value, state + cur[j], sizeof(T));
      std::memcpy(&new_value, in + j * sizeof(T), sizeof(T));
      std::memcpy(log + j * sizeof(T), &old_value, sizeof(T));
      std::memcpy(state + cur[j], &new_value, sizeof(T));
      if constexpr (sizeof(T) != 2) {
        old_bits[j] = old_value;
        new_bits[j] = new_value;
      }
    }
    const size_t k_next = k + n;
    const size_t n_next = std::min(kBlock, task.end - k_next);
    if (n_next > 0) prev = indexcodec::DecodeGapRun(c.index_dtype, c.gaps.data(), k_next, n_next, prev, next);
    HashBlockPrefetchingNext<T>(cur, in, log, new_bits, old_bits, n, state, next, n_next, seed, sums);
    std::swap(cur, next);
    k = k_next;
    n = n_next;
  }
}

template <typename T>
void UndoTask(const Task& task, const uint8_t* undo) {
  const EncodedChanges& c = *task.changes;
  uint8_t* state = task.tensor->data.data();
  uint64_t index[kBlock];
  uint64_t prev = PrevOf(c, task.begin);
  for (size_t k = task.begin; k < task.end; k += kBlock) {
    const size_t n = std::min(kBlock, task.end - k);
    prev = indexcodec::DecodeGapRun(c.index_dtype, c.gaps.data(), k, n, prev, index);
    for (size_t j = 0; j < n; ++j) {
      std::memcpy(state + index[j] * sizeof(T), undo + (k - task.begin + j) * sizeof(T), sizeof(T));
    }
  }
}

}  // namespace

Status ValidateEncodedChanges(const WeightState& state, std::span<const EncodedChanges> changes) {
  std::unordered_set<std::string_view> seen;
  for (const EncodedChanges& c : changes) {
    DS_RETURN_IF_ERROR(codec::CheckChangedTensor(state, seen, c.name, c.dtype, c.count, c.values.size(),
                                                 c.count > 0 ? std::optional<uint64_t>(c.last) : std::nullopt));
  }
  return Status::OK();
}

StateHash ApplyGapChanges(WeightState& state, std::span<const EncodedChanges> changes, int threads,
                          std::vector<uint8_t>& undo) {
  size_t value_bytes = 0;
  const std::vector<Task> tasks = Plan(state, changes, &value_bytes);
  undo.resize(value_bytes);
  std::vector<state_hash::TensorSeeds> seeds;
  seeds.reserve(changes.size());
  for (const EncodedChanges& c : changes) {
    const WeightState::Tensor* t = state.Find(c.name);
    seeds.push_back(state_hash::SeedsFor(t->name, t->dtype, t->shape));
  }
  std::vector<std::array<uint64_t, 2>> sums(tasks.size(), {0, 0});
  ParallelFor(tasks.size(), ThreadsFor(tasks, threads), [&](size_t i) {
    const Task& task = tasks[i];
    const uint64_t* seed = seeds[task.tensor_index].element_seed;
    uint8_t* log = undo.data() + task.undo_offset;
    switch (DTypeSize(task.changes->dtype)) {
      case 1: ApplyTask<uint8_t>(task, seed, log, sums[i].data()); break;
      case 2: ApplyTask<uint16_t>(task, seed, log, sums[i].data()); break;
      case 4: ApplyTask<uint32_t>(task, seed, log, sums[i].data()); break;
      default: ApplyTask<uint64_t>(task, seed, log, sums[i].data()); break;
    }
  });
  StateHash total;
  for (const auto& s : sums) total += StateHash{s[0], s[1]};
  return total;
}

void UndoGapChanges(WeightState& state, std::span<const EncodedChanges> changes, int threads,
                    const std::vector<uint8_t>& undo) {
  size_t value_bytes = 0;
  const std::vector<Task> tasks = Plan(state, changes, &value_bytes);
  ParallelFor(tasks.size(), ThreadsFor(tasks, threads), [&](size_t i) {
    const Task& task = tasks[i];
    const uint8_t* log = undo.data() + task.undo_offset;
    switch (DTypeSize(task.changes->dtype)) {
      case 1: UndoTask<uint8_t>(task, log); break;
      case 2: UndoTask<uint16_t>(task, log); break;
      case 4: UndoTask<uint32_t>(task, log); break;
      default: UndoTask<uint64_t>(task, log); break;
    }
  });
}

std::vector<TensorChanges> DecodeGapChanges(std::span<const EncodedChanges> changes) {
  std::vector<TensorChanges> out(changes.size());
  for (size_t i = 0; i < changes.size(); ++i) {
    out[i].name = changes[i].name;
    out[i].dtype = changes[i].dtype;
    indexcodec::DecodeGaps(changes[i].index_dtype, changes[i].gaps, out[i].indices);  // checked when decoded
    out[i].values.assign(changes[i].values.begin(), changes[i].values.end());
  }
  return out;
}

}  // namespace deltasync
