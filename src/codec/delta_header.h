// What every writer of a TRL delta (gap_delta or raw) shares (internal to
// src/codec and the fused detect+encode, src/bf16/detect_encode.cc): the checks
// of a delta's PatchInfo and its safetensors header, so that EncodeDelta and
// DetectAndEncodeGapDelta write the same bytes and refuse with the same words.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "deltasync/patch.h"
#include "deltasync/safetensors.h"
#include "deltasync/status.h"

namespace deltasync::codec {

// kInvalidArgument when `info` cannot describe a TRL delta of `changed`
// elements: total_elements below it, a compact encoding, a base version not
// older than model_version (in that order; EncodeDelta's messages).
Status CheckDeltaInfo(const PatchInfo& info, uint64_t changed);

// The header of a delta of `changed` elements in `num_params` tensors whose
// idx/val tensors are `tensors` (name order, each tensor's .idx then .val).
Result<std::vector<uint8_t>> EncodeDeltaHeader(const PatchInfo& info, uint64_t num_params, uint64_t changed,
                                               std::span<const TensorLayout> tensors);

}  // namespace deltasync::codec
