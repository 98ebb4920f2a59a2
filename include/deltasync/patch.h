// Patches: anchors (full snapshots) and deltas (changed elements) in the TRL
// sparse_weight_patch format (docs/format.md, "Patch objects";
// ../shared/reference/trl-wire-format.md).
//
//   anchor: one full tensor per parameter under its own name, sparse="False".
//   delta:  per changed parameter `{name}.idx` (encoded flat indices) and
//           `{name}.val` (absolute new values, 1-D), sparse="True".
// Index encodings: raw (I32 absolute positions; I64 when a position exceeds
// 2^31-1, a deltasync extension) and gap_delta (g = idx[k]-idx[k-1]-1 with
// idx[-1] = -1, U16 when every gap of the tensor fits, else U32; U64 beyond
// that, a deltasync extension). The reader also accepts the older layout
// `{name}.indices` / `{name}.values` and refuses nvcomp_cascaded (kUnsupported).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deltasync/changes.h"
#include "deltasync/safetensors.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"
#include "deltasync/weight_state.h"

namespace deltasync {

enum class PatchKind { kAnchor, kDelta };
// kRaw and kGapDelta are TRL's; kCompact is deltasync's own (compact deltas
// and compressed anchors, include/deltasync/compact.h), which TRL cannot read.
enum class IndexEncoding { kRaw, kGapDelta, kCompact };

std::string_view EncodingName(IndexEncoding encoding);  // "raw", "gap_delta", "compact"
// kInvalidArgument for unknown names, kUnsupported for "nvcomp_cascaded".
Result<IndexEncoding> ParseEncoding(std::string_view name);

// What a patch's __metadata__ says (TRL keys plus deltasync's own, which all
// start with "deltasync_" and which TRL ignores).
struct PatchInfo {
  PatchKind kind = PatchKind::kDelta;
  uint64_t model_version = 0;
  IndexEncoding encoding = IndexEncoding::kGapDelta;
  // deltasync_base_version: the version a delta applies to. Absent in files
  // written by TRL, where a delta is relative to model_version - 1.
  std::optional<uint64_t> base_version;
  uint64_t total_elements = 0;
  uint64_t total_changed_elements = 0;
  uint64_t num_changed_params = 0;
  // deltasync_base_state_hash on a TRL delta (gap_delta or raw): the state
  // hash (HashState) of the exact state it applies to. `deltasync diff` writes
  // it and `deltasync apply` refuses a base that does not hash to it; absent
  // in TRL's files and in a bucket's objects (their manifest names the hashes).
  std::optional<StateHash> base_state_hash;
};

// An encoded patch as a scatter-gather list for Store::Put: `parts` point
// into `owned` and into the caller's tensors (anchors are not copied), so the
// caller's tensors must outlive it.
struct EncodedPatch {
  std::vector<std::vector<uint8_t>> owned;
  std::vector<ByteSpan> parts;
  uint64_t size = 0;
};

// An anchor of `tensors` (written in name order) for `model_version`.
Result<EncodedPatch> EncodeAnchor(uint64_t model_version, std::span<const TensorView> tensors);

// A delta for `info.model_version` holding `changes` (written in name order).
// info.total_elements must be the element count of the whole state; the
// changed counts are computed here. Deterministic.
Result<EncodedPatch> EncodeDelta(const PatchInfo& info, std::span<const TensorChanges> changes);
// The same delta into `out`, for a caller that encodes again and again (a
// training loop): on success `out` holds exactly the patch the call above
// returns (the same bytes); on an error (the same errors) it holds none
// (`parts` empty, `size` 0). The buffers `out` owned before are written over
// in place, by position (owned[1 + 2i] and owned[2 + 2i]: the i-th changed
// tensor's index and value bytes, in name order), so a delta about as large
// as the last touches no fresh pages. Whatever `out` held before is
// overwritten: its parts must no longer be in use. The memory held is what
// `out` owns, as large as its largest patch so far; destroy `out` to free it.
Status EncodeDelta(const PatchInfo& info, std::span<const TensorChanges> changes, EncodedPatch& out);

// One tensor's gap_delta changes as the file holds them, not decoded: the
// replica applies them straight from these bytes (ApplyGapChanges), without
// materialising 64-bit indices. `gaps` and `values` point into the patch's
// file. `chunk_starts[c]` is the flat index of change c * kGapChunk (the
// prefix sums of the gaps, computed and checked for overflow when decoding),
// so that chunks of one tensor apply in parallel; `last` is the largest index.
struct EncodedChanges {
  static constexpr size_t kGapChunk = size_t{1} << 16;

