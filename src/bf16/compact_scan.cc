// CompactScan: chunks over threads, per-worker stream buffers, and the
// assembly of each tensor's class streams from its chunks. The per-element
// work is in compact_scan_kernels.cc.

#include "bf16/compact_scan.h"
#include "codec/compact_v3.h"

#include <algorithm>
#include <cstring>

#include "bf16/hash_term.h"
#include "bf16/scan.h"
#include "common/parallel.h"

namespace deltasync::bf16 {

using compact::kClasses;

namespace {

// Elements per kernel call: before each, every output of the worker gets
// room for this many more entries.
constexpr uint64_t kSpan = uint64_t{1} << 16;

// A typed view of a ScratchBuffer holding `used` entries of T.
template <typename T>
struct Stream {
  ScratchBuffer buffer;
  size_t used = 0;
  bool Reserve(size_t more) { return buffer.Reserve((used + more) * sizeof(T)); }
  T* at(size_t i) { return reinterpret_cast<T*>(buffer.data()) + i; }
  const T* at(size_t i) const { return reinterpret_cast<const T*>(buffer.data()) + i; }
};

}  // namespace

struct CompactScan::Worker {
  std::array<Stream<uint32_t>, kClasses> gaps;
  std::array<Stream<uint8_t>, kClasses> diffs;
  std::array<Stream<uint16_t>, kClasses> escapes;
  Stream<uint16_t> old_values;
  // The diff bytes this worker's chunks produced, per class: counted after
  // each span while they are in cache, so that version 3's tables need no
  // serial pass over every change afterwards. Four tables taken in turn: a
  // class's diff bytes are mostly a few values (one-ULP steps), and one table
  // would chain each count's increment on the last one's store.
  std::array<compact::DiffHistogram, 4> diff_counts{};

  void Clear() {
    for (int c = 0; c < kClasses; ++c) gaps[c].used = diffs[c].used = escapes[c].used = 0;
    old_values.used = 0;
    for (auto& table : diff_counts) {
      for (auto& row : table) row.fill(0);
    }
  }
};

struct CompactScan::ChunkResult {
  size_t worker = 0;
  uint64_t words_offset = 0;  // first bitmap word in words_
  uint64_t applied = 0;       // elements from the chunk's start scanned and applied
  kernels::CompactScanState state;
  // Where this chunk's entries start in its worker's streams.
  std::array<size_t, kClasses> gap_offset{}, escape_offset{};
  size_t old_offset = 0;
  uint64_t first_bad = kNoError;
  bool out_of_memory = false;
  bool failed() const { return first_bad != kNoError || out_of_memory; }
};

CompactScan::CompactScan() = default;
CompactScan::~CompactScan() = default;

const std::string& CompactScan::name(size_t i) const { return names_[tensors_[i].job]; }
uint64_t CompactScan::changed(size_t i) const { return tensors_[i].changed; }

Status CompactScan::Run(WeightState& published, std::span<const TensorView> current, const DetectOptions& options,
                        uint64_t chunk_elements) {
  chunk_elements = std::clamp<uint64_t>(chunk_elements, 1, uint64_t{1} << 31);
  // Nothing of the last Run survives a failure here (Undo then undoes nothing).
  tensors_.clear();
  other_.clear();
  chunks_.clear();
  results_.clear();
  bf16_changed_ = 0;
  hash_delta_ = StateHash{};
  DS_ASSIGN_OR_RETURN(std::vector<ScanJob> jobs, PlanDetect(published, current, options));

  // Other dtypes the plain way, first: they change nothing, so an error there
  // needs no undo.
  std::vector<ScanJob> others;
  std::vector<uint64_t> counts(jobs.size(), 0);
  names_.assign(jobs.size(), std::string());
  data_.assign(jobs.size(), nullptr);
  std::vector<WeightState::Tensor>& tensors = published.mutable_tensors();
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (jobs[j].published_dtype != DType::kBF16) {
      others.push_back(jobs[j]);
      continue;
    }
    counts[j] = jobs[j].elements;
    names_[j] = std::string(jobs[j].name);
    data_[j] = reinterpret_cast<uint16_t*>(tensors[j].data.data());  // PlanDetect: job j is tensor j
  }
  if (!others.empty()) {
    DS_ASSIGN_OR_RETURN(other_, DetectJobs(others, options, chunk_elements));
  }

