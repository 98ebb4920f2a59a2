// StateHash: hex form, full hashes (chunked over threads) and delta hashes.
// The function itself is specified in docs/format.md, "State hash"; the
// element term is in hash_term.h, its SIMD form in hash_kernels.cc.

#include "deltasync/state_hash.h"

#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>

#include "bf16/chunked.h"
#include "bf16/chunks.h"
#include "bf16/hash_term.h"
#include "bf16/round.h"
#include "bf16/simd_kernels.h"
#include "common/parallel.h"

namespace deltasync {

static_assert(std::endian::native == std::endian::little,
              "element bits are the little-endian bytes, read in place");

namespace state_hash {
namespace {

void AppendU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

}  // namespace

std::string DescriptorBytes(std::string_view name, DType dtype, std::span<const uint64_t> shape) {
  const std::string_view dtype_name = DTypeName(dtype);
  std::string out;
  out.reserve(24 + name.size() + dtype_name.size() + 8 * shape.size());
  AppendU64(out, name.size());
  out.append(name);
  AppendU64(out, dtype_name.size());
  out.append(dtype_name);
  AppendU64(out, shape.size());
  for (uint64_t dim : shape) AppendU64(out, dim);
  return out;
}

TensorSeeds SeedsFor(std::string_view name, DType dtype, std::span<const uint64_t> shape) {
  const std::string bytes = DescriptorBytes(name, dtype, shape);
  TensorSeeds seeds;
  for (int lane = 0; lane < kLanes; ++lane) {
    seeds.descriptor_term[lane] =
        XXH3_64bits_withSeed(bytes.data(), bytes.size(), kDescriptorSeed[lane]);
    seeds.element_seed[lane] = XXH3_64bits_withSeed(bytes.data(), bytes.size(), kElementSeed[lane]);
  }
  return seeds;
}

}  // namespace state_hash

namespace {

constexpr char kHexDigits[] = "0123456789abcdef";

// Adds the element terms of elements [begin, end) of `t` to sums.
void HashSpan(const TensorView& t, uint64_t begin, uint64_t end, const uint64_t seed[2],
              uint64_t sums[2]) {
  const size_t size = DTypeSize(t.dtype);
  const uint8_t* p = t.data.data() + begin * size;
  const size_t n = static_cast<size_t>(end - begin);
  // The kernels only use unaligned loads on these pointers.
  switch (size) {
    case 1: kernels::HashElements8(p, n, begin, seed, sums); break;
    case 2:
      kernels::HashElements16(reinterpret_cast<const uint16_t*>(p), n, begin, seed, sums);
      break;
    case 4:
      kernels::HashElements32(reinterpret_cast<const uint32_t*>(p), n, begin, seed, sums);
      break;
    default:
      kernels::HashElements64(reinterpret_cast<const uint64_t*>(p), n, begin, seed, sums);
      break;
  }
}

// Element bits as an integer: the element's little-endian bytes.
template <typename T>
uint64_t BitsAt(const uint8_t* data, uint64_t index) {
  return bf16::LoadElement(reinterpret_cast<const T*>(data), static_cast<size_t>(index));
}

template <typename T>
StateHash HashDeltaT(const TensorView& before, const TensorChanges& changes, size_t first = 0,
                     size_t last = SIZE_MAX) {
  const state_hash::TensorSeeds seeds =
      state_hash::SeedsFor(before.name, before.dtype, before.shape);
  const uint64_t elements = before.num_elements();
  const size_t count = std::min({changes.indices.size(), changes.values.size() / sizeof(T), last});
  // Gather old and new bits block by block into u64 arrays the kernel can
  // load as vectors; the old values are scattered reads of `before`.
  constexpr size_t kBlock = 512;
  uint64_t indices[kBlock], new_bits[kBlock], old_bits[kBlock];
  uint64_t sums[2] = {0, 0};
  for (size_t start = first; start < count; start += kBlock) {
    const size_t end = std::min(count, start + kBlock);
    size_t m = 0;
    for (size_t k = start; k < end; ++k) {
      const uint64_t i = changes.indices[k];
      // Out of range breaks the REQUIRES; skipping keeps memory safe and
      // leaves a hash that will not match, which callers detect.
      if (i >= elements) continue;
      indices[m] = i;
      new_bits[m] = BitsAt<T>(changes.values.data(), k);
      old_bits[m] = BitsAt<T>(before.data.data(), i);
      ++m;
    }
    kernels::HashTermDiffs(indices, new_bits, old_bits, m, seeds.element_seed, sums);
  }
  return StateHash{sums[0], sums[1]};
}

}  // namespace

std::string StateHash::Hex() const {
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[15 - i] = kHexDigits[(hi >> (4 * i)) & 0xF];
    out[31 - i] = kHexDigits[(lo >> (4 * i)) & 0xF];
  }
  return out;
}

