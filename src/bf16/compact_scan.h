// Publishing's fused pass for compact deltas (internal).
//
// DetectChanges -> EncodeCompactDelta -> HashChanges -> ApplyChanges each
// walk the data again, and the change list between them (8 bytes of index
// and 2 of value per change) is itself a large write and read. CompactScan
// does it in one pass per chunk of each bf16 tensor: it rounds the trainer's
// fp32 (or takes its bf16), compares with the published bf16, and for each
// changed element computes what the compact stream needs (its gap among the
// base elements of the same exponent class, its diff byte or escape), the
// state hash's change, and writes the new value into the published state,
// keeping the old one for Undo. The streams it leaves are written by the same
// WriteBf16Stream that EncodeCompactDelta uses, so the delta's bytes are
// identical (tests/bf16/compact_scan_test.cc checks that on every input it
// builds).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bf16/chunks.h"
#include "bf16/scratch.h"
#include "codec/compact_bf16.h"
#include "deltasync/changes.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/weight_state.h"

namespace deltasync::kernels {

inline constexpr int kScanClasses = compact::kClasses;
// ScanCompactSpan works (and stops on a non-finite value) in blocks of this
// many elements.
inline constexpr size_t kScanBlockElements = 1024;

// Room ScanCompactSpan's old_values need past a span's n entries: the raw
// AVX-512 route stores them in whole vectors.
inline constexpr size_t kScanOldSlack = 64;

// One span of a chunk of a bf16 tensor, for ScanCompactSpan. Outputs need
// room for n more entries each (escapes per class too; old_values n +
// kScanOldSlack, written past its count).
struct CompactScanSpan {
  uint16_t* published = nullptr;   // elements [0, n); changed ones are overwritten
  const void* current = nullptr;   // n fp32 (f32) or bf16 bit patterns
  bool f32 = false;
  bool check_finite = false;       // refuse Inf/NaN (after rounding)
  size_t n = 0;
  uint64_t index0 = 0;             // flat index of element 0 in its tensor
  const uint64_t* seed = nullptr;  // the tensor's two element seeds
  std::array<uint32_t*, kScanClasses> gaps{};
  std::array<uint8_t*, kScanClasses> diffs{};
  std::array<uint16_t*, kScanClasses> escapes{};
  uint16_t* old_values = nullptr;  // old value of each change, in element order (scratch past them)
  uint64_t* changed_words = nullptr;  // (n + 63) / 64 words; bit k of word w: element 64w+k changed
};

// Carried from span to span of one chunk.
struct CompactScanState {
  std::array<uint64_t, kScanClasses> seen{};  // class-c elements of the chunk so far
  std::array<uint64_t, kScanClasses> next{};  // seen[c] just after the last class-c change (0: none)
  std::array<uint64_t, kScanClasses> changes{};
  std::array<uint64_t, kScanClasses> escapes{};
  uint64_t old_values = 0;
  uint64_t hash[2] = {0, 0};  // sum of ElementTerm(new) - ElementTerm(old)
};

// Scans span.n elements in blocks: appends each change's gap (seen-count of
// its class before it, minus state.next), diff byte and escape at the
// counts in `state` (which it advances), its old value, its bit, and its
// hash change, and stores the new value. With check_finite, a block holding
// a non-finite value is left untouched and the scan stops there: returns the
// offset of that value, else n (blocks before it are applied). Every target
// gives the same results.
size_t ScanCompactSpan(const CompactScanSpan& span, CompactScanState& state);

}  // namespace deltasync::kernels

namespace deltasync::bf16 {

// Reusable across publishes (its buffers stay allocated: fresh memory costs
// page faults that would dominate a pass like this).
class CompactScan {
 public:
  CompactScan();
  ~CompactScan();
  CompactScan(const CompactScan&) = delete;
  CompactScan& operator=(const CompactScan&) = delete;

  // Compares `current` with `published` as DetectChanges does (same
  // validation and errors; when tensors of several dtypes hold NaN/Inf, the
  // one named may differ). The changes of bf16 tensors are coded and
  // applied to `published` in place; those of other dtypes are only found
  // (other_changes(), not applied). On error `published` is unchanged.
  // chunk_elements below 2^31 (tests use tiny ones).
  Status Run(WeightState& published, std::span<const TensorView> current, const DetectOptions& options,
             uint64_t chunk_elements = kDefaultChunkElements);

  // Where the published tensors are blocks of larger ones (parts): for
  // published tensor j (name order), the full tensor's shape and the flat
  // index of the block's element 0 in it, so that bf16_hash_delta() holds
  // the full tensors' terms. Only for blocks that are one run (contiguous in
  // the full tensor); an empty full_shape keeps the tensor's own frame.
  // Applies to every later Run until changed.
  struct HashFrame {
    std::vector<uint64_t> full_shape;
    uint64_t index0 = 0;
  };
  void SetHashFrames(std::vector<HashFrame> frames) { frames_ = std::move(frames); }

  // After a successful Run, until the next one:
  uint64_t bf16_changed() const { return bf16_changed_; }
  const StateHash& bf16_hash_delta() const { return hash_delta_; }
  std::vector<TensorChanges>& other_changes() { return other_; }
  // The bf16 tensors with changes, in published order (name order).
  size_t tensors() const { return tensors_.size(); }
  const std::string& name(size_t i) const;
  uint64_t changed(size_t i) const;
  // Appends tensor i's compact stream (byte-identical to EncodeCompactDelta's):
  // version 2 without `tables`, else version 3.
  void WriteStream(size_t i, std::vector<uint8_t>& out, const compact::V3Tables* tables = nullptr) const;
  // Adds the diff bytes of every tensor with changes to `h` (for version
  // 3's delta-wide tables), counted during Run: no pass over them here.
  void CountAllDiffs(compact::DiffHistogram& h) const;
  // The bf16 changes the last Run applied, as DetectChanges returns them
  // (indices from the bitmap, values read back from the state). Before Undo.
  std::vector<TensorChanges> AppliedChanges() const;
  // Tensor i's changes (block-local indices ascending, and the old and new
  // bf16 bits of each, little-endian), for hashing them where the published
  // tensors are blocks of larger ones (parts). Before Undo.
  void ChangesOf(size_t i, std::vector<uint64_t>& indices, std::vector<uint8_t>& old_values,
                 std::vector<uint8_t>& new_values) const;
  // Puts the old values of every bf16 change the last Run applied back into
  // the state it was given (which must still be alive).
  void Undo(int threads) const;

 private:
  struct Worker;
  struct ChunkResult;
  struct TensorRange {
    size_t job;
    size_t first_chunk, end_chunk;
    uint64_t changed;
  };
  class Gaps;

  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<Chunk> chunks_;
  std::vector<ChunkResult> results_;
  std::vector<std::string> names_;   // per job
  std::vector<uint16_t*> data_;      // per job: its published bf16 elements
  std::vector<TensorRange> tensors_;
  ScratchBuffer words_;              // changed-element bitmaps, per chunk
  std::vector<TensorChanges> other_;
  std::vector<HashFrame> frames_;
  uint64_t bf16_changed_ = 0;
  StateHash hash_delta_;
};

}  // namespace deltasync::bf16
