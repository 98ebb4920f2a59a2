// DetectChanges: validation, chunking over threads, and assembling the
// per-chunk results. The per-element work is in detect_kernels.cc.

#include <bit>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bf16/chunked.h"
#include "bf16/chunks.h"
#include "bf16/detect_apply.h"
#include "bf16/in_order.h"
#include "bf16/scan.h"
#include "bf16/scratch.h"
#include "bf16/simd_kernels.h"
#include "common/parallel.h"
#include "deltasync/changes.h"

namespace deltasync::bf16 {
namespace {

static_assert(std::endian::native == std::endian::little,
              "tensor bytes are little-endian and compared in place");

// Each chunk is scanned into a scratch of its own. As soon as the chunk and
// every chunk before it are scanned, its changes are copied into its
// tensor's output (InOrder, Assembler) and its scratch goes back for the
// next chunk (Slots): the scratch is still in cache when it is copied and
// when it is written again, and a call uses a scratch or two per thread.
struct WorkerScratch {
  ScratchBuffer indices;  // uint64_t entries
  ScratchBuffer values;   // the entries' values, back to back
  ScratchBuffer old;      // with an in-scan apply: the old values, laid out as `values`
};

// Worker scratch outlives a call: fresh pages (a fault and a kernel
// zero-fill per page) cost more than the scan itself, and every call of a
// training loop needs about as much as the last. So the buffers go back to
// this pool, which therefore holds as much memory as the scratches a call
// has held at once so far (~10 bytes per change of a chunk each; a chunk or
// two per thread, more when a slow chunk holds back the copies of those
// after it).
// Concurrent calls each take what is free and allocate the rest.
class ScratchPool {
 public:
  std::vector<std::unique_ptr<WorkerScratch>> Take(size_t n) {
    std::vector<std::unique_ptr<WorkerScratch>> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (out.size() < n && !free_.empty()) {
        out.push_back(std::move(free_.back()));
        free_.pop_back();
      }
    }
    while (out.size() < n) out.push_back(std::make_unique<WorkerScratch>());
    return out;
  }
  void Give(std::vector<std::unique_ptr<WorkerScratch>> scratch) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : scratch) free_.push_back(std::move(w));
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<WorkerScratch>> free_;
};

ScratchPool& Pool() {
  static ScratchPool* pool = new ScratchPool;  // never destroyed: usable at exit
  return *pool;
}

// The scratches of one call: a chunk takes one for its scan and gives it
// back once its changes are in the output; the next chunk takes the one
// given back last (likely still in cache). More come from the pool when
// every one is in use.
class Slots {
 public:
  Slots() = default;
  Slots(const Slots&) = delete;
  Slots& operator=(const Slots&) = delete;
  ~Slots() { Pool().Give(std::move(all_)); }

  WorkerScratch* Take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) {
      all_.push_back(std::move(Pool().Take(1).front()));
      return all_.back().get();
    }
    WorkerScratch* s = free_.back();
    free_.pop_back();
    return s;
  }
  void Give(WorkerScratch* s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(s);
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<WorkerScratch>> all_;
  std::vector<WorkerScratch*> free_;
};

// What one chunk found.
struct ChunkResult {
  WorkerScratch* scratch = nullptr;  // its changes, from the start (nullptr: not scanned)
  size_t count = 0;
  uint64_t first_bad = kNoError;  // flat index of the first non-finite element
  bool out_of_memory = false;
  uint64_t hash[2] = {0, 0};      // with an in-scan apply: the state-hash change of its `count` changes
  bool in_output = false;         // its changes were copied into the output:
  size_t entry = 0;               // into this entry,
  size_t position = 0;            // from this change on

  bool failed() const { return first_bad != kNoError || out_of_memory; }
};

