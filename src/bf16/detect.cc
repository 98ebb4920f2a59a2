// DetectChanges: validation, chunking over threads, and assembling the
// per-chunk results. The per-element work is in detect_kernels.cc.

#include <bit>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bf16/chunked.h"
#include "bf16/chunks.h"
#include "bf16/detect_apply.h"
#include "bf16/scan.h"
#include "bf16/scratch.h"
#include "bf16/simd_kernels.h"
#include "common/pages.h"  // ReserveForReuse
#include "common/parallel.h"
#include "deltasync/changes.h"

namespace deltasync::bf16 {
namespace {

static_assert(std::endian::native == std::endian::little,
              "tensor bytes are little-endian and compared in place");

// Each worker thread appends the changes of the chunks it scans to its own
// scratch; chunks record where theirs are. After the scan they are copied,
// in chunk order, into each tensor's output.
struct WorkerScratch {
  ScratchBuffer indices;   // uint64_t entries
  ScratchBuffer values;    // the entries' values, back to back
  ScratchBuffer old;       // with an in-scan apply: the old values, laid out as `values`
  size_t count = 0;        // entries in use
  size_t value_bytes = 0;  // bytes of values in use (dtypes differ per chunk)
};

// Worker scratch outlives a call: fresh pages (a fault and a kernel
// zero-fill per page) cost more than the scan itself, and every call of a
// training loop needs about as much as the last. So the buffers go back to
// this pool, which therefore holds as much memory as the largest change
// list found so far (~10 bytes per change). Concurrent calls each take
// what is free and allocate the rest.
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
    for (auto& w : out) w->count = w->value_bytes = 0;
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

// What one chunk found.
struct ChunkResult {
  size_t worker = 0;
  size_t offset = 0;        // first entry in the worker's scratch
  size_t value_offset = 0;  // and the byte where its values start
  size_t count = 0;
  uint64_t first_bad = kNoError;  // flat index of the first non-finite element
  bool out_of_memory = false;
  uint64_t hash[2] = {0, 0};      // with an in-scan apply: the state-hash change of its `count` changes

