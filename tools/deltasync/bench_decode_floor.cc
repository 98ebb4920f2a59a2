// bench: the floor of the replica's compact decode and apply
// (bench_decode_floor.h).
#include "bench_decode_floor.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>

#include "deltasync/compact.h"
#include "deltasync/manifest.h"
#include "deltasync/safetensors.h"
#include "deltasync/state_hash.h"
#include "bench_floor.h"
#include "timing.h"

namespace deltasync::cli {
namespace {

// A piece of a bf16 tensor with changes: `elements` elements from element
// `first`, and the changes among them (indices in the tensor, u16 values).
struct Piece {
  uint8_t* data;
  uint64_t first, elements;
  const uint64_t* index;
  const uint8_t* values;
  size_t changes;
};

// The read of a piece with each 1024-element block's changes stored while
// the block is in cache: the memory traffic of an apply that writes in
// place (every line read once, the changed ones written back).
uint64_t ReadScatter(const Piece& p) {
  uint64_t x = 0;
  size_t k = 0;
  for (uint64_t at = 0; at < p.elements; at += 1024) {
    const uint64_t len = std::min<uint64_t>(1024, p.elements - at);
    x += ReadFold(p.data + 2 * at, 2 * len);
    const uint64_t end = p.first + at + len;
    for (; k < p.changes && p.index[k] < end; ++k) std::memcpy(p.data + 2 * (p.index[k] - p.first), p.values + 2 * k, 2);
  }
  return x;
}

// fn(piece) for every piece on `threads` threads, handed out in order.
template <typename F>
void OnThreads(const std::vector<Piece>& pieces, int threads, std::atomic<uint64_t>& sink, F fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    uint64_t x = 0;
    for (size_t i; (i = next.fetch_add(1)) < pieces.size();) x += fn(pieces[i]);
    sink.fetch_add(x, std::memory_order_relaxed);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& th : pool) th.join();
}

// The decoder sums the hash terms of each chunk of 64 or 128 Ki elements
// (compact_bf16.h DecodeChunkElements(): ~2-4 Ki changes at the demo's rate)
// right after decoding them, so it reads them from L1/L2, never from
// memory. The floor hashes slices of at most this many changes (192 KiB of
// index, old and new: in L2) from buffers just written. Slices of the
// decoder's own chunks measure the same kernel plus a clock read and a
// seed derivation per ~2 Ki changes, which no decoder pays (docs/
// benchmarks.md, session 51 h4: 16 Ki, 4 Ki and 64 Ki changes agree).
constexpr size_t kHashSliceChanges = size_t{1} << 14;

struct SlicedHash {
  StateHash sum;
  double seconds = 0;  // this thread's CPU time in the hash calls alone
};

// HashChanges16 of every 2-byte tensor's changes, slice by slice: each
// slice's indices and old and new values copied (untimed) into buffers
// reused across slices, so the timed hash reads them from cache, as the
// decoder's does right after decoding them.
Result<SlicedHash> HashInSlices(const WeightState& state, const std::vector<TensorChanges>& changes,
                                const std::vector<TensorChanges>& old) {
  SlicedHash out;
  std::vector<uint64_t> index(kHashSliceChanges);
  std::vector<uint8_t> old_bytes(2 * kHashSliceChanges), new_bytes(2 * kHashSliceChanges);
  for (size_t i = 0; i < changes.size(); ++i) {
    const TensorChanges& c = changes[i];
    if (DTypeSize(c.dtype) != 2) continue;
    const WeightState::Tensor* t = state.Find(c.name);
    for (size_t k = 0; k < c.count(); k += kHashSliceChanges) {
      const size_t n = std::min(kHashSliceChanges, c.count() - k);
      std::memcpy(index.data(), c.indices.data() + k, 8 * n);
      std::memcpy(old_bytes.data(), old[i].values.data() + 2 * k, 2 * n);
      std::memcpy(new_bytes.data(), c.values.data() + 2 * k, 2 * n);
      const double t0 = ThreadCpuSeconds();
      Result<StateHash> h = HashChanges16(c.name, c.dtype, t->shape, std::span(index.data(), n),
                                          ByteSpan(old_bytes.data(), 2 * n), ByteSpan(new_bytes.data(), 2 * n));
      out.seconds += ThreadCpuSeconds() - t0;
      DS_RETURN_IF_ERROR(h.status());
      out.sum += *h;
    }
  }
  return out;
}

}  // namespace

