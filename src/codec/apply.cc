// Validating and applying decoded changes to a WeightState: the replica's hot
// path. Values are absolute, so applying is a scatter (state[idx[k]] = val[k]),
// split into chunks that run in parallel across and within tensors. Chunks
// never share an element because a tensor's indices are strictly ascending.
#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "codec/change_checks.h"

#include "common/parallel.h"
#include "deltasync/patch.h"

namespace deltasync {
namespace {

// Indices per parallel task: large enough to amortise the hand-out, small
// enough that one big tensor spreads over every thread.
constexpr size_t kChunk = size_t{1} << 16;

template <size_t kSize>
void Scatter(uint8_t* dst, const uint64_t* idx, const uint8_t* src, size_t n) {
  for (size_t k = 0; k < n; ++k) std::memcpy(dst + idx[k] * kSize, src + k * kSize, kSize);
}

void ScatterRange(WeightState::Tensor& t, const TensorChanges& c, size_t begin, size_t end) {
  const size_t size = DTypeSize(c.dtype);
  const uint64_t* idx = c.indices.data() + begin;
  const uint8_t* src = c.values.data() + begin * size;
  const size_t n = end - begin;
  switch (size) {
    case 1: Scatter<1>(t.data.data(), idx, src, n); break;
    case 2: Scatter<2>(t.data.data(), idx, src, n); break;
    case 4: Scatter<4>(t.data.data(), idx, src, n); break;
    default: Scatter<8>(t.data.data(), idx, src, n); break;
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

void ApplyChanges(WeightState& state, std::span<const TensorChanges> changes, int threads) {
  struct Task {
    WeightState::Tensor* tensor;
    const TensorChanges* change;
    size_t begin, end;
  };
  std::vector<Task> tasks;
  size_t total = 0;
  for (const TensorChanges& c : changes) {
    WeightState::Tensor* t = state.FindMutable(c.name);
    for (size_t b = 0; b < c.count(); b += kChunk) tasks.push_back({t, &c, b, std::min(b + kChunk, c.count())});
    total += c.count();
  }
  // One chunk's worth runs faster here than a thread starts.
  ParallelFor(tasks.size(), total <= kChunk ? 1 : threads, [&](size_t i) {
    ScatterRange(*tasks[i].tensor, *tasks[i].change, tasks[i].begin, tasks[i].end);
  });
}

}  // namespace deltasync
