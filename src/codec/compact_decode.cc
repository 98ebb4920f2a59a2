// The compact delta decoder (docs/format.md, "Compact objects" and
// "Decoding in parallel inside a tensor"; the encoder is compact_delta.cc):
// the metadata checks, then per tensor (tensors in parallel) its streams,
// version 2 or 3, read whole (compact_read.cc: they are O(changes)) with
// each class's gaps turned into ranks (a change's position among the
// tensor's elements of its class); then the positions rebuilt from the base
// in chunks, all chunks of all tensors in parallel, so one large tensor (the
// embedding) uses every thread (compact_walk.h); a fused apply's undo log
// and class totals (kept past the apply, and put back: compact_undo.cc).
// Every step is exact, so the result is the same for any thread count and
// chunk size (tests/codec/compact_decode_test.cc).
#include <algorithm>
#include <array>
#include <cstring>
#include <optional>

#include "codec/compact_bf16.h"
#include "codec/compact_container.h"
#include "codec/compact_read.h"
#include "codec/compact_undo.h"
#include "codec/compact_v3.h"
#include "codec/compact_walk.h"
#include "codec/patch_metadata.h"
#include "common/pages.h"  // SizeUninit, PrepareFreshPages
#include "common/parallel.h"
#include "deltasync/compact.h"

namespace deltasync {
namespace {

namespace pm = patchmeta;
using compact::kClasses;
using compact::Bf16Tensor;
using compact::Chunk;
using compact::ChunkWalker;

// Below this many stream bytes (or base elements to walk) in total, work
// stays on one thread.
constexpr uint64_t kParallelMin = uint64_t{1} << 16;
constexpr uint64_t kParallelWalkMin = uint64_t{1} << 20;

// The per-tensor parse state of one decode, from buffers the calling thread
// keeps across decodes (the replica decodes version after version on one
// thread): fresh zero-filled vectors per tensor per version would cost page
// faults. Each is reset to a fresh Bf16Tensor keeping only its vectors'
// capacity. Holds about the largest delta's O(changes) parse bytes per thread.
std::span<Bf16Tensor> TakeParseBuffers(size_t n) {
  thread_local std::vector<Bf16Tensor> pool;
  if (pool.size() < n) pool.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Bf16Tensor fresh;
    fresh.ranks.swap(pool[i].ranks);
    fresh.diffs.swap(pool[i].diffs);
    fresh.escapes.swap(pool[i].escapes);
    fresh.escaped.swap(pool[i].escaped);
    fresh.escaped.clear();
    pool[i] = std::move(fresh);
  }
  return std::span<Bf16Tensor>(pool.data(), n);
}

std::string Show(std::string_view v) {
  std::string out;
  for (char ch : v.substr(0, 40)) out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  return "'" + out + (v.size() > 40 ? "...'" : "'");
}

}  // namespace