Result<DecodeFloorFigures> MeasureDecodeFloor(WeightState& state, const StateHash& base_hash, const Blob& delta,
                                              const std::vector<TensorChanges>& changes,
                                              const std::vector<TensorChanges>& old, int threads, int reps) {
  DecodeFloorFigures f;
  f.model_bytes = state.total_bytes();
  f.threads = threads;
  if (old.size() != changes.size()) return Status::Internal("bench floor: old values do not match the changes");
  // What a decode must read: the bf16 tensors with changes (the others it
  // never walks), in pieces of 1 Mi elements so that N threads share the
  // embedding. Their blocks and words with a change.
  constexpr uint64_t kPiece = uint64_t{1} << 20;
  std::vector<Piece> pieces;
  uint64_t blocks = 0, hit_blocks = 0, words = 0, hit_words = 0;
  for (size_t i = 0; i < changes.size(); ++i) {
    const TensorChanges& c = changes[i];
    f.changed += c.count();
    WeightState::Tensor* t = state.FindMutable(c.name);
    if (t == nullptr || old[i].name != c.name || old[i].indices != c.indices) {
      return Status::Internal("bench floor: the old values of '" + c.name + "' do not match its changes");
    }
    if (t->dtype != DType::kBF16 || c.count() == 0) continue;
    const uint64_t n = t->num_elements();
    blocks += (n + 1023) / 1024;
    words += (n + 63) / 64;
    uint64_t last_block = ~uint64_t{0}, last_word = ~uint64_t{0};
    for (uint64_t x : c.indices) {
      hit_blocks += (x >> 10) != last_block;
      hit_words += (x >> 6) != last_word;
      last_block = x >> 10;
      last_word = x >> 6;
    }
    f.read_bytes += t->data.size();
    size_t k = 0;
    for (uint64_t at = 0; at < n; at += kPiece) {
      const uint64_t e = std::min(n, at + kPiece);
      size_t k_end = k;
      while (k_end < c.count() && c.indices[k_end] < e) ++k_end;
      // The state's own values (`old`): the state is left as it was, and
      // the stores cost what storing the new values costs.
      pieces.push_back({t->data.data() + 2 * at, at, e - at, c.indices.data() + k, old[i].values.data() + 2 * k, k_end - k});
      k = k_end;
    }
  }
  f.blocks_with_change = blocks ? static_cast<double>(hit_blocks) / static_cast<double>(blocks) : 0;
  f.words_with_change = words ? static_cast<double>(hit_words) / static_cast<double>(words) : 0;
  std::atomic<uint64_t> sink{0};
  auto sum = [](const Piece& p) { return ReadFold(p.data, 2 * p.elements); };

  // The read, and the read with the scatter, on one thread (CPU time) and
  // on `threads` threads (wall clock, as memcpy is timed).
  OnThreads(pieces, 1, sink, sum);
  f.read_s = BestThreadSeconds(reps, [&] { OnThreads(pieces, 1, sink, sum); });
  f.read_threads_s = BestSeconds(reps, [&] { OnThreads(pieces, threads, sink, sum); });
  f.read_scatter_s = BestThreadSeconds(reps, [&] { OnThreads(pieces, 1, sink, ReadScatter); });
  f.read_scatter_threads_s = BestSeconds(reps, [&] { OnThreads(pieces, threads, sink, ReadScatter); });

  // Parse: the library's entropy decode of every stream, one thread.
  DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(delta, "bench floor delta"));
  const std::vector<TensorView> views = state.views();
  CompactParse parsed;
  Status failure = ParseCompactDelta(file, views, 1, parsed);  // warm: the buffers' pages faulted in
  DS_RETURN_IF_ERROR(failure);
  if (parsed.changes() != f.changed) {
    return Status::Internal("bench floor: the parse found " + std::to_string(parsed.changes()) + " changes, not " +
                            std::to_string(f.changed));
  }
  f.parse_s = BestThreadSeconds(reps, [&] {
    if (Status s = ParseCompactDelta(file, views, 1, parsed); !s.ok() && failure.ok()) failure = s;
  });
  DS_RETURN_IF_ERROR(failure);

  // The decode's output: a u64 index and a u16 value per change, stored in
  // order into buffers already faulted in.
  std::vector<uint64_t> out_index(f.changed);
  std::vector<uint16_t> out_value(f.changed);
  auto output = [&] {
    uint64_t* idx = out_index.data();
    uint16_t* val = out_value.data();
    const uint64_t n = f.changed;
    for (uint64_t k = 0; k < n; ++k) {
      idx[k] = 3 * k;
      val[k] = static_cast<uint16_t>(k);
    }
    if (n > 0) sink.fetch_add(idx[n / 2] + val[n / 3], std::memory_order_relaxed);
  };
  output();
  f.output_s = BestThreadSeconds(reps, output);

  // The state-hash terms: the decoder's kernel over each tensor's (index,
  // old, new), checked against the library's HashChanges. Streamed: over
  // whole tensors' arrays (12 bytes a change from memory, which no decoder
  // reads back: it hashes each chunk's changes right after decoding them).
  StateHash hashed;
  auto hash = [&] {
    StateHash sum;
    for (size_t i = 0; i < changes.size(); ++i) {
      const TensorChanges& c = changes[i];
      const WeightState::Tensor* t = state.Find(c.name);
      if (DTypeSize(c.dtype) != 2) continue;
      Result<StateHash> h = HashChanges16(c.name, c.dtype, t->shape, c.indices, old[i].values, c.values);
      if (!h.ok()) return void(failure = h.status());
      sum += *h;
    }
    hashed = sum;
  };
  f.hash_streamed_s = BestThreadSeconds(reps, hash);
  DS_RETURN_IF_ERROR(failure);
  // In cache: each slice of changes copied (untimed) into small reused
  // buffers, as a decoder's chunk is in cache when it hashes it, and only
  // the hash of each slice timed.
  StateHash sliced;
  f.hash_s = 1e30;
  for (int r = 0; r < reps; ++r) {
    DS_ASSIGN_OR_RETURN(const SlicedHash h, HashInSlices(state, changes, old));
    f.hash_s = std::min(f.hash_s, h.seconds);
    sliced = h.sum;
  }
  if (sliced != hashed) return Status::Internal("bench floor: the hash in cache-sized slices differs from the whole one");
  std::vector<TensorChanges> wide;  // any changes of tensors not 2 bytes wide (none in the bench's models)
  for (const TensorChanges& c : changes) {
    if (DTypeSize(c.dtype) != 2) wide.push_back(c);
  }
  if (hashed + HashChanges(state, wide, 1) != HashChanges(state, changes, threads)) {
    return Status::Internal("bench floor: HashChanges16 differs from HashChanges");
  }

  // The scatter: one u16 store per change at its index. It stores the
  // state's own values (`old`), so the state is left as it was; the memory
  // traffic is that of storing the new ones.
  std::vector<uint8_t*> targets;
  for (const TensorChanges& c : changes) targets.push_back(state.FindMutable(c.name)->data.data());
  auto scatter = [&] {
    for (size_t i = 0; i < old.size(); ++i) {
      const TensorChanges& c = old[i];
      const size_t esize = DTypeSize(c.dtype);
      uint8_t* data = targets[i];
      const uint64_t* idx = c.indices.data();
      const uint8_t* v = c.values.data();
      if (esize == 2) {
        for (size_t k = 0; k < c.indices.size(); ++k) std::memcpy(data + 2 * idx[k], v + 2 * k, 2);
      } else {
        for (size_t k = 0; k < c.indices.size(); ++k) std::memcpy(data + esize * idx[k], v + esize * k, esize);
      }
    }
  };
  f.scatter_s = BestThreadSeconds(reps, scatter);

  // The library's decode on one thread, on the same clock as the stages,
  // into outputs reused across the reps (as the detect's figure reuses its
  // outputs: no fresh pages faulted in per decode).
  CompactDelta decoded;
  f.decode_s = BestThreadSeconds(reps, [&] {
    if (Status s = DecodeCompactDelta(file, views, base_hash, 1, decoded); !s.ok() && failure.ok()) failure = s;
  });

  // The object's digest, as the replica checks it before applying.
  DS_RETURN_IF_ERROR(failure);
  f.digest_s = BestThreadSeconds(reps, [&] {
    const std::string d = Xxh3Hex(delta.bytes());
    sink.fetch_add(static_cast<uint64_t>(d[0]), std::memory_order_relaxed);
  });
  // The sums are used, so no stage can be optimised away.
  if (sink.load() == 0x5EED5EED5EED5EEDull) std::fputs("", stderr);
  return f;
}

