// deltasync-native patch encodings (docs/format.md, "Compact objects"), not
// readable by TRL:
//
//   compact delta:      a delta that names its exact base (version and state
//                       hash) and codes each changed element relative to the
//                       base: positions as gaps counted among base elements of
//                       the same exponent class (LEB128 varints), bf16 value
//                       changes as zigzag differences of bit patterns (ULPs),
//                       raw values where that does not fit (escapes); the
//                       differences rANS-coded with delta-wide per-class
//                       tables (stream version 3; version 2, Huffman-coded
//                       per tensor and class, is still read). All streams
//                       in one U8 tensor `streams` after a directory
//                       (container 2; container 1, one U8 tensor
//                       `{name}.cmp` per changed parameter, is still read
//                       and written on request). Metadata encoding="compact".
//   compressed anchor:  a full snapshot with each bf16 element split into an
//                       exponent byte plane (zstd, i.e. Huffman-coded) and a
//                       sign+mantissa byte plane (stored), in chunks of up to
//                       1 Mi elements so decoding runs in parallel. One U8
//                       tensor `{name}.zan` per parameter.
//
// Both are safetensors files (so safe_open can list them). Decoders treat
// their input as untrusted: every length, count and index is checked, and
// decompressed sizes are bounded by what the base / the header allow before
// any allocation. Violations are kCorruption naming file, tensor and rule.
// Thread safety: all functions are reentrant.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deltasync/changes.h"
#include "deltasync/compact_class_totals.h"
#include "deltasync/patch.h"
#include "deltasync/safetensors.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"
#include "deltasync/uninit_vector.h"
#include "deltasync/weight_state.h"

namespace deltasync {

inline constexpr std::string_view kCompactEncodingName = "compact";
// Metadata key: StateHash::Hex() of the base a compact delta applies to.
inline constexpr std::string_view kBaseStateHashKey = "deltasync_base_state_hash";

// The stream version new compact deltas are written in: 2, 3, or
// kCompactStreamAuto (the default): version 3, except that a delta of fewer
// than 4096 changes is written in version 2 when that is smaller (the
// tables' fixed cost). Every version is read. Version 3 (docs/format.md)
// codes the same information as version 2 with delta-wide rANS tables for
// the ULP differences.
inline constexpr int kCompactStreamAuto = 0;
inline constexpr int kDefaultCompactStreamVersion = kCompactStreamAuto;

// The container new compact deltas are written in (docs/format.md,
// "Containers"): 1, one U8 tensor `{P}.cmp` per changed parameter P; 2,
// every stream back to back in one U8 tensor `streams` after a directory of
// (base tensor index, length), which saves the ~100-byte safetensors header
// entry per changed parameter; or kCompactContainerAuto (the default):
// container 2 unless container 1 is strictly smaller (a delta of at most a
// changed tensor or so), so never larger than either. The streams are the
// same bytes in both; both are read.
inline constexpr int kCompactContainerAuto = 0;
inline constexpr int kDefaultCompactContainer = kCompactContainerAuto;

// A compact delta for info.model_version against `base` (whose hash is
// `base_hash`, version *info.base_version). REQUIRES of the caller, checked
// (kInvalidArgument): info.base_version set and < info.model_version; every
// changes[i].name a tensor of `base` with the same dtype, named once, indices
// strictly ascending and below its element count, values sized count x dtype.
// info.encoding, total_elements and changed counts are ignored / computed
// (total_elements = base.total_elements()). Deterministic: the same input
// gives the same bytes. Tensors encoded in parallel on up to `threads`
// threads (0 = hardware concurrency), in `stream_version` (2, 3 or
// kCompactStreamAuto, else kInvalidArgument) and `container` (1, 2 or
// kCompactContainerAuto, else kInvalidArgument). The result owns all its bytes.
Result<EncodedPatch> EncodeCompactDelta(const PatchInfo& info, const StateHash& base_hash,
                                        const WeightState& base, std::span<const TensorChanges> changes,
                                        int threads = 0, int stream_version = kDefaultCompactStreamVersion,
                                        int container = kDefaultCompactContainer);
// The same against a base given as views (any order; names unique), e.g. a
// PublishedViews' tensors: no copy of the base.
Result<EncodedPatch> EncodeCompactDelta(const PatchInfo& info, const StateHash& base_hash,
                                        std::span<const TensorView> base, std::span<const TensorChanges> changes,
                                        int threads = 0, int stream_version = kDefaultCompactStreamVersion,
                                        int container = kDefaultCompactContainer);

// A decoded compact delta. `changes` sorted by name, indices strictly
// ascending and in range for the base it was decoded against, values in the
// base tensor's dtype: ValidateChanges(base, changes) holds, so
// ApplyChanges(base, changes) may follow directly.
struct CompactDelta {
  PatchInfo info;  // info.encoding is meaningless (compact is not an IndexEncoding)
  StateHash base_hash;
  std::vector<TensorChanges> changes;
  // What the changes add to the state hash of the base they were decoded
  // against, computed while decoding: HashChanges(base, changes) (in the
  // frame of the base's tensors).
  StateHash hash_delta;
};

// True when `file`'s metadata says encoding="compact" (no other check).
bool IsCompactDelta(const SafetensorsFile& file);

// Decodes `file` against `base`, whose state hash is `base_hash`.
// kFailedPrecondition (naming both hashes) when the patch names another base
// hash; kCorruption for any format violation. `base` is only read.
Result<CompactDelta> DecodeCompactDelta(const SafetensorsFile& file, const WeightState& base,
                                        const StateHash& base_hash, int threads = 0);
// The same against the base's tensors given as views (a tensor may view a
// span of a larger buffer: a replica decodes a part's row-range blocks in
// the held tensors, without copying them out). Names unique.
Result<CompactDelta> DecodeCompactDelta(const SafetensorsFile& file, std::span<const TensorView> base,
                                        const StateHash& base_hash, int threads = 0);
// The same into `out`, for a caller that decodes version after version (a
// benchmark, a checker): on success `out` holds exactly what the call above
// returns; on an error (the same errors) it is a default CompactDelta.
// Entry k of out.changes reuses the memory of the entry k it held before
// (as DetectChanges into `out`): its indices and values keep their capacity
// and only grow, so repeated decodes of about as many changes touch no
// fresh pages (~10 bytes per change, which the call above maps, faults,
// zero-fills and unmaps every time). The memory held is the caller's: clear
// or destroy `out` to free it.
Status DecodeCompactDelta(const SafetensorsFile& file, std::span<const TensorView> base, const StateHash& base_hash,
                          int threads, CompactDelta& out);

// The undo log of ApplyCompactDelta: each overwritten element's position
// and old bytes (6 B per change of a bf16 tensor: a 4-byte position within
// its chunk and the old value), in buffers reused across calls. Each apply
// sizes the buffers to its changes without writing them (UninitVector: no
// zero fill); what a slot held before (fresh memory, an older apply's entry)
// is never read: only the first `written` entries of each of the apply's
// runs hold its values, and only those are read.
class CompactUndo {
 public:
  // Puts back every value the last ApplyCompactDelta wrote, then forgets
  // them (a second call does nothing). The state must be the one applied to,
  // unchanged since. Forgets the held class totals too.
  void Restore(int threads = 0);

