// State hash terms of blocks (state_hash.h, "Parts"): the element terms of a
// block's elements at their flat indices in the full tensor, run by run.
#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "bf16/hash_term.h"
#include "bf16/simd_kernels.h"
#include "common/parallel.h"
#include "deltasync/state_hash.h"

namespace deltasync {
namespace {

constexpr uint64_t kItemElements = uint64_t{1} << 21;

// Adds the terms of n elements at p, which sit at flat index `base`.
void HashRun(const uint8_t* p, size_t n, size_t width, uint64_t base, const uint64_t seed[2], uint64_t sums[2]) {
  switch (width) {
    case 1: kernels::HashElements8(p, n, base, seed, sums); break;
    case 2: kernels::HashElements16(reinterpret_cast<const uint16_t*>(p), n, base, seed, sums); break;
    case 4: kernels::HashElements32(reinterpret_cast<const uint32_t*>(p), n, base, seed, sums); break;
    default: kernels::HashElements64(reinterpret_cast<const uint64_t*>(p), n, base, seed, sums); break;
  }
}

uint64_t Bits(const uint8_t* p, size_t width) {
  uint64_t v = 0;
  std::memcpy(&v, p, width);  // little-endian host (state_hash.cc asserts it)
  return v;
}

}  // namespace

StateHash DescriptorTerm(std::string_view name, DType dtype, std::span<const uint64_t> full_shape) {
  const state_hash::TensorSeeds s = state_hash::SeedsFor(name, dtype, full_shape);
  return StateHash{s.descriptor_term[0], s.descriptor_term[1]};
}

StateHash HashBlock(std::string_view name, DType dtype, const BlockGeometry& g, ByteSpan data, int threads) {
  const state_hash::TensorSeeds seeds = state_hash::SeedsFor(name, dtype, g.full_shape());
  const size_t width = DTypeSize(dtype);
  const uint64_t n = std::min<uint64_t>(g.elements(), data.size() / width);
  const size_t items = static_cast<size_t>((n + kItemElements - 1) / kItemElements);
  std::vector<std::array<uint64_t, 2>> partial(items, {0, 0});
  const uint64_t run = g.run_length();
  ParallelFor(items, threads, [&](size_t item) {
    const uint64_t end = std::min(n, (item + 1) * kItemElements);
    for (uint64_t pos = item * kItemElements; pos < end;) {
      const uint64_t within = pos % run;
      const uint64_t len = std::min(run - within, end - pos);
      HashRun(data.data() + pos * width, static_cast<size_t>(len), width, g.RunStart(pos / run) + within,
              seeds.element_seed, partial[item].data());
      pos += len;
    }
  });
  StateHash h;
  for (const auto& p : partial) h += StateHash{p[0], p[1]};
  return h;
}

StateHash HashBlockChanges(std::string_view name, DType dtype, const BlockGeometry& g,
                           std::span<const uint64_t> local_indices, ByteSpan old_values, ByteSpan new_values) {
  const state_hash::TensorSeeds seeds = state_hash::SeedsFor(name, dtype, g.full_shape());
  const size_t width = DTypeSize(dtype);
  const size_t count = std::min({local_indices.size(), old_values.size() / width, new_values.size() / width});
  constexpr size_t kBatch = 512;
  uint64_t index[kBatch], new_bits[kBatch], old_bits[kBatch];
  uint64_t sums[2] = {0, 0};
  for (size_t start = 0; start < count; start += kBatch) {
    const size_t m = std::min(kBatch, count - start);
    for (size_t k = 0; k < m; ++k) {
      index[k] = g.FullIndex(local_indices[start + k]);
      new_bits[k] = Bits(new_values.data() + (start + k) * width, width);
      old_bits[k] = Bits(old_values.data() + (start + k) * width, width);
    }
    kernels::HashTermDiffs(index, new_bits, old_bits, m, seeds.element_seed, sums);
  }
  return StateHash{sums[0], sums[1]};
}

}  // namespace deltasync
