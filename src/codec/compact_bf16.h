// The per-tensor stream of a compact delta (docs/format.md, "Compact
// objects"), shared by its two encoders (internal to the compact codec):
//   - EncodeCompactDelta (compact_delta.cc), from TensorChanges and a base;
//   - publishing's fused scan (bf16/compact_scan.cc), which finds, codes
//     and applies changes in one pass over the trainer's tensors.
// Both hand the bf16 mode's class-ordered streams to WriteBf16Stream, so the
// bytes are the same whichever way they were found.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deltasync/compact.h"
#include "deltasync/patch.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"
#include "deltasync/weight_state.h"

namespace deltasync::compact {

inline constexpr uint8_t kStreamVersion = 2;
inline constexpr uint8_t kModeBf16 = 0;
inline constexpr uint8_t kModeRaw = 1;
inline constexpr uint8_t kEscape = 0xFF;

// The base value's context: its bf16 exponent, in 16 classes.
inline constexpr int kClasses = 16;
inline int ClassOf(uint16_t bits) {
  const int e = (bits >> 7) & 0xFF;
  return e <= 112 ? 0 : e >= 127 ? 15 : e - 112;
}

inline bool NonFiniteBf16(uint16_t bits) { return (bits & 0x7F80) == 0x7F80; }

// The diff byte for old -> new, or kEscape when the change must carry the raw
// new value: sign change, NaN/Inf on either side, or |diff| too large.
inline uint8_t DiffByte(uint16_t old_bits, uint16_t new_bits) {
  if (((old_bits ^ new_bits) & 0x8000) || NonFiniteBf16(old_bits) || NonFiniteBf16(new_bits)) return kEscape;
  const int32_t d = static_cast<int32_t>(new_bits) - static_cast<int32_t>(old_bits);
  const uint32_t z = (static_cast<uint32_t>(d) << 1) ^ static_cast<uint32_t>(d >> 31);
  return z < kEscape ? static_cast<uint8_t>(z) : kEscape;
}

// One class's gaps, in order, handed out a block at a time.
class GapSource {
 public:
  virtual ~GapSource() = default;
  // Writes the next min(max, remaining) gaps to out and returns how many.
  virtual size_t Next(uint64_t* out, size_t max) = 0;
};

// A bf16 tensor's changes, class by class: the j-th change of class cl comes
// gaps[cl]'s j-th gap unchanged class-cl elements after the previous change
// of that class (or the tensor's start); its diff byte is the j-th byte of
// the concatenated diffs[cl] parts; escaped changes' raw new values are the
// concatenated escapes parts (class 0's first, then class 1's, ...).
struct Bf16Streams {
  std::array<uint64_t, kClasses> counts{};
  std::array<GapSource*, kClasses> gaps{};
  std::array<std::vector<ByteSpan>, kClasses> diffs;
  std::vector<ByteSpan> escapes;  // u16 little-endian each
};

// Diff-byte counts per class (version 3's tables are built from a delta's).
using DiffHistogram = std::array<std::array<uint64_t, 256>, kClasses>;
struct V3Tables;  // codec/compact_v3.h

// Appends the whole version-2 bf16-mode stream of one tensor (header, class counts,
// Rice-coded gap block, a Huffman-coded diff block per non-empty class, the
// escape block). Deterministic.
void WriteBf16Stream(const Bf16Streams& streams, std::vector<uint8_t>& out);

// kInvalidArgument for a dtype mismatch, a wrong value size, or indices out
// of range or not strictly ascending.
Status CheckTensorChanges(const TensorChanges& changes, const TensorView& base);

// Adds the diff bytes of a bf16 tensor's changes (checked) to `h`.
void CountTensorDiffs(const TensorChanges& changes, const TensorView& base, DiffHistogram& h);

// The stream of one tensor's changes against its base (either mode), after
// CheckTensorChanges: version 2 without `tables`, else version 3 (its bf16
// diffs must all be in the tables).
Status EncodeTensorStream(const TensorChanges& changes, const TensorView& base, std::vector<uint8_t>& out,
                          const V3Tables* tables = nullptr);

// The compact delta file from per-tensor streams: `names[i]`'s stream is
// `streams[i]` (names sorted, each a tensor of the base, indices[i] its index
// in the base's name order), `changed` changed elements in all; `tables`
// (version 3) go into the metadata. `container` 1, 2 or kCompactContainerAuto
// (compact_container.h).
// REQUIRES info.base_version (checked: kInvalidArgument).
Result<EncodedPatch> AssembleCompactDelta(const PatchInfo& info, const StateHash& base_hash,
                                          uint64_t base_total_elements, std::span<const std::string> names,
                                          std::span<const uint64_t> indices,
                                          std::vector<std::vector<uint8_t>> streams, uint64_t changed,
                                          const V3Tables* tables, int container);

// kCorruption "<label>: tensor '<tensor>': <msg>", the decoders' one shape
// of error for a tensor's stream.
inline Status CorruptTensor(const std::string& label, std::string_view tensor, const std::string& msg) {
  return Status::Corruption(label + ": tensor '" + std::string(tensor) + "': " + msg);
}

// The decoder rebuilds positions in chunks of DecodeChunkElements()
// elements of a tensor, all chunks in parallel (compact_decode.cc): 128 Ki
// on Intel CPUs, 64 Ki on every other (session 53 h1: on the Intel Xeon
// host the larger chunk's per-chunk costs, halved, paid more than its
// larger working set in L2 cost; the AMD hosts were tuned at 64 Ki and
// cannot be measured there). One value per process: a replica's held
// class totals are kept per chunk and keyed by it (CompactClassTotals).
inline constexpr uint64_t kDecodeChunkSmall = uint64_t{1} << 16;
inline constexpr uint64_t kDecodeChunkLarge = uint64_t{1} << 17;
uint64_t DecodeChunkElements();

// DecodeCompactDelta with chunks of `chunk_elements` (>= 1; tests use tiny
// ones). The result does not depend on it or on `threads`.
// `base`: the base's tensors (views of any bytes, e.g. a span of a larger tensor).
Result<CompactDelta> DecodeCompactDeltaChunked(const SafetensorsFile& file, std::span<const TensorView> base,
                                               const StateHash& base_hash, int threads, uint64_t chunk_elements);
// The same into `out`, reusing its memory (DecodeCompactDelta into `out`).
Status DecodeCompactDeltaChunked(const SafetensorsFile& file, std::span<const TensorView> base,
                                 const StateHash& base_hash, int threads, uint64_t chunk_elements, CompactDelta& out);
inline Result<CompactDelta> DecodeCompactDeltaChunked(const SafetensorsFile& file, const WeightState& base,
                                                      const StateHash& base_hash, int threads,
                                                      uint64_t chunk_elements) {
  const std::vector<TensorView> views = base.views();
  return DecodeCompactDeltaChunked(file, views, base_hash, threads, chunk_elements);
}

// ApplyCompactDelta with chunks of `chunk_elements` (tests use tiny ones).
Result<CompactDelta> ApplyCompactDeltaChunked(const SafetensorsFile& file, WeightState& state,
                                              const StateHash& base_hash, int threads, uint64_t chunk_elements,
                                              CompactUndo& undo);
// ApplyCompactDelta onto tensors given as views of the base, `writable[i]`
// the writable bytes of `base[i]` (the same bytes, or their only copy): a
// replica applies a part of a parted delta onto its blocks where they lie in
// the held tensors. The same checks, hash_delta (in the frame of the views'
// tensors) and undo guarantee as ApplyCompactDelta. REQUIRES:
// writable.size() == base.size().
Result<CompactDelta> ApplyCompactDeltaToViews(const SafetensorsFile& file, std::span<const TensorView> base,
                                              std::span<uint8_t* const> writable, const StateHash& base_hash,
                                              int threads, CompactUndo& undo);

}  // namespace deltasync::compact

namespace deltasync::bf16 {
class CompactScan;  // bf16/compact_scan.h
}
namespace deltasync::compact {
class StreamBuffers;  // codec/stream_buffers.h
}

namespace deltasync {

// The compact delta of what `scan` found (its last successful Run against
// `base`, whose hash before that Run was `base_hash`) plus `others`: the
// changes of `base`'s non-bf16 tensors (scan.other_changes(), not yet
// applied to `base`). Byte-identical to EncodeCompactDelta of the same
// changes against the base before the Run. Streams written in parallel,
// into buffers taken from `buffers` when given (the caller gives the
// patch's `owned` back to it once written; codec/stream_buffers.h).
Result<EncodedPatch> EncodeScannedCompactDelta(const PatchInfo& info, const StateHash& base_hash,
                                               const WeightState& base, const bf16::CompactScan& scan,
                                               std::span<const TensorChanges> others, int threads,
                                               int stream_version = kDefaultCompactStreamVersion,
                                               int container = kDefaultCompactContainer,
                                               compact::StreamBuffers* buffers = nullptr);

}  // namespace deltasync
