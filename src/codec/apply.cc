// Validating and applying decoded changes to a WeightState: the replica's hot
// path. Values are absolute, so applying is a scatter (state[idx[k]] = val[k]),
// split into chunks that run in parallel across and within tensors. Chunks
// never share an element because a tensor's indices are strictly ascending.
#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "bf16/hash_term.h"
#include "bf16/simd_kernels.h"
#include "codec/change_checks.h"
#include "common/parallel.h"
#include "deltasync/patch.h"
#include "deltasync/state_hash.h"

namespace deltasync {
namespace {

// Indices per parallel task: large enough to amortise the hand-out, small
// enough that one big tensor spreads over every thread.
constexpr size_t kChunk = size_t{1} << 16;

// Copies n elements of kSize bytes: to data[idx[k]] from flat[k]
// (kScatter), or from data[idx[k]] to flat[k].
template <size_t kSize, bool kScatter>
void CopyIndexed(uint8_t* data, const uint64_t* idx, uint8_t* flat, size_t n) {
  for (size_t k = 0; k < n; ++k) {
    if constexpr (kScatter) {
      std::memcpy(data + idx[k] * kSize, flat + k * kSize, kSize);
    } else {
      std::memcpy(flat + k * kSize, data + idx[k] * kSize, kSize);
    }
  }
}

template <bool kScatter>
void CopyIndexed(uint8_t* data, const uint64_t* idx, uint8_t* flat, size_t n, size_t size) {
  switch (size) {
    case 1: return CopyIndexed<1, kScatter>(data, idx, flat, n);
    case 2: return CopyIndexed<2, kScatter>(data, idx, flat, n);
    case 4: return CopyIndexed<4, kScatter>(data, idx, flat, n);
    default: return CopyIndexed<8, kScatter>(data, idx, flat, n);
  }
}

// Copies the elements idx[0..n) of `data` (width `size`) to dst, in order.
void GatherRange(uint8_t* dst, const uint64_t* idx, const uint8_t* data, size_t n, size_t size) {
  CopyIndexed<false>(const_cast<uint8_t*>(data), idx, dst, n, size);  // reads data only
}

// Writes src's n elements (width `size`) to the elements idx[0..n) of `data`.
void ScatterRange(uint8_t* data, const uint64_t* idx, const uint8_t* src, size_t n, size_t size) {
  CopyIndexed<true>(data, idx, const_cast<uint8_t*>(src), n, size);  // reads src only
}

}  // namespace

Status codec::CheckChangedTensor(const WeightState& state, std::unordered_set<std::string_view>& seen,
                                const std::string& name, DType dtype, uint64_t count, size_t value_bytes,
                                std::optional<uint64_t> last) {
  const WeightState::Tensor* t = state.Find(name);
  if (!t) return Status::Corruption("tensor '" + name + "': changed by the delta but absent from the state");
  if (!seen.insert(t->name).second) return Status::Corruption("tensor '" + name + "': changed twice by the delta");
  if (dtype != t->dtype) {
    return Status::Corruption("tensor '" + name + "': the delta carries " + std::string(DTypeName(dtype)) +
                              " values but the state holds " + std::string(DTypeName(t->dtype)));
  }
  if (value_bytes != count * DTypeSize(dtype)) {
    return Status::Corruption("tensor '" + name + "': " + std::to_string(value_bytes) + " value bytes for " +
                              std::to_string(count) + " indices of " + std::string(DTypeName(dtype)));
  }
  if (last && *last >= t->num_elements()) {
    return Status::Corruption("tensor '" + name + "': index " + std::to_string(*last) +
                              " is out of range (the tensor has " + std::to_string(t->num_elements()) + " elements)");
  }
  return Status::OK();
}

Status ValidateChanges(const WeightState& state, std::span<const TensorChanges> changes) {
  std::unordered_set<std::string_view> seen;
  for (const TensorChanges& c : changes) {
    // Indices are strictly ascending (TensorChanges' invariant), so the last
    // one is the largest.
    DS_RETURN_IF_ERROR(codec::CheckChangedTensor(
        state, seen, c.name, c.dtype, c.count(), c.values.size(),
        c.indices.empty() ? std::nullopt : std::optional<uint64_t>(c.indices.back())));
  }
  return Status::OK();
}

namespace {

struct Task {
  WeightState::Tensor* tensor;
  size_t entry;  // of the changes
  size_t begin, end;
};

// Chunks of kChunk changes of every entry, and the threads to run them on:
// one chunk's worth runs faster here than a thread starts.
std::vector<Task> Plan(WeightState& state, std::span<const TensorChanges> changes, int threads, int* use) {
  std::vector<Task> tasks;
  size_t total = 0;
  for (size_t i = 0; i < changes.size(); ++i) {
    const TensorChanges& c = changes[i];
    WeightState::Tensor* t = state.FindMutable(c.name);
    for (size_t b = 0; b < c.count(); b += kChunk) tasks.push_back({t, i, b, std::min(b + kChunk, c.count())});
    total += c.count();
  }
  *use = total <= kChunk ? 1 : threads;
  return tasks;
}

}  // namespace

void ApplyChanges(WeightState& state, std::span<const TensorChanges> changes, int threads) {
  int use = 1;
  const std::vector<Task> tasks = Plan(state, changes, threads, &use);
  ParallelFor(tasks.size(), use, [&](size_t i) {
    const Task& task = tasks[i];
    const TensorChanges& c = changes[task.entry];
    const size_t size = DTypeSize(c.dtype);
    ScatterRange(task.tensor->data.data(), c.indices.data() + task.begin, c.values.data() + task.begin * size,
                 task.end - task.begin, size);
  });
}

StateHash ApplyChangesWithUndo(WeightState& state, std::span<const TensorChanges> changes, int threads,
                               std::vector<std::vector<uint8_t>>& old) {
  old.resize(changes.size());
  StateHash total;
  std::vector<state_hash::TensorSeeds> seeds(changes.size());
  for (size_t i = 0; i < changes.size(); ++i) {
    const TensorChanges& c = changes[i];
    old[i].resize(c.values.size());
    const WeightState::Tensor* t = state.Find(c.name);
    if (DTypeSize(c.dtype) == 2) {
      seeds[i] = state_hash::SeedsFor(t->name, t->dtype, t->shape);
    } else {
      // Other widths (rare in a bf16 model) are hashed apart, before any
      // scatter, and then only gathered and scattered below.
      const TensorView view = t->view();
      total += HashChanges(std::span<const TensorView>(&view, 1), std::span<const TensorChanges>(&c, 1), threads);
    }
  }
  int use = 1;
  const std::vector<Task> tasks = Plan(state, changes, threads, &use);
  std::vector<StateHash> sums(tasks.size());
  ParallelFor(tasks.size(), use, [&](size_t i) {
    const Task& task = tasks[i];
    const TensorChanges& c = changes[task.entry];
    const size_t size = DTypeSize(c.dtype);
    uint8_t* kept = old[task.entry].data() + task.begin * size;
    const uint64_t* idx = c.indices.data() + task.begin;
    const size_t n = task.end - task.begin;
    GatherRange(kept, idx, task.tensor->data.data(), n, size);
    if (size == 2) {
      uint64_t hash[2] = {0, 0};
      kernels::HashTermDiffs16(idx, c.values.data() + task.begin * 2, kept, n, seeds[task.entry].element_seed, hash);
      sums[i] = StateHash{hash[0], hash[1]};
    }
    ScatterRange(task.tensor->data.data(), idx, c.values.data() + task.begin * size, n, size);
  });
  for (const StateHash& h : sums) total += h;
  return total;
}

void UndoChanges(WeightState& state, std::span<const TensorChanges> changes,
                 std::span<const std::vector<uint8_t>> old, int threads) {
  int use = 1;
  const std::vector<Task> tasks = Plan(state, changes, threads, &use);
  ParallelFor(tasks.size(), use, [&](size_t i) {
    const Task& task = tasks[i];
    const size_t size = DTypeSize(changes[task.entry].dtype);
    ScatterRange(task.tensor->data.data(), changes[task.entry].indices.data() + task.begin,
                 old[task.entry].data() + task.begin * size, task.end - task.begin, size);
  });
}

}  // namespace deltasync