void PrintDecodeFloor(const DecodeFloorFigures& f, double memcpy_s, double apply_s) {
  const double gb = static_cast<double>(f.model_bytes) / 1e9;
  const double per_change = 1e9 / static_cast<double>(std::max<uint64_t>(1, f.changed));
  std::printf("compact decode/apply floor, the same delta's stages each alone (1 thread, CPU time, unless said; "
              "%.1f%% of 1024-blocks, %.1f%% of 64-words hold a change):\n",
              100 * f.blocks_with_change, 100 * f.words_with_change);
  for (const auto& [name, s] : {std::pair{"read (word sum of the changed bf16 tensors)", f.read_s},
                                std::pair{"  the same, bench threads (wall)", f.read_threads_s},
                                std::pair{"parse (ParseCompactDelta)", f.parse_s},
                                std::pair{"output (u64 index + u16 value stores)", f.output_s},
                                std::pair{"hash terms (HashChanges16, in cache)", f.hash_s},
                                std::pair{"  the same streamed from memory (not in floor)", f.hash_streamed_s},
                                std::pair{"scatter alone (u16 stores at the indices)", f.scatter_s},
                                std::pair{"read + scatter, per block in cache", f.read_scatter_s},
                                std::pair{"  the same, bench threads (wall)", f.read_scatter_threads_s},
                                std::pair{"digest (XXH3 of the delta)", f.digest_s},
                                std::pair{"the library's decode (1 thread)", f.decode_s}}) {
    std::printf("  %-46s %7.2f ns/change %7.4f s/GB of model\n", name, s * per_change, s / gb);
  }
  std::printf("  decode floor (read + parse + output, 1 core): %.2f GB/s per core; the decode (%.2f GB/s per core, "
              "CPU time) runs at %.2f of it\n",
              gb / f.DecodeSeconds(), gb / f.decode_s, f.DecodeSeconds() / f.decode_s);
  std::printf("  apply floor (%d-thread read + scatter, + (digest + parse + hash) / %d): %.2f GB/s = %.2f x memcpy; "
              "the apply runs at %.2f of it\n",
              f.threads, f.threads, gb / f.ApplySeconds(), memcpy_s / f.ApplySeconds(), f.ApplySeconds() / apply_s);
}

}  // namespace deltasync::cli