Result<StateHash> StateHash::FromHex(std::string_view hex) {
  // Untrusted input (a manifest field): quote at most a prefix of it.
  const std::string shown(hex.substr(0, 40));
  if (hex.size() != 32) {
    return Status::InvalidArgument("state hash '" + shown +
                                   "': expected 32 lower-case hex digits, got " +
                                   std::to_string(hex.size()) + " characters");
  }
  StateHash h;
  for (size_t i = 0; i < 32; ++i) {
    const char c = hex[i];
    uint64_t digit;
    if (c >= '0' && c <= '9') {
      digit = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<uint64_t>(c - 'a' + 10);
    } else {
      return Status::InvalidArgument("state hash '" + shown + "': character " + std::to_string(i) +
                                     " is not a lower-case hex digit");
    }
    uint64_t& half = i < 16 ? h.hi : h.lo;
    half = (half << 4) | digit;
  }
  return h;
}

namespace bf16 {

StateHash HashTensorsChunked(std::span<const TensorView> tensors, int threads,
                             uint64_t chunk_elements) {
  StateHash h;
  std::vector<state_hash::TensorSeeds> seeds;
  std::vector<uint64_t> counts;
  seeds.reserve(tensors.size());
  counts.reserve(tensors.size());
  for (const TensorView& t : tensors) {
    seeds.push_back(state_hash::SeedsFor(t.name, t.dtype, t.shape));
    h += StateHash{seeds.back().descriptor_term[0], seeds.back().descriptor_term[1]};
    counts.push_back(t.num_elements());
  }
  const std::vector<Chunk> chunks = SplitIntoChunks(counts, chunk_elements);
  // Sums mod 2^64 commute, so the per-chunk partials can be added in any
  // order: the result does not depend on threads or chunking.
  std::vector<std::array<uint64_t, 2>> partial(chunks.size(), {0, 0});
  ParallelFor(chunks.size(), threads, [&](size_t c) {
    const Chunk& ch = chunks[c];
    HashSpan(tensors[ch.tensor], ch.begin, ch.end, seeds[ch.tensor].element_seed,
             partial[c].data());
  });
  for (const auto& p : partial) h += StateHash{p[0], p[1]};
  return h;
}

}  // namespace bf16

StateHash HashTensors(std::span<const TensorView> tensors, int threads) {
  return bf16::HashTensorsChunked(tensors, threads, bf16::kDefaultChunkElements);
}

StateHash HashState(const WeightState& state, int threads) {
  const std::vector<TensorView> views = state.views();
  return HashTensors(views, threads);
}

static StateHash HashDeltaRange(const TensorView& before, const TensorChanges& changes, size_t first,
                                size_t last) {
  switch (DTypeSize(before.dtype)) {
    case 1: return HashDeltaT<uint8_t>(before, changes, first, last);
    case 2: return HashDeltaT<uint16_t>(before, changes, first, last);
    case 4: return HashDeltaT<uint32_t>(before, changes, first, last);
    default: return HashDeltaT<uint64_t>(before, changes, first, last);
  }
}

StateHash HashDelta(const TensorView& before, const TensorChanges& changes) {
  return HashDeltaRange(before, changes, 0, SIZE_MAX);
}

Result<StateHash> HashChanges16(std::string_view name, DType dtype, std::span<const uint64_t> shape,
                                std::span<const uint64_t> indices, ByteSpan old_values, ByteSpan new_values) {
  if (DTypeSize(dtype) != 2) {
    return Status::InvalidArgument("HashChanges16: dtype " + std::string(DTypeName(dtype)) + " is not 2 bytes wide");
  }
  if (old_values.size() != 2 * indices.size() || new_values.size() != 2 * indices.size()) {
    return Status::InvalidArgument("HashChanges16: " + std::to_string(indices.size()) + " indices but " +
                                   std::to_string(old_values.size()) + " old and " +
                                   std::to_string(new_values.size()) + " new value bytes");
  }
  const state_hash::TensorSeeds seeds = state_hash::SeedsFor(name, dtype, shape);
  uint64_t sums[2] = {0, 0};
  kernels::HashTermDiffs16(indices.data(), new_values.data(), old_values.data(), indices.size(), seeds.element_seed,
                           sums);
  return StateHash{sums[0], sums[1]};
}

StateHash HashChanges(const WeightState& state, std::span<const TensorChanges> changes, int threads) {
  const std::vector<TensorView> views = state.views();
  return HashChanges(views, changes, threads);
}

StateHash HashChanges(std::span<const TensorView> tensors, std::span<const TensorChanges> changes, int threads) {
  // Work items of at most 1 Mi changes, so one big tensor (an embedding)
  // spreads over every thread; each item sums into its own slot and the
  // slots are added at the end (addition mod 2^64 is order-independent).
  constexpr size_t kItem = size_t{1} << 20;
  struct Item {
    const TensorView* tensor;
    const TensorChanges* changes;
    size_t first, last;
  };
  std::vector<Item> items;
  for (const TensorChanges& c : changes) {
    auto t = std::find_if(tensors.begin(), tensors.end(), [&](const TensorView& v) { return v.name == c.name; });
    if (t == tensors.end()) continue;  // breaks the REQUIRES; the hash will not match
    for (size_t first = 0; first < c.count(); first += kItem) {
      items.push_back({&*t, &c, first, std::min(c.count(), first + kItem)});
    }
  }
  std::vector<StateHash> sums(items.size());
  ParallelFor(items.size(), threads, [&](size_t i) {
    sums[i] = HashDeltaRange(*items[i].tensor, *items[i].changes, items[i].first, items[i].last);
  });
  StateHash total;
  for (const StateHash& h : sums) total += h;
  return total;
}

}  // namespace deltasync
