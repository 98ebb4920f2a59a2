// Small helpers shared by the CLI's commands.
#pragma once

#include <cstdint>
#include <cstdio>
#include <vector>
#include <string>

#include "deltasync/patch.h"
#include "deltasync/status.h"
#include "deltasync/weight_state.h"

namespace deltasync::cli {

// Writes the encoded patch to `path` atomically (temp file + fsync + rename
// in the same directory); `path` is untouched on failure.
Status WritePatchFile(const std::string& path, const EncodedPatch& patch);

// Writes `state` as a plain checkpoint to `path`, atomically, with the
// metadata transformers checks and `apply` reads (CheckpointMetadata:
// format "pt", model_version).
Status WriteStateFile(const std::string& path, const WeightState& state, uint64_t version);

// "1.23 MB", "1.20 GB" (decimal units).
std::string HumanBytes(double bytes);

}  // namespace deltasync::cli