// Makes room in `v` for `needed` elements, keeping its contents: a vector
// too small moves to one of `room` (>= needed), its fresh pages advised for
// huge pages before they are touched.
template <typename T>
void Grow(std::vector<T>& v, size_t needed, size_t room) {
  if (v.capacity() >= needed) return;
  std::vector<T> grown;
  grown.reserve(room);
  AdviseHugePages(grown.data(), room * sizeof(T));
  grown.insert(grown.end(), v.begin(), v.end());
  v.swap(grown);
}

// Copies the chunks' changes, called in chunk order, into the output: entry
// k for the k-th tensor with changes. Entry k reuses the memory of the
// caller's entry k (DetectChanges into `out`): across a training loop's
// calls the same tensors change at about the same rates, so the copies land
// on pages already mapped rather than on fresh ones, each a fault and a
// kernel zero-fill. With `old` (an in-scan apply), the old values go to its
// entry k the same way.
class Assembler {
 public:
  Assembler(const std::vector<ScanJob>& jobs, const std::vector<Chunk>& chunks, std::vector<ChunkResult>& results,
            std::vector<TensorChanges>& out, std::vector<std::vector<uint8_t>>* old)
      : jobs_(jobs), chunks_(chunks), results_(results), out_(out), old_(old) {}

  // Chunk c's changes, after those of every chunk before it.
  void Append(size_t c) {
    const Chunk& chunk = chunks_[c];
    const ScanJob& job = jobs_[chunk.tensor];
    if (chunk.tensor != tensor_) {
      tensor_ = chunk.tensor;
      covered_ = 0;
      open_ = false;
    }
    covered_ += chunk.end - chunk.begin;
    ChunkResult& r = results_[c];
    if (r.count == 0) return;
    if (!open_) Open(job);
    const size_t k = entries_ - 1;
    TensorChanges& tc = out_[k];
    const size_t value_size = DTypeSize(job.published_dtype);
    const size_t needed = tc.indices.size() + r.count;
    if (tc.indices.capacity() < needed || tc.values.capacity() < needed * value_size) {
      // A fresh or reused entry too small: room for as many changes as the
      // tensor's rate so far gives, and 1/8 more, so that slowly growing
      // counts do not reallocate every call.
      const double rate = static_cast<double>(needed) / static_cast<double>(covered_);
      size_t room = needed + static_cast<size_t>(rate * static_cast<double>(job.elements - covered_));
      room = std::max(needed, std::min<size_t>(room + room / 8, job.elements));
      Grow(tc.indices, needed, room);
      Grow(tc.values, needed * value_size, room * value_size);
    }
    const WorkerScratch& w = *r.scratch;
    const uint64_t* idx = reinterpret_cast<const uint64_t*>(w.indices.data());
    const uint8_t* val = w.values.data();
    r.entry = k;
    r.position = tc.indices.size();
    r.in_output = true;
    tc.indices.insert(tc.indices.end(), idx, idx + r.count);
    tc.values.insert(tc.values.end(), val, val + r.count * value_size);
    if (old_) {
      std::vector<uint8_t>& kept = (*old_)[k];
      Grow(kept, needed * value_size, tc.values.capacity());
      const uint8_t* was = w.old.data();
      kept.insert(kept.end(), was, was + r.count * value_size);
    }
  }

  // After the last chunk: the caller's entries past those used go.
  void Close() {
    out_.resize(entries_);
    if (old_) old_->resize(entries_);
  }

 private:
  void Open(const ScanJob& job) {
    const size_t k = entries_++;
    if (out_.size() <= k) out_.resize(k + 1);
    TensorChanges& tc = out_[k];
    tc.name.assign(job.name);
    tc.dtype = job.published_dtype;
    tc.indices.clear();
    tc.values.clear();
    if (old_) {
      if (old_->size() <= k) old_->resize(k + 1);
      (*old_)[k].clear();
    }
    open_ = true;
  }