  bool failed() const { return first_bad != kNoError || out_of_memory; }
};

}  // namespace

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

namespace {

// Scans a chunk in blocks, growing the worker's scratch before each block
// so that the kernel can write a block's worth of changes without checks.
// With `apply` (seeds: the job's), each block's changes are applied as soon
// as they are found (ApplyBlock), while the block is in cache. The chunk's
// entries stay in the scratch even when it fails, so that the `count`
// changes it applied can be undone.
void ScanChunk(const ScanJob& job, const Chunk& chunk, WorkerScratch& scratch, ChunkResult& out,
               const state_hash::TensorSeeds* apply) {
  constexpr uint64_t kBlock = uint64_t{1} << 16;
  const size_t value_size = DTypeSize(job.published_dtype);
  out.offset = scratch.count;
  // 8-aligned: the kernels store values through typed (up to 8-byte) pointers.
  out.value_offset = (scratch.value_bytes + 7) & ~size_t{7};
  for (uint64_t begin = chunk.begin; begin < chunk.end; begin += kBlock) {
    const size_t n = static_cast<size_t>(std::min(kBlock, chunk.end - begin));
    const size_t used = out.offset + out.count;
    const size_t used_bytes = out.value_offset + out.count * value_size;
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
  scratch.count = out.offset + out.count;
  scratch.value_bytes = out.value_offset + out.count * value_size;
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
  std::vector<std::unique_ptr<WorkerScratch>> scratch =
      Pool().Take(std::min<size_t>(static_cast<size_t>(ResolveThreads(options.threads)), chunks.size()));
  struct GiveBack {
    std::vector<std::unique_ptr<WorkerScratch>>& s;
    ~GiveBack() { Pool().Give(std::move(s)); }
  } give_back{scratch};
  RunChunks(chunks.size(), options.threads, [&](size_t worker, size_t c) {
    results[c].worker = worker;
    ScanChunk(jobs[chunks[c].tensor], chunks[c], *scratch[worker], results[c],
              apply ? &apply->seeds[chunks[c].tensor] : nullptr);
    return !results[c].failed();
  });

  // The first failure in chunk order is the first in (tensor, index) order.
  for (size_t c = 0; c < chunks.size(); ++c) {
    const ScanJob& job = jobs[chunks[c].tensor];
    if (results[c].failed()) {
      changes.clear();
      if (apply) {
        // Every chunk that ran (a chunk not run found nothing) puts back
        // what it applied, the failed ones included.
        for (size_t u = 0; u < chunks.size(); ++u) {
          const ChunkResult& r = results[u];
          const ScanJob& j = jobs[chunks[u].tensor];
          WorkerScratch& w = *scratch[r.worker];
          UndoBlock(const_cast<uint8_t*>(j.published), DTypeSize(j.published_dtype),
                    reinterpret_cast<const uint64_t*>(w.indices.data()) + r.offset, w.old.data() + r.value_offset,
                    r.count);
        }
        old->clear();
      }
    }
    if (results[c].first_bad != kNoError) return NonFiniteError(job, results[c].first_bad);
    if (results[c].out_of_memory) {
      return Status::Internal(Quoted(job.name) + ": out of memory while collecting changes");
    }
  }

  // Concatenate each tensor's chunks in order; tensors are independent, so
  // the copies run in parallel too.
  struct Output {
    size_t job;
    size_t first_chunk, end_chunk;
    size_t count;
  };
  std::vector<Output> outputs;
  for (size_t c = 0; c < chunks.size();) {
    Output o{chunks[c].tensor, c, c, 0};
    for (; o.end_chunk < chunks.size() && chunks[o.end_chunk].tensor == o.job; ++o.end_chunk) {
      o.count += results[o.end_chunk].count;
    }
    c = o.end_chunk;
    if (o.count > 0) outputs.push_back(o);
  }
  // Entry k reuses the memory of the caller's entry k (DetectChanges into
  // `out`): across a training loop's calls the same tensors change at about
  // the same rates, so the copies below land on pages already mapped rather
  // than on fresh ones, each a fault and a kernel zero-fill.
  changes.resize(outputs.size());
  if (apply) {
    old->resize(outputs.size());
    for (const ChunkResult& r : results) *delta += StateHash{r.hash[0], r.hash[1]};
  }
  ParallelFor(outputs.size(), options.threads, [&](size_t k) {
    const Output& o = outputs[k];
    const ScanJob& job = jobs[o.job];
    const size_t value_size = DTypeSize(job.published_dtype);
    TensorChanges& tc = changes[k];
    tc.name.assign(job.name);
    tc.dtype = job.published_dtype;
    tc.indices.clear();
    tc.values.clear();
    ReserveForReuse(tc.indices, o.count, /*huge=*/true);
    ReserveForReuse(tc.values, o.count * value_size, /*huge=*/true);
    for (size_t c = o.first_chunk; c < o.end_chunk; ++c) {
      const ChunkResult& r = results[c];
      WorkerScratch& w = *scratch[r.worker];
      const uint64_t* idx = reinterpret_cast<const uint64_t*>(w.indices.data()) + r.offset;
      const uint8_t* val = w.values.data() + r.value_offset;
      tc.indices.insert(tc.indices.end(), idx, idx + r.count);
      tc.values.insert(tc.values.end(), val, val + r.count * value_size);
    }
    if (apply) {
      // The old values as the values, into the caller's reused entry k.
      std::vector<uint8_t>& kept = (*old)[k];
      kept.clear();
      if (kept.capacity() < tc.values.size()) {
        kept = std::vector<uint8_t>();
        kept.reserve(tc.values.capacity());
        AdviseHugePages(kept.data(), kept.capacity());
      }
      for (size_t c = o.first_chunk; c < o.end_chunk; ++c) {
        const ChunkResult& r = results[c];
        const uint8_t* was = scratch[r.worker]->old.data() + r.value_offset;
        kept.insert(kept.end(), was, was + r.count * value_size);
      }
    }
  });
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
