// Detecting and applying in one pass (detect_apply.h): the per-block apply
// the detection's chunks call, and the entry point.
#include "bf16/detect_apply.h"

#include <algorithm>
#include <cstring>

#include "bf16/round.h"
#include "bf16/scan.h"
#include "bf16/simd_kernels.h"

namespace deltasync::bf16 {
namespace {

// Any width: the values widened to 64 bits, a block at a time, for the hash
// kernel (as HashDelta does).
template <typename T>
void ApplyBlockT(T* data, const uint64_t* idx, const uint8_t* val, uint8_t* old, size_t n,
                 const state_hash::TensorSeeds& seeds, uint64_t hash[2]) {
  constexpr size_t kStep = 512;
  uint64_t new_bits[kStep], old_bits[kStep];
  for (size_t start = 0; start < n; start += kStep) {
    const size_t m = std::min(kStep, n - start);
    for (size_t k = 0; k < m; ++k) {
      const T was = data[idx[start + k]];
      const T now = LoadElement(reinterpret_cast<const T*>(val), start + k);
      std::memcpy(old + (start + k) * sizeof(T), &was, sizeof(T));
      data[idx[start + k]] = now;
      old_bits[k] = was;
      new_bits[k] = now;
    }
    kernels::HashTermDiffs(idx + start, new_bits, old_bits, m, seeds.element_seed, hash);
  }
}

template <typename T>
void UndoBlockT(T* data, const uint64_t* idx, const uint8_t* old, size_t n) {
  for (size_t k = 0; k < n; ++k) data[idx[k]] = LoadElement(reinterpret_cast<const T*>(old), k);
}

}  // namespace

void ApplyBlock(uint8_t* data, size_t size, const uint64_t* idx, const uint8_t* val, uint8_t* old, size_t n,
                const state_hash::TensorSeeds& seeds, uint64_t hash[2]) {
  switch (size) {
    case 1: return ApplyBlockT(data, idx, val, old, n, seeds, hash);
    case 2: {
      // The common case: gathered, hashed from the bytes as they lie (no
      // widening), then scattered.
      uint16_t* d = reinterpret_cast<uint16_t*>(data);
      for (size_t k = 0; k < n; ++k) std::memcpy(old + 2 * k, &d[idx[k]], 2);
      kernels::HashTermDiffs16(idx, val, old, n, seeds.element_seed, hash);
      for (size_t k = 0; k < n; ++k) std::memcpy(&d[idx[k]], val + 2 * k, 2);
      return;
    }
    case 4: return ApplyBlockT(reinterpret_cast<uint32_t*>(data), idx, val, old, n, seeds, hash);
    default: return ApplyBlockT(reinterpret_cast<uint64_t*>(data), idx, val, old, n, seeds, hash);
  }
}

void UndoBlock(uint8_t* data, size_t size, const uint64_t* idx, const uint8_t* old, size_t n) {
  switch (size) {
    case 1: return UndoBlockT(data, idx, old, n);
    case 2: return UndoBlockT(reinterpret_cast<uint16_t*>(data), idx, old, n);
    case 4: return UndoBlockT(reinterpret_cast<uint32_t*>(data), idx, old, n);
    default: return UndoBlockT(reinterpret_cast<uint64_t*>(data), idx, old, n);
  }
}

Status DetectAndApply(WeightState& published, std::span<const TensorView> current, const DetectOptions& options,
                      uint64_t chunk_elements, std::vector<TensorChanges>& out,
                      std::vector<std::vector<uint8_t>>& old, StateHash* delta) {
  *delta = StateHash{};
  Result<std::vector<ScanJob>> jobs = PlanDetect(published, current, options);
  if (!jobs.ok()) {
    out.clear();
    old.clear();
    return jobs.status();
  }
  // PlanDetect makes one job per tensor of `published`, in order.
  InScanApply apply;
  for (const WeightState::Tensor& t : published.tensors()) {
    apply.seeds.push_back(state_hash::SeedsFor(t.name, t.dtype, t.shape));
  }
  return DetectJobs(*jobs, options, chunk_elements, out, &apply, &old, delta);
}

}  // namespace deltasync::bf16