  const std::vector<ScanJob>& jobs_;
  const std::vector<Chunk>& chunks_;
  std::vector<ChunkResult>& results_;
  std::vector<TensorChanges>& out_;
  std::vector<std::vector<uint8_t>>* old_;
  size_t entries_ = 0;          // entries opened
  size_t tensor_ = SIZE_MAX;    // the tensor of the chunks appended last
  uint64_t covered_ = 0;        // its elements in those chunks
  bool open_ = false;           // whether it has an entry yet
};

// Compares elements [begin, begin + n) of a job; see kernels::Compare*.
size_t CompareSpan(const ScanJob& job, uint64_t begin, size_t n, uint64_t* idx_out,
                   uint8_t* val_out, size_t* first_bad) {
  const size_t size = DTypeSize(job.published_dtype);
  const uint8_t* pub = job.published + begin * size;
  const uint8_t* cur = job.current + begin * DTypeSize(job.current_dtype);
  *first_bad = n;
  // The kernels read through typed pointers with unaligned loads only, and
  // the outputs are malloc'd, so these casts never dereference misaligned.
  if (job.f32_to_bf16()) {
    return kernels::CompareF32ToBf16(
        reinterpret_cast<const uint16_t*>(pub), reinterpret_cast<const uint32_t*>(cur), n, begin,
        job.exp_mask != 0, idx_out, reinterpret_cast<uint16_t*>(val_out), first_bad);
  }
  switch (size) {
    case 1: return kernels::Compare8(pub, cur, n, begin, idx_out, val_out);
    case 2:
      return kernels::Compare16(reinterpret_cast<const uint16_t*>(pub),
                                reinterpret_cast<const uint16_t*>(cur), n, begin,
                                static_cast<uint16_t>(job.exp_mask), idx_out,
                                reinterpret_cast<uint16_t*>(val_out), first_bad);
    case 4:
      return kernels::Compare32(reinterpret_cast<const uint32_t*>(pub),
                                reinterpret_cast<const uint32_t*>(cur), n, begin,
                                static_cast<uint32_t>(job.exp_mask), idx_out,
                                reinterpret_cast<uint32_t*>(val_out), first_bad);
    default:
      return kernels::Compare64(reinterpret_cast<const uint64_t*>(pub),
                                reinterpret_cast<const uint64_t*>(cur), n, begin, job.exp_mask,
                                idx_out, reinterpret_cast<uint64_t*>(val_out), first_bad);
  }
}

// Scans a chunk in blocks, growing its scratch before each block
// so that the kernel can write a block's worth of changes without checks.
// With `apply` (seeds: the job's), each block's changes are applied as soon
// as they are found (ApplyBlock), while the block is in cache. The chunk's
// entries stay in the scratch even when it fails, so that the `count`
// changes it applied can be undone.
void ScanChunk(const ScanJob& job, const Chunk& chunk, WorkerScratch& scratch, ChunkResult& out,
               const state_hash::TensorSeeds* apply) {
  constexpr uint64_t kBlock = uint64_t{1} << 16;
  const size_t value_size = DTypeSize(job.published_dtype);
  for (uint64_t begin = chunk.begin; begin < chunk.end; begin += kBlock) {
    const size_t n = static_cast<size_t>(std::min(kBlock, chunk.end - begin));
    const size_t used = out.count;
    const size_t used_bytes = out.count * value_size;
    const size_t room = n + kernels::kCompareOutputSlack;
    if (!scratch.indices.Reserve((used + room) * sizeof(uint64_t)) ||
        !scratch.values.Reserve(used_bytes + room * value_size) ||
        (apply && !scratch.old.Reserve(used_bytes + room * value_size))) {
      out.out_of_memory = true;
      break;
    }
    size_t first_bad = n;
    uint64_t* const idx = reinterpret_cast<uint64_t*>(scratch.indices.data()) + used;
    const size_t added = CompareSpan(job, begin, n, idx, scratch.values.data() + used_bytes, &first_bad);
    if (first_bad < n) {
      out.first_bad = begin + first_bad;
      break;
    }
    if (apply) {
      // The published state is the caller's mutable WeightState
      // (DetectAndApply); each chunk writes only its own elements.
      ApplyBlock(const_cast<uint8_t*>(job.published), value_size, idx, scratch.values.data() + used_bytes,
                 scratch.old.data() + used_bytes, added, *apply, out.hash);
    }
    out.count += added;
  }
}

