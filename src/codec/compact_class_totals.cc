// The class totals a replica holds for the compact apply
// (include/deltasync/compact_class_totals.h).
#include "deltasync/compact_class_totals.h"

#include <algorithm>
#include <utility>

#include "bf16/simd_kernels.h"
#include "codec/compact_bf16.h"
#include "common/parallel.h"

namespace deltasync {

const CompactClassTotals::State* CompactClassTotals::Find(const StateHash& hash, uint64_t chunk_elements) const {
  for (const State& s : states) {
    if (s.valid && s.hash == hash && s.chunk_elements == chunk_elements) return &s;
  }
  return nullptr;
}

CompactClassTotals::State* CompactClassTotals::Find(const StateHash& hash, uint64_t chunk_elements) {
  return const_cast<State*>(std::as_const(*this).Find(hash, chunk_elements));
}

void CompactClassTotals::Invalidate() {
  for (State& s : states) s.valid = false;
}

void CompactClassTotals::Rename(const StateHash& from, const StateHash& to) {
  for (State& s : states) {
    if (s.valid && s.hash == from) {
      s.hash = to;
      return;
    }
  }
}

void CompactClassTotals::Count(std::span<const TensorView> state, const StateHash& hash, int threads) {
  constexpr uint64_t kChunk = compact::kDecodeChunkElements;
  constexpr uint64_t kBlock = 1024;  // ClassCountsBytes16's block
  using compact::kClasses;
  constexpr uint32_t kAll = (uint32_t{1} << kClasses) - 1;
  Invalidate();
  State& s = states[0];
  s.hash = hash;
  s.chunk_elements = kChunk;
  s.tensors.resize(state.size());
  struct Job {
    const uint16_t* data;
    uint64_t n;
    std::array<uint32_t, kClasses>* counts;
  };
  std::vector<Job> jobs;
  for (size_t i = 0; i < state.size(); ++i) {
    Tensor& t = s.tensors[i];
    if (state[i].dtype != DType::kBF16) {
      t = Tensor{};
      continue;
    }
    t.elements = state[i].num_elements();
    t.classes = kAll;
    t.chunks.resize((t.elements + kChunk - 1) / kChunk);
    const uint16_t* data = reinterpret_cast<const uint16_t*>(state[i].data.data());
    for (uint64_t c = 0; c < t.chunks.size(); ++c) {
      jobs.push_back({data + c * kChunk, std::min(kChunk, t.elements - c * kChunk), &t.chunks[c]});
    }
  }
  ParallelFor(jobs.size(), threads, [&](size_t k) {
    const Job& job = jobs[k];
    const size_t blocks = static_cast<size_t>((job.n + kBlock - 1) / kBlock);
    // Per thread, reused (as the walker's): the class bytes are not kept.
    thread_local std::vector<uint16_t> block_counts;
    thread_local std::vector<uint8_t> class_bytes;
    block_counts.resize(std::max(block_counts.size(), blocks * kClasses));
    class_bytes.resize(std::max(class_bytes.size(), blocks * kBlock + 64));
    uint8_t* const bytes = class_bytes.data() + (-reinterpret_cast<uintptr_t>(class_bytes.data()) & 63);
    kernels::ClassCountsBytes16(job.data, static_cast<size_t>(job.n), kAll, block_counts.data(), bytes);
    std::array<uint32_t, kClasses> counts{};
    for (size_t b = 0; b < blocks; ++b) {
      for (int cl = 0; cl < kClasses; ++cl) counts[cl] += block_counts[b * kClasses + cl];
    }
    *job.counts = counts;
  });
  s.valid = true;
}

uint64_t CompactClassTotals::HeldBytes() const {
  uint64_t bytes = 0;
  for (const State& s : states) {
    if (!s.valid) continue;
    for (const Tensor& t : s.tensors) {
      if (t.elements != 0) bytes += t.chunks.size() * sizeof(t.chunks[0]);
    }
  }
  return bytes;
}

}  // namespace deltasync