  chunks_ = SplitIntoChunks(counts, chunk_elements);
  results_.assign(chunks_.size(), ChunkResult{});
  uint64_t words = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    results_[c].words_offset = words;
    words += (chunks_[c].end - chunks_[c].begin + 63) / 64;
  }
  if (!words_.Reserve(words * sizeof(uint64_t))) return Status::Internal("out of memory for the changed-element bitmap");
  auto* bitmap = reinterpret_cast<uint64_t*>(words_.data());
  const size_t n_workers = std::min<size_t>(static_cast<size_t>(ResolveThreads(options.threads)),
                                            std::max<size_t>(1, chunks_.size()));
  while (workers_.size() < n_workers) workers_.push_back(std::make_unique<Worker>());
  for (auto& w : workers_) w->Clear();
  std::vector<state_hash::TensorSeeds> seeds(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (data_[j] == nullptr) continue;
    const bool framed = j < frames_.size() && !frames_[j].full_shape.empty();
    seeds[j] = state_hash::SeedsFor(tensors[j].name, tensors[j].dtype, framed ? frames_[j].full_shape : tensors[j].shape);
  }

  RunChunks(chunks_.size(), options.threads, [&](size_t worker, size_t c) {
    const Chunk& chunk = chunks_[c];
    const ScanJob& job = jobs[chunk.tensor];
    Worker& w = *workers_[worker];
    ChunkResult& r = results_[c];
    r.worker = worker;
    for (int k = 0; k < kClasses; ++k) {
      r.gap_offset[k] = w.gaps[k].used;
      r.escape_offset[k] = w.escapes[k].used;
    }
    r.old_offset = w.old_values.used;
    const size_t in_size = DTypeSize(job.current_dtype);
    for (uint64_t begin = chunk.begin; begin < chunk.end; begin += kSpan) {
      const size_t n = static_cast<size_t>(std::min(kSpan, chunk.end - begin));
      bool ok = w.old_values.Reserve(n + kernels::kScanOldSlack);
      for (int k = 0; k < kClasses && ok; ++k) {
        ok = w.gaps[k].Reserve(n) && w.diffs[k].Reserve(n) && w.escapes[k].Reserve(n);
      }
      if (!ok) {
        r.out_of_memory = true;
        break;
      }
      kernels::CompactScanSpan span;
      span.published = data_[chunk.tensor] + begin;
      span.current = job.current + begin * in_size;
      span.f32 = job.f32_to_bf16();
      span.check_finite = job.exp_mask != 0;
      span.n = n;
      span.index0 = begin + (chunk.tensor < frames_.size() ? frames_[chunk.tensor].index0 : 0);
      span.seed = seeds[chunk.tensor].element_seed;
      // The kernel appends at the chunk's counts (r.state), so each output
      // starts where the chunk's entries start.
      for (int k = 0; k < kClasses; ++k) {
        span.gaps[k] = w.gaps[k].at(r.gap_offset[k]);
        span.diffs[k] = w.diffs[k].at(r.gap_offset[k]);
        span.escapes[k] = w.escapes[k].at(r.escape_offset[k]);
      }
      span.old_values = w.old_values.at(r.old_offset);
      span.changed_words = bitmap + r.words_offset + (begin - chunk.begin) / 64;
      const kernels::CompactScanState before = r.state;
      const size_t done = kernels::ScanCompactSpan(span, r.state);
      for (int k = 0; k < kClasses; ++k) {
        const uint64_t added = r.state.changes[k] - before.changes[k];
        const uint8_t* d = w.diffs[k].at(r.gap_offset[k] + before.changes[k]);
        uint64_t e = 0;
        for (; e + 4 <= added; e += 4) {
          w.diff_counts[0][k][d[e]]++;
          w.diff_counts[1][k][d[e + 1]]++;
          w.diff_counts[2][k][d[e + 2]]++;
          w.diff_counts[3][k][d[e + 3]]++;
        }
        for (; e < added; ++e) w.diff_counts[0][k][d[e]]++;
        w.gaps[k].used += added;
        w.diffs[k].used += added;
        w.escapes[k].used += r.state.escapes[k] - before.escapes[k];
      }
      w.old_values.used += r.state.old_values - before.old_values;
      // The kernel stops at whole blocks: the one with the bad value is untouched.
      r.applied = begin - chunk.begin +
                  (done == n ? n : done / kernels::kScanBlockElements * kernels::kScanBlockElements);
      if (done < n) {
        r.first_bad = begin + done;
        break;
      }
    }
    return !r.failed();
  });

  for (size_t c = 0; c < chunks_.size(); ++c) {
    const ScanJob& job = jobs[chunks_[c].tensor];
    if (results_[c].first_bad != kNoError) {
      Undo(options.threads);
      return NonFiniteError(job, results_[c].first_bad);
    }
    if (results_[c].out_of_memory) {
      Undo(options.threads);
      return Status::Internal(Quoted(job.name) + ": out of memory while collecting changes");
    }
  }

  for (size_t c = 0; c < chunks_.size();) {
    TensorRange t{chunks_[c].tensor, c, c, 0};
    for (; t.end_chunk < chunks_.size() && chunks_[t.end_chunk].tensor == t.job; ++t.end_chunk) {
      const ChunkResult& r = results_[t.end_chunk];
      for (int k = 0; k < kClasses; ++k) t.changed += r.state.changes[k];
      hash_delta_ += StateHash{r.state.hash[0], r.state.hash[1]};
    }
    c = t.end_chunk;
    bf16_changed_ += t.changed;
    if (t.changed > 0) tensors_.push_back(t);
  }
  return Status::OK();
}

