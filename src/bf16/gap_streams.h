// What DetectAndEncodeGapDelta's chunks write and find (internal): shared by
// the scan and encode (detect_encode.cc) and its in-scan apply
// (detect_encode_apply.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "bf16/chunks.h"
#include "bf16/hash_term.h"
#include "bf16/scan.h"
#include "bf16/scratch.h"
#include "deltasync/detect_encode.h"

namespace deltasync {

struct DetectedGapDelta::Buffers {
  struct ChunkStreams {
    bf16::ScratchBuffer gaps;    // a uint16_t per change
    bf16::ScratchBuffer values;  // the published dtype's bytes per change
    bf16::ScratchBuffer old;     // with an in-scan apply: the values they replaced, laid out as `values`
  };
  std::vector<std::unique_ptr<ChunkStreams>> chunks;          // by chunk position
  std::vector<std::unique_ptr<bf16::ScratchBuffer>> wide;     // by changed tensor: its U32/U64 gaps
  std::vector<std::unique_ptr<bf16::ScratchBuffer>> indices;  // by worker: one block's 64-bit indices
};

namespace bf16 {

// What one chunk found. Its gap stream holds `count` gaps, the first of
// which (slot 0) is written after the scan.
struct ChunkGaps {
  size_t count = 0;
  uint64_t first = 0, last = 0;  // its first and last change's index (count > 0)
  uint64_t or_gap = 0;           // OR of its gaps 1 .. count-1 (only blocks' first gaps can pass 16 bits)
  uint64_t gap0 = 0;             // its first change's gap, after the scan
  std::vector<std::pair<size_t, uint64_t>> wide;  // (k, gap) of its gaps 1 .. count-1 above 16 bits, k ascending
  uint64_t first_bad = kNoError;  // flat index of the first non-finite element
  bool out_of_memory = false;
  uint64_t hash[2] = {0, 0};  // with an in-scan apply: the state-hash change of its `count` changes

  bool failed() const { return first_bad != kNoError || out_of_memory; }
};

// An in-scan apply (detect_encode_apply.h): per job, its tensor's hash seeds
// and value size.
struct GapApply {
  std::vector<state_hash::TensorSeeds> seeds;
  std::vector<size_t> value_sizes;
  // The hash terms of 2-byte values left to GapDeltaApply::HashLater (each
  // chunk's `hash` then holds only its other dtypes' terms).
  bool hash_later = false;

  // Job `job`'s hash terms are left for later.
  bool HashedLater(size_t job) const { return hash_later && value_sizes[job] == 2; }
};

// Applies the `added` changes a block of `job` starting at element `begin`
// just wrote (gaps/values: their slots in the chunk's streams, gaps[0] still
// the first change's offset in the block; for jobs without the gaps kernel,
// `indices` already holds their 64-bit indices) to job.published: their old
// values to `old`, their state-hash change added to hash[2] unless
// `hash_later` (GapApply::HashedLater: 2-byte values only). `indices` has
// room for added + kernels::kCompareGapsSlack entries.
void ApplyGapBlock(const ScanJob& job, uint64_t begin, const uint16_t* gaps, const uint8_t* values, size_t added,
                   bool gaps_kernel, uint64_t* indices, uint8_t* old, const state_hash::TensorSeeds& seeds,
                   bool hash_later, uint64_t hash[2]);

// Puts back in `data` (a tensor's bytes, `value_size` per element) the
// changes a chunk applied (found.count of them, their old values in
// streams.old), from its first index, its gaps 1 .. count-1 and its wide list.
void UndoGapChunk(uint8_t* data, size_t value_size, const ChunkGaps& found,
                  const DetectedGapDelta::Buffers::ChunkStreams& streams);

// The scan and patch of DetectAndEncodeGapDelta over `jobs` (after its
// checks of `info`), into `out`; with `apply`, each block's changes are also
// applied to its job's published bytes as they are found (ApplyGapBlock),
// `found` keeps what each chunk found (for an undo) and *delta gets the
// state-hash change. On an error nothing applied is undone here: the caller
// undoes every chunk of `found`.
Status DetectAndEncodeJobs(const std::vector<ScanJob>& jobs, const DetectOptions& options, const PatchInfo& info,
                           uint64_t chunk_elements, DetectedGapDelta& out, std::vector<Chunk>& chunks,
                           std::vector<ChunkGaps>& found, const GapApply* apply, StateHash* delta);

// Clears `out`'s patch and refuses other encodings than gap_delta.
Status StartPatch(const PatchInfo& info, DetectedGapDelta& out);

}  // namespace bf16
}  // namespace deltasync
