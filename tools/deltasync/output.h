// Small helpers shared by the CLI's commands.
#pragma once

#include <cstdint>
#include <cstdio>
#include <utility>
#include <vector>
#include <string>
#include <nlohmann/json.hpp>

#include "deltasync/patch.h"
#include "deltasync/status.h"
#include "deltasync/store.h"
#include "deltasync/weight_state.h"

namespace deltasync::cli {

// Writes the encoded patch to `path` atomically (temp file + fsync + rename
// in the same directory); `path` is untouched on failure.
Status WritePatchFile(const std::string& path, const EncodedPatch& patch);

// Writes `state` as a plain checkpoint to `path`, atomically, with the
// metadata transformers checks and `apply` reads (CheckpointMetadata:
// format "pt", model_version).
Status WriteStateFile(const std::string& path, const WeightState& state, uint64_t version);

// Refuses an output path that names the same file as one of `inputs` (the
// same inode: a link or another spelling of it counts): `diff -o OLD` would
// replace the base weights, the only thing the patch applies to, with the
// patch. A missing output is fine.
// `inputs`: (what the input is, e.g. "OLD"; its path).
Status CheckOutputIsNotInput(const std::string& out_path,
                             const std::vector<std::pair<std::string, std::string>>& inputs);

// A live progress line on stderr, drawn only when stderr is a terminal: a
// pipe or a log file gets none of it (no \r, no escape codes).
void DrawProgressLine(const std::string& text);
void EraseProgressLine();

// A transfer's progress for DrawProgressLine: "what: 1.20 GB of 3.40 GB,
// 410 MB/s" (the rate since `started_ms` on a steady clock).
std::string TransferText(const std::string& what, uint64_t done, uint64_t total, double elapsed_s);

// `value` as one line on stdout (--json).
void PrintJson(const nlohmann::ordered_json& value);

// "1.23 MB", "1.20 GB" (decimal units).
std::string HumanBytes(double bytes);

}  // namespace deltasync::cli
