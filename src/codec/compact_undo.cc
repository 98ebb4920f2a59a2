// What a fused compact apply keeps past itself (compact_undo.h): the class
// totals it prepares before its walk and names after it (docs/format.md,
// "Decoding in parallel inside a tensor"), and the undo log put back
// (CompactUndo::Restore, deltasync/compact.h). The apply itself, which
// writes the log and the totals, is compact_decode.cc.
#include "codec/compact_undo.h"

#include <cstring>

#include "common/parallel.h"

namespace deltasync {
namespace compact {

KeptTotals PrepareTotals(ChunkWalker& walker, const std::vector<Bf16Tensor*>& walked,
                         const std::vector<uint8_t>& tensor_held, const std::vector<size_t>& first_chunk,
                         std::span<const TensorView> base, CompactClassTotals::State* held,
                         CompactClassTotals& totals) {
  KeptTotals kept;
  kept.before = held ? held : &totals.states[0];
  kept.after = kept.before == &totals.states[0] ? &totals.states[1] : &totals.states[0];
  CompactClassTotals::State& before = *kept.before;
  CompactClassTotals::State& after = *kept.after;
  after.valid = false;
  if (!held) {
    before.valid = false;
    before.tensors.resize(base.size());
    for (CompactClassTotals::Tensor& t : before.tensors) t.elements = 0;
  }
  after.tensors.resize(base.size());
  std::vector<uint8_t> is_walked(base.size(), 0);
  for (size_t w = 0; w < walked.size(); ++w) {
    const size_t i = static_cast<size_t>(walked[w]->base - base.data());
    is_walked[i] = 1;
    const size_t n_chunks = first_chunk[w + 1] - first_chunk[w];
    CompactClassTotals::Tensor& a = after.tensors[i];
    CompactClassTotals::Tensor* b = nullptr;
    a.elements = walked[w]->base->num_elements();
    a.chunks.resize(n_chunks);
    if (!tensor_held[w]) {
      // Every class counted (ChunkWalker::Keep).
      b = &before.tensors[i];
      b->elements = a.elements;
      b->chunks.resize(n_chunks);
    }
    for (size_t j = 0; j < n_chunks; ++j) walker.Keep(first_chunk[w] + j, b ? &b->chunks[j] : nullptr, &a.chunks[j]);
  }
  for (size_t i = 0; i < base.size(); ++i) {
    if (is_walked[i]) continue;
    const CompactClassTotals::Tensor& b = before.tensors[i];
    CompactClassTotals::Tensor& a = after.tensors[i];
    a.elements = b.elements;
    if (b.elements != 0) a.chunks.assign(b.chunks.begin(), b.chunks.end());
  }
  return kept;
}

// After a successful fused apply from the state `from` to `to`: both held.
void KeepTotals(const KeptTotals& kept, const StateHash& from, const StateHash& to, uint64_t chunk_elements) {
  kept.before->valid = true;
  kept.before->hash = from;
  kept.before->chunk_elements = chunk_elements;
  kept.after->valid = true;
  kept.after->hash = to;
  kept.after->chunk_elements = chunk_elements;
}

}  // namespace compact

namespace {

// Puts back a run's old values, kSize bytes each (0: run.esize). With kSize
// known when compiled each copy is a load and a store; of a run-time size, a
// call to memmove per element (16% of a one-thread apply-and-restore loop's
// samples).
template <size_t kSize>
void RestoreRun(const CompactUndo::Run& run) {
  const size_t esize = kSize != 0 ? kSize : run.esize;
  if (run.pos32) {
    uint8_t* const data = run.data + run.first * esize;
    for (uint64_t j = 0; j < run.written; ++j) std::memcpy(data + uint64_t{run.pos32[j]} * esize, run.old + j * esize, esize);
  } else {
    for (uint64_t j = 0; j < run.written; ++j) std::memcpy(run.data + run.pos64[j] * esize, run.old + j * esize, esize);
  }
}

}  // namespace

void CompactUndo::Restore(int threads) {
  ParallelFor(runs.size(), threads, [&](size_t r) {
    const Run& run = runs[r];
    if (run.esize == 2) {
      RestoreRun<2>(run);
    } else {
      RestoreRun<0>(run);
    }
  });
  runs.clear();
  totals.Invalidate();
}

}  // namespace deltasync