// The base (the published state, or diff's old file) and the new weights
// hold different tensor names.
Status TensorSetError(std::span<const TensorView> base, std::span<const TensorView> current) {
  std::vector<std::string> base_names, current_names;
  for (const TensorView& t : base) base_names.push_back(t.name);
  for (const TensorView& v : current) current_names.push_back(v.name);
  return Status::InvalidArgument("the tensors differ from the base's: " +
                                 DescribeTensorSetDiff(base_names, current_names));
}

}  // namespace

Result<std::vector<ScanJob>> PlanDetect(std::span<const TensorView> published, std::span<const TensorView> current,
                                        const DetectOptions& options) {
  std::unordered_map<std::string_view, const TensorView*> by_name;
  for (const TensorView& v : current) {
    DS_RETURN_IF_ERROR(CheckView(v));
    if (!by_name.emplace(v.name, &v).second) {
      return Status::InvalidArgument(Quoted(v.name) + " appears twice in the current weights");
    }
  }
  std::vector<ScanJob> jobs;
  jobs.reserve(published.size());
  for (const TensorView& t : published) {
    DS_RETURN_IF_ERROR(CheckView(t));
    auto it = by_name.find(t.name);
    if (it == by_name.end()) return TensorSetError(published, current);
    const TensorView& cur = *it->second;
    if (cur.shape != t.shape) {
      return Status::InvalidArgument(Quoted(t.name) + ": shape " + ShapeToString(cur.shape) +
                                     " does not match the base's " + ShapeToString(t.shape));
    }
    const bool rounds = t.dtype == DType::kBF16 && cur.dtype == DType::kF32;
    if (cur.dtype != t.dtype && !rounds) {
      return Status::InvalidArgument(
          Quoted(t.name) + ": dtype " + std::string(DTypeName(cur.dtype)) +
          " cannot be compared with the base's " + std::string(DTypeName(t.dtype)) +
          (t.dtype == DType::kBF16 ? " (expected BF16 or F32)" : ""));
    }
    ScanJob job;
    job.name = t.name;
    job.published_dtype = t.dtype;
    job.current_dtype = cur.dtype;
    job.published = t.data.data();
    job.current = cur.data.data();
    job.elements = t.num_elements();
    job.exp_mask = options.allow_nonfinite ? 0 : NonFiniteMask(t.dtype);
    jobs.push_back(job);
  }
  if (by_name.size() != jobs.size()) return TensorSetError(published, current);
  return jobs;
}

Result<std::vector<ScanJob>> PlanDetect(const WeightState& published, std::span<const TensorView> current,
                                        const DetectOptions& options) {
  const std::vector<TensorView> views = published.views();
  DS_ASSIGN_OR_RETURN(std::vector<ScanJob> jobs, PlanDetect(views, current, options));
  // One job per tensor, in order: the names must outlive `views`.
  for (size_t i = 0; i < jobs.size(); ++i) jobs[i].name = published.tensors()[i].name;
  return jobs;
}

Result<std::vector<TensorChanges>> DetectChangesChunked(const WeightState& published,
                                                        std::span<const TensorView> current,
                                                        const DetectOptions& options,
                                                        uint64_t chunk_elements) {
  DS_ASSIGN_OR_RETURN(std::vector<ScanJob> jobs, PlanDetect(published, current, options));
  return DetectJobs(jobs, options, chunk_elements);
}

Status DetectChangesChunked(const WeightState& published, std::span<const TensorView> current,
                            const DetectOptions& options, uint64_t chunk_elements,
                            std::vector<TensorChanges>& out) {
  Result<std::vector<ScanJob>> jobs = PlanDetect(published, current, options);
  if (!jobs.ok()) {
    out.clear();
    return jobs.status();
  }
  return DetectJobs(*jobs, options, chunk_elements, out);
}