  // The class totals of the states last applied to and from
  // (compact_class_totals.h): the next apply to either starts every chunk
  // without the look-back. Kept across calls (reuse one CompactUndo per
  // replica); forgotten by Restore and by any failed apply.
  CompactClassTotals totals;

  // Internal (src/codec): a run of written elements of a tensor whose
  // bytes start at `data` (elements of `esize` bytes): element j of the run,
  // at position Position(j) of the tensor, held old[j]. A bf16 chunk's run
  // has 4-byte positions from its chunk's first element `first` (pos32),
  // a raw-mode tensor's run 8-byte ones (pos64).
  struct Run {
    uint8_t* data = nullptr;
    size_t esize = 0;
    uint64_t first = 0;
    const uint32_t* pos32 = nullptr;
    const uint64_t* pos64 = nullptr;
    const uint8_t* old = nullptr;
    uint64_t written = 0;
    uint64_t Position(uint64_t j) const { return pos32 ? first + pos32[j] : pos64[j]; }
  };
  std::vector<Run> runs;
  UninitVector<uint32_t> pos32;   // bf16 tensors' positions (per chunk)
  UninitVector<uint16_t> old16;   // bf16 tensors' old values
  UninitVector<uint64_t> pos64;   // raw-mode tensors' positions
  UninitVector<uint8_t> old_raw;  // raw-mode tensors' old bytes
};

// DecodeCompactDelta and the scatter in one pass: the new values go straight
// into `state`'s tensors (no TensorChanges, no index vectors) while the
// state-hash change is summed. The result's `changes` is empty; its
// hash_delta is HashChanges(state before, decoded changes). On any error
// every written value is put back first: `state` holds what it held. On
// success `undo` can put the old values back (CompactUndo::Restore), e.g.
// when base_hash + hash_delta is not the hash the caller expects.
Result<CompactDelta> ApplyCompactDelta(const SafetensorsFile& file, WeightState& state, const StateHash& base_hash,
                                       int threads, CompactUndo& undo);

// Where a compact delta's bytes go (deltasync inspect): stored (compressed)
// bytes of each stream summed over tensors, read from the stream headers
// without the base. kCorruption when a stream's framing is malformed.
struct CompactStreamSizes {
  uint64_t tensors = 0;
  uint64_t changed = 0;        // changed elements
  uint64_t header_bytes = 0;   // safetensors header + container 2 directory + per-tensor stream headers
  uint64_t gap_bytes = 0;      // positions
  uint64_t diff_bytes = 0;     // bf16 ULP differences
  uint64_t escape_bytes = 0;   // raw bf16 values (sign flips, NaN/Inf, big moves)
  uint64_t value_bytes = 0;    // raw values of other dtypes
  int container = 1;            // 1 or 2 (see kDefaultCompactContainer)
  // Each model tensor the delta changes, in name order: its name (without
  // the stream's '.cmp'; container 2 names no tensor, so empty there),
  // container 2's index of the tensor in the base's name order, whether its
  // stream is bf16 (otherwise the dtype is the base's) and its changed
  // elements.
  struct Tensor {
    std::string name;
    bool bf16 = false;
    uint64_t changed = 0;
    std::optional<uint64_t> base_index;
  };
  std::vector<Tensor> changed_tensors;
};
Result<CompactStreamSizes> MeasureCompactDelta(const SafetensorsFile& file);

// The compact decoder's first step alone: every stream's entropy decode
// (gaps into ranks, diff bytes, escapes), exactly as DecodeCompactDelta reads
// them, without the walk over the base that turns ranks into positions. For
// measuring that step by itself (`deltasync bench`'s decode floor) and
// testing it; it decodes nothing a replica can apply.
struct CompactParse {
  struct Tensor {
    std::string name;  // the base tensor's
    bool bf16 = false;  // bf16 mode; else raw mode, decoded into `raw`
    // bf16 mode, per exponent class cl (the 16 classes of docs/format.md):
    // changes [class_begin[cl], class_begin[cl + 1]) in class order.
    std::array<uint64_t, 17> class_begin{};
    // Per change: its rank among the base tensor's elements of its class, in
    // `ranks32` where the base tensor has at most 2^32 elements (the other
    // vector then empty), else in `ranks`; rank(j) reads either. These and
    // `diffs` grow without zero-filling (UninitVector): the parse writes
    // every element.
    UninitVector<uint32_t> ranks32;
    UninitVector<uint64_t> ranks;
    uint64_t rank(size_t j) const { return ranks32.empty() ? ranks[j] : ranks32[j]; }
    UninitVector<uint8_t> diffs;    // per change: zigzag ULP difference, or 0xFF (escape)
    std::vector<uint64_t> escaped;  // the escaped changes (class order)
    std::vector<uint8_t> escapes;   // their raw new values, u16 little-endian each
    TensorChanges raw;              // raw mode: the tensor's changes
  };
  std::vector<Tensor> tensors;  // stream name order; their buffers are reused by the next parse
  uint64_t changes() const;
};

// Parses every stream of `file` (tensors on up to `threads` threads) into
// `out`, against the base's tensors `base` (their element counts and dtypes:
// the data is not read). kCorruption for any violation the decoder's first
// step finds; the metadata's other fields (versions, base hash, totals) are
// not checked: DecodeCompactDelta does that. On an error no slot of `out`
// that no parse wrote is visible: each tensor whose stream was refused is
// left empty (not bf16, no ranks, diffs, escapes or raw changes; its
// buffers' capacity kept).
Status ParseCompactDelta(const SafetensorsFile& file, std::span<const TensorView> base, int threads,
                         CompactParse& out);

// A compressed anchor of `tensors` (written in name order; names unique) for
// `model_version`. Deterministic. The result owns all its bytes.
Result<EncodedPatch> EncodeCompressedAnchor(uint64_t model_version, std::span<const TensorView> tensors,
                                            int threads = 0);

struct DecodedAnchor {
  uint64_t model_version = 0;
  std::vector<WeightState::Tensor> tensors;  // sorted by name

  std::vector<TensorView> views() const;  // into `tensors`
};

// True when `file`'s metadata says format="deltasync_compressed_anchor".
bool IsCompressedAnchor(const SafetensorsFile& file);

// Decodes a compressed anchor, chunks in parallel on up to `threads` threads.
Result<DecodedAnchor> DecodeCompressedAnchor(const SafetensorsFile& file, int threads = 0);

}  // namespace deltasync
