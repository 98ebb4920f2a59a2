// Validating and applying decoded changes to a WeightState: the replica's hot
// path. Values are absolute, so applying is a scatter (state[idx[k]] = val[k]),
// split into chunks that run in parallel across and within tensors. Chunks
// never share an element because a tensor's indices are strictly ascending.
#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "bf16/detect_apply.h"
#include "bf16/hash_term.h"
#include "codec/change_checks.h"
#include "common/parallel.h"
#include "deltasync/patch.h"
#include "deltasync/state_hash.h"

namespace deltasync {
namespace {

// Indices per parallel task: large enough to amortise the hand-out, small
// enough that one big tensor spreads over every thread.
constexpr size_t kChunk = size_t{1} << 16;

template <size_t kSize>
void Scatter(uint8_t* data, const uint64_t* idx, const uint8_t* src, size_t n) {
  for (size_t k = 0; k < n; ++k) std::memcpy(data + idx[k] * kSize, src + k * kSize, kSize);
}

// Writes src's n elements (width `size`) to the elements idx[0..n) of `data`.
void ScatterRange(uint8_t* data, const uint64_t* idx, const uint8_t* src, size_t n, size_t size) {
  switch (size) {
    case 1: return Scatter<1>(data, idx, src, n);
    case 2: return Scatter<2>(data, idx, src, n);
    case 4: return Scatter<4>(data, idx, src, n);
    default: return Scatter<8>(data, idx, src, n);
  }
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
  std::vector<state_hash::TensorSeeds> seeds(changes.size());
  for (size_t i = 0; i < changes.size(); ++i) {
    const WeightState::Tensor* t = state.Find(changes[i].name);
    seeds[i] = state_hash::SeedsFor(t->name, t->dtype, t->shape);
    old[i].resize(changes[i].values.size());
  }
  int use = 1;
  const std::vector<Task> tasks = Plan(state, changes, threads, &use);
  std::vector<StateHash> sums(tasks.size());
  ParallelFor(tasks.size(), use, [&](size_t i) {
    // The block apply the detection runs in its pass (bf16/detect_apply.h).
    const Task& task = tasks[i];
    const TensorChanges& c = changes[task.entry];
    const size_t size = DTypeSize(c.dtype);
    uint64_t hash[2] = {0, 0};
    bf16::ApplyBlock(task.tensor->data.data(), size, c.indices.data() + task.begin,
                     c.values.data() + task.begin * size, old[task.entry].data() + task.begin * size,
                     task.end - task.begin, seeds[task.entry], hash);
    sums[i] = StateHash{hash[0], hash[1]};
  });
  StateHash total;
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
    bf16::UndoBlock(task.tensor->data.data(), size, changes[task.entry].indices.data() + task.begin,
                    old[task.entry].data() + task.begin * size, task.end - task.begin);
  });
}

}  // namespace deltasync