// One class's gaps of one tensor, chunk after chunk. A chunk's first gap of
// the class counts from the chunk's start; the class elements after the
// previous change in earlier chunks are added to it.
class CompactScan::Gaps final : public compact::GapSource {
 public:
  Gaps(const CompactScan& scan, const TensorRange& t, int cl) : scan_(scan), t_(t), cl_(cl), chunk_(t.first_chunk) {}

  // The state in locals while it runs: through the members, each store to
  // out[] (u64, like pos_) may alias them, and the widening copy became a
  // scalar loop reloading pos_ for every gap.
  size_t Next(uint64_t* out, size_t max) override {
    size_t n = 0;
    size_t chunk = chunk_;
    uint64_t pos = pos_, carry = carry_;
    while (n < max && chunk < t_.end_chunk) {
      const ChunkResult& r = scan_.results_[chunk];
      const uint64_t count = r.state.changes[cl_];
      if (pos == count) {
        // Done with this chunk: carry its class elements after its last change.
        carry += r.state.seen[cl_] - r.state.next[cl_];
        ++chunk;
        pos = 0;
        continue;
      }
      const uint32_t* g = scan_.workers_[r.worker]->gaps[cl_].at(r.gap_offset[cl_]);
      if (pos == 0) {
        out[n++] = carry + g[0];
        carry = 0;
        pos = 1;
      }
      const size_t take = static_cast<size_t>(std::min<uint64_t>(max - n, count - pos));
      const uint32_t* from = g + pos;
      uint64_t* to = out + n;
      for (size_t k = 0; k < take; ++k) to[k] = from[k];
      n += take;
      pos += take;
    }
    chunk_ = chunk;
    pos_ = pos;
    carry_ = carry;
    return n;
  }

 private:
  const CompactScan& scan_;
  const TensorRange& t_;
  const int cl_;
  size_t chunk_;
  uint64_t pos_ = 0;    // next gap within the chunk's segment
  uint64_t carry_ = 0;  // class elements since the last change, from earlier chunks
};

void CompactScan::CountAllDiffs(compact::DiffHistogram& h) const {
  for (const auto& w : workers_) {
    for (int cl = 0; cl < kClasses; ++cl) {
      for (int d = 0; d < 256; ++d) {
        for (const compact::DiffHistogram& table : w->diff_counts) h[cl][d] += table[cl][d];
      }
    }
  }
}

