#include "deltasync/weight_state.h"

#include <algorithm>

#include "common/pages.h"
#include "common/parallel.h"

namespace deltasync {

Result<WeightState> WeightState::FromViews(std::span<const TensorView> tensors) {
  // Fresh memory would fault in 4 KiB at a time as it is copied into (most
  // of the time of a checkpoint's copy): each tensor's capacity is reserved
  // and faulted in ahead in large pieces on all threads, then the tensors
  // are copied in parallel. Huge pages are advised: the copy is a
  // long-lived state (a publisher's, read every version). Their cost is at
  // the copy: this guest's first publish took 1.9-2.9 s of encode with them
  // against 1.4-1.5 s without, the kernel compacting memory for them
  // (docs/benchmarks.md, session 42).
  std::vector<Tensor> copies;
  copies.reserve(tensors.size());
  std::vector<MutableByteSpan> fresh;
  fresh.reserve(tensors.size());
  for (const TensorView& t : tensors) {
    Tensor& copy = copies.emplace_back(Tensor{t.name, t.dtype, t.shape, {}});
    copy.data.reserve(t.data.size());
    fresh.emplace_back(copy.data.data(), t.data.size());
  }
  PrepareFreshPages(fresh, /*threads=*/0, /*huge=*/true);
  ParallelFor(copies.size(), /*threads=*/0,
              [&](size_t i) { copies[i].data.assign(tensors[i].data.begin(), tensors[i].data.end()); });
  return FromTensors(std::move(copies));
}

Result<WeightState> WeightState::FromTensors(std::vector<Tensor> tensors) {
  WeightState state;
  for (const Tensor& t : tensors) {
    auto count = CheckedElementCount(t.shape);
    if (!count || *count > UINT64_MAX / DTypeSize(t.dtype) || *count * DTypeSize(t.dtype) != t.data.size()) {
      return Status::InvalidArgument("tensor '" + t.name + "': " + std::to_string(t.data.size()) +
                                     " bytes do not match shape " + ShapeToString(t.shape) + " x " +
                                     std::string(DTypeName(t.dtype)));
    }
  }
  state.tensors_ = std::move(tensors);
  std::sort(state.tensors_.begin(), state.tensors_.end(),
            [](const Tensor& a, const Tensor& b) { return a.name < b.name; });
  for (size_t i = 0; i < state.tensors_.size(); ++i) {
    if (!state.index_.emplace(state.tensors_[i].name, i).second) {
      return Status::InvalidArgument("tensor '" + state.tensors_[i].name + "' appears twice");
    }
  }
  return state;
}

std::vector<TensorView> WeightState::views() const {
  std::vector<TensorView> out;
  out.reserve(tensors_.size());
  for (const Tensor& t : tensors_) out.push_back(t.view());
  return out;
}

const WeightState::Tensor* WeightState::Find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

WeightState::Tensor* WeightState::FindMutable(std::string_view name) {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t WeightState::total_elements() const {
  uint64_t n = 0;
  for (const Tensor& t : tensors_) n += t.num_elements();
  return n;
}

uint64_t WeightState::total_bytes() const {
  uint64_t n = 0;
  for (const Tensor& t : tensors_) n += t.data.size();
  return n;
}

}  // namespace deltasync
