// The __metadata__ vocabulary of TRL's sparse_weight_patch files (internal to
// src/codec). Spellings follow TRL's PatchMetadata.to_metadata_dict(): every
// value is Python's str() of the field, so booleans are "True"/"False",
// integers plain decimal and floats Python's repr ("0.0", "0.9658", "1e-05").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/decimal.h"

namespace deltasync::patchmeta {

// Keys written by TRL's current (idx/val) writer, anchors and deltas alike.
inline constexpr std::string_view kFormat = "format";
inline constexpr std::string_view kVersion = "version";
inline constexpr std::string_view kSparse = "sparse";
inline constexpr std::string_view kModelVersion = "model_version";
inline constexpr std::string_view kNumChangedParams = "num_changed_params";
inline constexpr std::string_view kTotalChangedElements = "total_changed_elements";
inline constexpr std::string_view kTotalElements = "total_elements";
inline constexpr std::string_view kSparsity = "sparsity";
inline constexpr std::string_view kEncoding = "encoding";
// deltasync's own key (TRL ignores keys it does not know).
inline constexpr std::string_view kBaseVersion = "deltasync_base_version";
// The state hash a TRL delta applies to (PatchInfo::base_state_hash; the same
// key and hex form as a compact delta's kBaseStateHashKey).
inline constexpr std::string_view kBaseStateHash = "deltasync_base_state_hash";
// The older TRL writer's JSON list of changed parameter names (deltas only).
inline constexpr std::string_view kChangedParams = "changed_params";

inline constexpr std::string_view kFormatValue = "sparse_weight_patch";
// What the older TRL writer put in "format" for anchors.
inline constexpr std::string_view kOldAnchorFormatValue = "anchor_checkpoint";
inline constexpr std::string_view kVersionValue = "1";
inline constexpr std::string_view kTrue = "True";
inline constexpr std::string_view kFalse = "False";

// Tensor-name suffixes of a delta: current layout and the older one.
inline constexpr std::string_view kIdxSuffix = ".idx";
inline constexpr std::string_view kValSuffix = ".val";
inline constexpr std::string_view kOldIdxSuffix = ".indices";
inline constexpr std::string_view kOldValSuffix = ".values";
// The older writer's placeholder tensor in a delta with no changes.
inline constexpr std::string_view kOldEmptyDelta = "__empty_delta__";

// Python's repr() of a float (what str() gives for a float field): the
// shortest digits that round-trip, positional when the decimal exponent is in
// [-4, 16), else scientific with a signed exponent of at least two digits.
std::string PythonFloatRepr(double value);

// TRL's sparsity, 1 - changed / max(total, 1), computed as Python does it in
// double precision (exact integer-to-double conversion below 2^53).
double Sparsity(uint64_t changed, uint64_t total);

// A non-negative decimal integer as Python's str(int) writes it (digits only);
// nullopt for anything else or on overflow (common/decimal.h).
using ::deltasync::ParseDecimal;

}  // namespace deltasync::patchmeta