namespace compact {
namespace {

// A fused apply's destination: writable[i] holds base[i]'s bytes.
struct Fused {
  std::span<uint8_t* const> writable;
  CompactUndo* undo;
};

// DecodeCompactDeltaChunked into `out` (entry k of out.changes reused:
// ReadTensor sizes it), or with `fused` ApplyCompactDeltaChunked.
Status DecodeOrApply(const SafetensorsFile& file, std::span<const TensorView> base, const StateHash& base_hash,
                     int threads, uint64_t chunk_elements, const Fused* fused, CompactDelta& out) {
  if (chunk_elements == 0) return Status::InvalidArgument("chunk_elements must be at least 1");
  // The undo log's positions are 4 bytes from a chunk's start
  // (CompactUndo::Run::pos32): no chunk is longer than 2^32 elements (any
  // split decodes the same).
  chunk_elements = std::min<uint64_t>(chunk_elements, uint64_t{1} << 32);
  const std::string& label = file.label();
  auto bad = [&](const std::string& msg) { return Status::Corruption(label + ": " + msg); };
  const Metadata& m = file.metadata();
  auto get = [&](std::string_view key) -> const std::string* {
    auto it = m.find(std::string(key));
    return it == m.end() ? nullptr : &it->second;
  };
  auto expect = [&](std::string_view key, std::string_view want) -> Status {
    const std::string* v = get(key);
    if (!v) return bad("__metadata__ lacks '" + std::string(key) + "'");
    if (*v != want) return bad("__metadata__ '" + std::string(key) + "' is " + Show(*v) + ", expected '" + std::string(want) + "'");
    return Status::OK();
  };
  auto integer = [&](std::string_view key) -> Result<uint64_t> {
    const std::string* v = get(key);
    if (!v) return bad("__metadata__ lacks '" + std::string(key) + "'");
    std::optional<uint64_t> x = pm::ParseDecimal(*v);
    if (!x) return bad("__metadata__ '" + std::string(key) + "' is " + Show(*v) + ", not a non-negative integer");
    return *x;
  };
  DS_RETURN_IF_ERROR(expect(pm::kFormat, pm::kFormatValue));
  DS_RETURN_IF_ERROR(expect(pm::kVersion, pm::kVersionValue));
  DS_RETURN_IF_ERROR(expect(pm::kEncoding, kCompactEncodingName));
  DS_RETURN_IF_ERROR(expect(pm::kSparse, pm::kTrue));
  out.info = PatchInfo{};
  out.base_hash = StateHash{};
  out.hash_delta = StateHash{};
  out.info.kind = PatchKind::kDelta;
  DS_ASSIGN_OR_RETURN(out.info.model_version, integer(pm::kModelVersion));
  DS_ASSIGN_OR_RETURN(uint64_t base_version, integer(pm::kBaseVersion));
  if (base_version >= out.info.model_version) {
    return bad("base version " + std::to_string(base_version) + " is not older than model_version " +
               std::to_string(out.info.model_version));
  }
  out.info.base_version = base_version;
  const std::string* hash_hex = get(kBaseStateHashKey);
  if (!hash_hex) return bad("__metadata__ lacks '" + std::string(kBaseStateHashKey) + "'");
  Result<StateHash> hash = StateHash::FromHex(*hash_hex);
  if (!hash.ok()) return bad("__metadata__ '" + std::string(kBaseStateHashKey) + "' is " + Show(*hash_hex) + ", not 32 hex digits");
  out.base_hash = *hash;
  if (!(out.base_hash == base_hash)) {
    return Status::FailedPrecondition(label + ": compact delta to version " + std::to_string(out.info.model_version) +
                                      " applies to base version " + std::to_string(base_version) + " with state hash " +
                                      out.base_hash.Hex() + ", but the given base has state hash " + base_hash.Hex());
  }
  DS_ASSIGN_OR_RETURN(out.info.total_elements, integer(pm::kTotalElements));
  DS_ASSIGN_OR_RETURN(out.info.total_changed_elements, integer(pm::kTotalChangedElements));
  DS_ASSIGN_OR_RETURN(out.info.num_changed_params, integer(pm::kNumChangedParams));
  uint64_t base_elements = 0;
  for (const TensorView& t : base) base_elements += t.num_elements();
  if (out.info.total_elements != base_elements) {
    return bad("total_elements " + std::to_string(out.info.total_elements) + " differs from the base's " +
               std::to_string(base_elements));
  }

  // The streams, in name order, each tied to its base tensor (either container).
  DS_ASSIGN_OR_RETURN(const std::vector<compact::Stream> listed, compact::ListStreams(file, base));
  if (listed.size() != out.info.num_changed_params) {
    return bad("num_changed_params " + std::to_string(out.info.num_changed_params) + " but " +
               std::to_string(listed.size()) + " streams");
  }
  std::vector<const TensorView*> streams, bases;
  uint64_t stream_bytes = 0;
  for (const compact::Stream& s : listed) {
    streams.push_back(&s.stream);
    bases.push_back(&base[s.base]);
    stream_bytes += s.stream.data.size();
  }

  // Step 1.
  out.changes.resize(streams.size());
  const std::span<Bf16Tensor> read = TakeParseBuffers(streams.size());
  std::vector<Status> errors(streams.size());
  std::optional<compact::V3Tables> tables;
  DS_RETURN_IF_ERROR(compact::ParseDeltaTables(file, tables));
  const compact::V3Tables* t = tables ? &*tables : nullptr;
  // Each bf16 stream's rank and diff buffers sized ahead of its parse from
  // the count in its header (PlausibleBf16Count; the parse sizes them again,
  // then within their capacity): their fresh memory, a process's first
  // apply's (~5 bytes a change), faulted in on the apply's threads in even
  // pieces (PrepareFreshPages) instead of a page fault per 4 KiB as the
  // parse writes it (the largest tensor's all on the one thread parsing
  // it). Neither is zero-filled (UninitVector): the parse writes every
  // slot before anything reads it (every class's ranks, every piece's diffs).
  // The same counts group the tensors of the read (ReadTensors).
  std::vector<uint64_t> counts(streams.size(), 0);
  {
    std::vector<MutableByteSpan> fresh;
    for (size_t i = 0; i < streams.size(); ++i) {
      if (std::optional<uint64_t> count = compact::PlausibleBf16Count(*streams[i], *bases[i])) {
        counts[i] = *count;
        read[i].ranks.Resize(*count, bases[i]->num_elements(), &fresh);
        SizeUninit(read[i].diffs, static_cast<size_t>(*count), &fresh);
      }
    }
    PrepareFreshPages(fresh, threads, /*huge=*/false);
  }
  ReadTensors(label, streams, bases, counts, t, fused != nullptr, stream_bytes >= kParallelMin ? threads : 1,
              out.changes, read, errors);
  for (const Status& s : errors) DS_RETURN_IF_ERROR(s);
  uint64_t changed = 0, bf16_changed = 0;
  for (size_t i = 0; i < read.size(); ++i) {
    changed += read[i].base ? read[i].count : out.changes[i].indices.size();
    if (read[i].base) bf16_changed += read[i].count;
  }
  if (changed != out.info.total_changed_elements) {
    return bad("total_changed_elements " + std::to_string(out.info.total_changed_elements) + " but the tensors hold " +
               std::to_string(changed));
  }

  // Step 2 over the chunks of the bf16 tensors with changes.
  std::vector<Bf16Tensor*> walked;
  std::vector<Chunk> chunks;
  std::vector<size_t> first_chunk;  // per walked tensor, then chunks.size()
  uint64_t walk_elements = 0;
  for (Bf16Tensor& t : read) {
    if (t.base == nullptr || t.count == 0) continue;
    const uint64_t n = t.base->num_elements();
    first_chunk.push_back(chunks.size());
    for (uint64_t begin = 0; begin < n; begin += chunk_elements) {
      const uint64_t end = std::min(n, begin + chunk_elements);
      chunks.push_back({walked.size(), begin, end, end == n});
    }
    walked.push_back(&t);
    walk_elements += n;
  }
  first_chunk.push_back(chunks.size());
  CompactUndo* undo = fused ? fused->undo : nullptr;
  if (undo) {
    // Each bf16 tensor's changes get undo slots in order, then the raw ones.
    uint64_t raw_bytes = 0;
    for (size_t i = 0; i < read.size(); ++i) {
      if (read[i].base == nullptr) raw_bytes += out.changes[i].values.size();
    }
    undo->runs.assign(chunks.size(), CompactUndo::Run{});
    // Sized without writing any entry (SizeUninit): the walk and the raw-mode
    // loop write every slot they use before anything reads it (the walk's
    // hash and class moves, Restore and PartHashChange read a run's
    // `written` entries only). A fresh allocation is faulted in ahead on the
    // apply's threads (PrepareFreshPages) instead of zero-filled on one. No
    // huge pages: with them a process's first apply ran up to ~250 ms slower
    // here (docs/benchmarks.md, session 41).
    std::vector<MutableByteSpan> fresh;
    SizeUninit(undo->pos32, bf16_changed, &fresh);
    SizeUninit(undo->old16, bf16_changed, &fresh);
    SizeUninit(undo->pos64, changed - bf16_changed, &fresh);
    SizeUninit(undo->old_raw, raw_bytes, &fresh);
    PrepareFreshPages(fresh, threads, /*huge=*/false);
    uint64_t slot = 0;
    for (Bf16Tensor* t : walked) {
      t->target = reinterpret_cast<uint16_t*>(fused->writable[static_cast<size_t>(t->base - base.data())]);
      t->undo_pos = undo->pos32.data() + slot;
      t->undo_old = undo->old16.data() + slot;
      slot += t->count;
    }
  }
  // On one thread the walker prefetches the next chunk's base while it
  // places a chunk (the counting pass then reads it from L2). On more, with
  // the look-back (a chunk waits for the class totals of the chunk before
  // it), not: there one thread's counting pass already overlaps another's
  // placing, and chunk k + threads (the likely next one) may go to another
  // core; session 32's two-thread runs showed no gain, session 36's chunks
  // handed out one ahead made the look-back wait (docs/benchmarks.md). With
  // class totals held for every walked tensor of more than one chunk (a
  // fused apply to the state a CompactUndo last applied to or from:
  // CompactClassTotals) no chunk waits: chunks go out one ahead
  // (ParallelForAhead) and each thread prefetches the one it walks next.
  const int walk_threads = walk_elements >= kParallelWalkMin ? threads : 1;
  const size_t walkers = std::min<size_t>(static_cast<size_t>(ResolveThreads(walk_threads)), chunks.size());
  CompactClassTotals* const totals = undo ? &undo->totals : nullptr;
  CompactClassTotals::State* held = totals ? totals->Find(base_hash, chunk_elements) : nullptr;
  if (held && held->tensors.size() != base.size()) held = nullptr;
  std::vector<uint8_t> tensor_held(walked.size(), 0);
  std::optional<ChunkWalker> walker;
  KeptTotals kept;
  while (true) {
    walker.emplace(label, walked, chunks, undo ? undo->runs.data() : nullptr, walkers == 1 ? 1 : 0);
    // No chunk waits on a look-back where every tensor of more than one
    // chunk is held (a tensor of one chunk has none to wait for).
    bool all_held = held != nullptr && !walked.empty();
    for (size_t w = 0; w < walked.size(); ++w) {
      const Bf16Tensor& t = *walked[w];
      const CompactClassTotals::Tensor* h = held ? &held->tensors[static_cast<size_t>(t.base - base.data())] : nullptr;
      const size_t n_chunks = first_chunk[w + 1] - first_chunk[w];
      tensor_held[w] = h != nullptr && h->elements == t.base->num_elements() && h->chunks.size() == n_chunks;
      if (!tensor_held[w]) {
        if (n_chunks > 1) all_held = false;
        continue;
      }
      std::array<uint64_t, kClasses> start{};
      for (size_t j = 0; j < n_chunks; ++j) {
        walker->Hold(first_chunk[w] + j, &h->chunks[j], start);
        for (int cl = 0; cl < kClasses; ++cl) start[cl] += h->chunks[j][cl];
      }
    }
    if (totals) kept = PrepareTotals(*walker, walked, tensor_held, first_chunk, base, held, *totals);
    errors.assign(chunks.size(), Status::OK());
    if (all_held && walkers > 1) {
      ParallelForAhead(chunks.size(), walk_threads, [&](size_t k, size_t next) { errors[k] = walker->Walk(k, next); });
    } else {
      ParallelFor(chunks.size(), walk_threads, [&](size_t k) { errors[k] = walker->Walk(k); });
    }
    if (!walker->Stale()) {
      if (all_held) ++totals->held_applies;
      break;
    }
    // Held totals that the counts contradict: every value written put back,
    // the totals forgotten (Restore), the walk redone with the look-back.
    undo->Restore(threads);
    ++totals->stale;
    held = nullptr;
    undo->runs.assign(chunks.size(), CompactUndo::Run{});
  }
  for (const Status& s : errors) {
    if (!s.ok() && undo) undo->Restore(threads);
    DS_RETURN_IF_ERROR(s);
  }
  // Raw-mode tensors (few, small) hash their changes the usual way.
  std::vector<TensorChanges> raw;
  std::vector<size_t> raw_index;
  for (size_t i = 0; i < read.size(); ++i) {
    if (read[i].base == nullptr && !out.changes[i].indices.empty()) {
      raw.push_back(out.changes[i]);
      raw_index.push_back(i);
    }
  }
  out.hash_delta = walker->HashDelta() + HashChanges(base, raw, threads);
  if (undo) {
    // Hashed against the base above; now written, their old bytes logged.
    uint64_t slot = 0, byte = 0;
    for (size_t r = 0; r < raw.size(); ++r) {
      const TensorChanges& c = raw[r];
      const size_t esize = DTypeSize(c.dtype);
      uint8_t* data = fused->writable[static_cast<size_t>(bases[raw_index[r]] - base.data())];
      CompactUndo::Run run{data, esize, 0, nullptr, undo->pos64.data() + slot, undo->old_raw.data() + byte,
                           c.indices.size()};
      for (size_t k = 0; k < c.indices.size(); ++k) {
        undo->pos64[slot + k] = c.indices[k];
        std::memcpy(undo->old_raw.data() + byte + k * esize, data + c.indices[k] * esize, esize);
        std::memcpy(data + c.indices[k] * esize, c.values.data() + k * esize, esize);
      }
      undo->runs.push_back(run);
      slot += c.indices.size();
      byte += c.values.size();
    }
    out.changes.clear();
    KeepTotals(kept, base_hash, base_hash + out.hash_delta, chunk_elements);
  }
  return Status::OK();
}

Result<CompactDelta> ApplyFused(const SafetensorsFile& file, std::span<const TensorView> base,
                                const StateHash& base_hash, int threads, uint64_t chunk_elements, const Fused& fused) {
  CompactDelta out;
  Status s = DecodeOrApply(file, base, base_hash, threads, chunk_elements, &fused, out);
  if (!s.ok()) {
    fused.undo->totals.Invalidate();
    return s;
  }
  return out;
}

}  // namespace

Status DecodeCompactDeltaChunked(const SafetensorsFile& file, std::span<const TensorView> base,
                                 const StateHash& base_hash, int threads, uint64_t chunk_elements, CompactDelta& out) {
  Status s = DecodeOrApply(file, base, base_hash, threads, chunk_elements, nullptr, out);
  if (!s.ok()) out = CompactDelta{};
  return s;
}

Result<CompactDelta> DecodeCompactDeltaChunked(const SafetensorsFile& file, std::span<const TensorView> base,
                                               const StateHash& base_hash, int threads, uint64_t chunk_elements) {
  CompactDelta out;
  DS_RETURN_IF_ERROR(DecodeOrApply(file, base, base_hash, threads, chunk_elements, nullptr, out));
  return out;
}

Result<CompactDelta> ApplyCompactDeltaChunked(const SafetensorsFile& file, WeightState& state,
                                              const StateHash& base_hash, int threads, uint64_t chunk_elements,
                                              CompactUndo& undo) {
  undo.runs.clear();
  const std::vector<TensorView> views = state.views();
  std::vector<uint8_t*> writable;
  for (WeightState::Tensor& t : state.mutable_tensors()) writable.push_back(t.data.data());
  const Fused fused{writable, &undo};
  return ApplyFused(file, views, base_hash, threads, chunk_elements, fused);
}

uint64_t DecodeChunkElements() {
  static const uint64_t chunk = CpuIsIntel() ? kDecodeChunkLarge : kDecodeChunkSmall;
  return chunk;
}

Result<CompactDelta> ApplyCompactDeltaToViews(const SafetensorsFile& file, std::span<const TensorView> base,
                                              std::span<uint8_t* const> writable, const StateHash& base_hash,
                                              int threads, CompactUndo& undo) {
  undo.runs.clear();
  const Fused fused{writable, &undo};
  return ApplyFused(file, base, base_hash, threads, DecodeChunkElements(), fused);
}

}  // namespace compact

Result<CompactDelta> DecodeCompactDelta(const SafetensorsFile& file, std::span<const TensorView> base,
                                        const StateHash& base_hash, int threads) {
  return compact::DecodeCompactDeltaChunked(file, base, base_hash, threads, compact::DecodeChunkElements());
}

Status DecodeCompactDelta(const SafetensorsFile& file, std::span<const TensorView> base, const StateHash& base_hash,
                          int threads, CompactDelta& out) {
  return compact::DecodeCompactDeltaChunked(file, base, base_hash, threads, compact::DecodeChunkElements(), out);
}

Result<CompactDelta> ApplyCompactDelta(const SafetensorsFile& file, WeightState& state, const StateHash& base_hash,
                                       int threads, CompactUndo& undo) {
  return compact::ApplyCompactDeltaChunked(file, state, base_hash, threads, compact::DecodeChunkElements(), undo);
}

Result<CompactDelta> DecodeCompactDelta(const SafetensorsFile& file, const WeightState& base,
                                        const StateHash& base_hash, int threads) {
  const std::vector<TensorView> views = base.views();
  return DecodeCompactDelta(file, views, base_hash, threads);
}

}  // namespace deltasync