void CompactScan::WriteStream(size_t i, std::vector<uint8_t>& out, const compact::V3Tables* tables) const {
  const TensorRange& t = tensors_[i];
  compact::Bf16Streams streams;
  std::vector<Gaps> sources;
  sources.reserve(kClasses);
  for (int cl = 0; cl < kClasses; ++cl) {
    streams.gaps[cl] = &sources.emplace_back(*this, t, cl);
    for (size_t c = t.first_chunk; c < t.end_chunk; ++c) {
      const ChunkResult& r = results_[c];
      const Worker& w = *workers_[r.worker];
      const uint64_t m = r.state.changes[cl];
      streams.counts[cl] += m;
      if (m > 0) streams.diffs[cl].push_back(ByteSpan(w.diffs[cl].at(r.gap_offset[cl]), m));
    }
  }
  for (int cl = 0; cl < kClasses; ++cl) {
    for (size_t c = t.first_chunk; c < t.end_chunk; ++c) {
      const ChunkResult& r = results_[c];
      const uint64_t e = r.state.escapes[cl];
      if (e > 0) {
        const auto* p = reinterpret_cast<const uint8_t*>(workers_[r.worker]->escapes[cl].at(r.escape_offset[cl]));
        streams.escapes.push_back(ByteSpan(p, 2 * e));
      }
    }
  }
  if (tables) {
    compact::WriteBf16StreamV3(streams, *tables, out);
  } else {
    compact::WriteBf16Stream(streams, out);
  }
}

std::vector<TensorChanges> CompactScan::AppliedChanges() const {
  const auto* bitmap = reinterpret_cast<const uint64_t*>(words_.data());
  std::vector<TensorChanges> out;
  for (const TensorRange& t : tensors_) {
    TensorChanges& c = out.emplace_back();
    c.name = names_[t.job];
    c.dtype = DType::kBF16;
    c.indices.reserve(t.changed);
    c.values.reserve(2 * t.changed);
    const uint16_t* data = data_[t.job];
    for (size_t k = t.first_chunk; k < t.end_chunk; ++k) {
      const ChunkResult& r = results_[k];
      const uint64_t* words = bitmap + r.words_offset;
      for (uint64_t w = 0; w < (r.applied + 63) / 64; ++w) {
        for (uint64_t bits = words[w]; bits != 0; bits &= bits - 1) {
          const uint64_t i = chunks_[k].begin + 64 * w + static_cast<uint64_t>(__builtin_ctzll(bits));
          c.indices.push_back(i);
          c.values.push_back(static_cast<uint8_t>(data[i]));
          c.values.push_back(static_cast<uint8_t>(data[i] >> 8));
        }
      }
    }
  }
  return out;
}

void CompactScan::ChangesOf(size_t i, std::vector<uint64_t>& indices, std::vector<uint8_t>& old_values,
                            std::vector<uint8_t>& new_values) const {
  const auto* bitmap = reinterpret_cast<const uint64_t*>(words_.data());
  const TensorRange& t = tensors_[i];
  indices.clear();
  old_values.clear();
  new_values.clear();
  indices.reserve(t.changed);
  old_values.reserve(2 * t.changed);
  new_values.reserve(2 * t.changed);
  const uint16_t* data = data_[t.job];
  for (size_t k = t.first_chunk; k < t.end_chunk; ++k) {
    const ChunkResult& r = results_[k];
    const uint16_t* old = workers_[r.worker]->old_values.at(r.old_offset);
    const uint64_t* words = bitmap + r.words_offset;
    for (uint64_t w = 0; w < (r.applied + 63) / 64; ++w) {
      for (uint64_t bits = words[w]; bits != 0; bits &= bits - 1) {
        const uint64_t e = chunks_[k].begin + 64 * w + static_cast<uint64_t>(__builtin_ctzll(bits));
        indices.push_back(e);
        const uint16_t o = *old++;
        old_values.push_back(static_cast<uint8_t>(o));
        old_values.push_back(static_cast<uint8_t>(o >> 8));
        new_values.push_back(static_cast<uint8_t>(data[e]));
        new_values.push_back(static_cast<uint8_t>(data[e] >> 8));
      }
    }
  }
}

void CompactScan::Undo(int threads) const {
  const auto* bitmap = reinterpret_cast<const uint64_t*>(words_.data());
  ParallelFor(results_.size(), threads, [&](size_t c) {
    const ChunkResult& r = results_[c];
    if (r.applied == 0) return;
    const uint16_t* old = workers_[r.worker]->old_values.at(r.old_offset);
    uint16_t* data = data_[chunks_[c].tensor] + chunks_[c].begin;
    const uint64_t* words = bitmap + r.words_offset;
    for (uint64_t w = 0; w < (r.applied + 63) / 64; ++w) {
      for (uint64_t bits = words[w]; bits != 0; bits &= bits - 1) {
        data[64 * w + static_cast<uint64_t>(__builtin_ctzll(bits))] = *old++;
      }
    }
  });
}

}  // namespace deltasync::bf16