  std::string name;
  DType dtype = DType::kBF16;       // of the values
  DType index_dtype = DType::kU16;  // U16, U32 or U64 gaps
  ByteSpan gaps;
  ByteSpan values;
  size_t count = 0;
  std::vector<uint64_t> chunk_starts;
  uint64_t last = 0;  // meaningful when count > 0
};

// A decoded, validated patch. Anchors: `dense` views into `file`. Deltas:
// `changes` sorted by name, indices strictly ascending; or, when decoded with
// keep_gaps_encoded and the delta is gap_delta throughout, `encoded` instead
// (sorted by name, `changes` empty).
struct DecodedPatch {
  PatchInfo info;
  std::vector<TensorView> dense;
  std::vector<TensorChanges> changes;
  std::vector<EncodedChanges> encoded;
  SafetensorsFile file;  // keeps the bytes behind `dense` and `encoded` alive
};

struct DecodePatchOptions {
  // A gap_delta delta's indices stay encoded (DecodedPatch::encoded), with the
  // same checks as when they are decoded.
  bool keep_gaps_encoded = false;
};

// Decodes a parsed safetensors file as a patch. Checks metadata (format,
// version, sparse, model_version, encoding; TRL v1 files carry neither
// format nor version and are recognised by sparse + model_version), pairing of idx/val tensors,
// index dtypes, 1-D shapes, equal lengths, strictly ascending indices without
// overflow. kCorruption naming file, tensor and rule; kUnsupported for
// nvcomp_cascaded.
Result<DecodedPatch> DecodePatch(SafetensorsFile file, const DecodePatchOptions& options = {});

// Whether a file's __metadata__ says it is a TRL patch (what DecodePatch
// reads) rather than a plain checkpoint: 'format' sparse_weight_patch (or
// the older anchor_checkpoint), or TRL v1's 'sparse' and 'model_version'
// without any 'format'. A plain checkpoint (a model's weights, metadata such
// as {"format": "pt"} or none) carries neither.
bool LooksLikeTrlPatch(const Metadata& metadata);

// Checks that `changes` can be applied to `state`: every tensor exists with
// the same dtype and every index is below its element count. kCorruption
// naming tensor and index otherwise. Does not modify anything.
Status ValidateChanges(const WeightState& state, std::span<const TensorChanges> changes);

// Scatters the values into `state`. REQUIRES: ValidateChanges(state, changes) is OK.
void ApplyChanges(WeightState& state, std::span<const TensorChanges> changes, int threads = 0);

// ApplyChanges, HashChanges and the old values an undo needs, in one pass
// per chunk of changes (parallel over and within tensors, up to `threads`):
// gathers the overwritten values into old[i] (entry i of `changes`, its
// dtype's bytes per change; resized: reuse `old` across calls to spare its
// page faults), sums the state-hash change and scatters the new values.
// Returns HashChanges(state before, changes), summed from the gathered
// values (no second gather). REQUIRES: ValidateChanges(state, changes) is OK.
StateHash ApplyChangesWithUndo(WeightState& state, std::span<const TensorChanges> changes, int threads,
                               std::vector<std::vector<uint8_t>>& old);
// Puts back what ApplyChangesWithUndo(state, changes, threads, old) overwrote.
void UndoChanges(WeightState& state, std::span<const TensorChanges> changes,
                 std::span<const std::vector<uint8_t>> old, int threads = 0);

// ValidateChanges for encoded changes: the same checks and messages.
Status ValidateEncodedChanges(const WeightState& state, std::span<const EncodedChanges> changes);

// Applies encoded changes in one pass per chunk of changes (parallel over and
// within tensors, up to `threads`): decodes the gaps, adds each element's
// state-hash change (HashChanges' result) and scatters the value, keeping the
// overwritten values in `undo` (resized; reuse it across calls to spare its
// page faults). Returns the change to the state's hash.
// REQUIRES: ValidateChanges(state, changes) is OK.
StateHash ApplyGapChanges(WeightState& state, std::span<const EncodedChanges> changes, int threads,
                          std::vector<uint8_t>& undo);
// Puts back what ApplyGapChanges(state, changes, threads, undo) overwrote.
void UndoGapChanges(WeightState& state, std::span<const EncodedChanges> changes, int threads,
                    const std::vector<uint8_t>& undo);
// The changes decoded (64-bit indices, values copied), for callers that need
// TensorChanges (change tracking).
std::vector<TensorChanges> DecodeGapChanges(std::span<const EncodedChanges> changes);

}  // namespace deltasync