Result<std::vector<TensorChanges>> DetectJobs(const std::vector<ScanJob>& jobs, const DetectOptions& options,
                                              uint64_t chunk_elements) {
  std::vector<TensorChanges> changes;
  DS_RETURN_IF_ERROR(DetectJobs(jobs, options, chunk_elements, changes));
  return changes;
}

Status DetectJobs(const std::vector<ScanJob>& jobs, const DetectOptions& options, uint64_t chunk_elements,
                  std::vector<TensorChanges>& changes, const InScanApply* apply,
                  std::vector<std::vector<uint8_t>>* old, StateHash* delta) {
  const std::vector<Chunk> chunks = SplitIntoChunks(ElementCounts(jobs), chunk_elements);
  std::vector<ChunkResult> results(chunks.size());
  Slots slots;
  Assembler assembler{jobs, chunks, results, changes, apply ? old : nullptr};
  InOrder in_order(chunks.size());
  RunChunks(chunks.size(), options.threads, [&](size_t, size_t c) {
    ChunkResult& r = results[c];
    r.scratch = slots.Take();
    ScanChunk(jobs[chunks[c].tensor], chunks[c], *r.scratch, r, apply ? &apply->seeds[chunks[c].tensor] : nullptr);
    // A failed chunk keeps its scratch (an undo reads it) and holds back
    // the copies of the chunks after it.
    if (r.failed()) return false;
    in_order.Finish(c, [&](size_t first, size_t end) {
      for (size_t u = first; u < end; ++u) {
        assembler.Append(u);
        slots.Give(results[u].scratch);
      }
    });
    return true;
  });

  // The first failure in chunk order is the first in (tensor, index) order.
  for (size_t c = 0; c < chunks.size(); ++c) {
    const ScanJob& job = jobs[chunks[c].tensor];
    if (results[c].failed()) {
      if (apply) {
        // Every chunk that ran (a chunk not run found nothing) puts back
        // what it applied, the failed ones included: from the output where
        // it got there, else from its scratch.
        for (size_t u = 0; u < chunks.size(); ++u) {
          const ChunkResult& r = results[u];
          const ScanJob& j = jobs[chunks[u].tensor];
          const size_t size = DTypeSize(j.published_dtype);
          uint8_t* data = const_cast<uint8_t*>(j.published);
          if (r.in_output) {
            UndoBlock(data, size, changes[r.entry].indices.data() + r.position,
                      (*old)[r.entry].data() + r.position * size, r.count);
          } else if (r.scratch != nullptr) {
            UndoBlock(data, size, reinterpret_cast<const uint64_t*>(r.scratch->indices.data()), r.scratch->old.data(),
                      r.count);
          }
        }
        old->clear();
      }
      changes.clear();
    }
    if (results[c].first_bad != kNoError) return NonFiniteError(job, results[c].first_bad);
    if (results[c].out_of_memory) {
      return Status::Internal(Quoted(job.name) + ": out of memory while collecting changes");
    }
  }
  assembler.Close();
  if (apply) {
    for (const ChunkResult& r : results) *delta += StateHash{r.hash[0], r.hash[1]};
  }
  return Status::OK();
}

}  // namespace deltasync::bf16

namespace deltasync {

Result<std::vector<TensorChanges>> DetectChanges(const WeightState& published,
                                                 std::span<const TensorView> current,
                                                 const DetectOptions& options) {
  return bf16::DetectChangesChunked(published, current, options, bf16::kDefaultChunkElements);
}

Status DetectChanges(const WeightState& published, std::span<const TensorView> current, const DetectOptions& options,
                     std::vector<TensorChanges>& out) {
  return bf16::DetectChangesChunked(published, current, options, bf16::kDefaultChunkElements, out);
}

}  // namespace deltasync
