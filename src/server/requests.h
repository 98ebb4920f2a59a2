// The JSON bodies the daemon accepts, parsed and checked against the
// schemas in docs/serve.md. Every function returns kInvalidArgument with a
// message naming the field and the rule (the HTTP layer answers 400 with it).
// Unknown fields are ignored, so newer clients keep working.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "deltasync/status.h"

namespace deltasync::server {

// POST /update_weights: {"update_info": {"repo_id", "filename", "update_kind"}}.
// filename is required and must be a valid bucket key (ValidateKey);
// repo_id and update_kind are optional strings; update_kind, when given, is
// "dense" or "sparse_flat".
struct UpdateWeightsRequest {
  std::string repo_id;
  std::string filename;
  std::string update_kind;
};
Result<UpdateWeightsRequest> ParseUpdateWeights(std::string_view body);

// POST /start_weight_update: {"is_checkpoint_format": bool} (required).
Result<bool> ParseStartWeightUpdate(std::string_view body);

// POST /notify: {"version": V}, V an integer >= 1.
Result<uint64_t> ParseNotify(std::string_view body);

// Bodies of /pause, /resume, /finish_weight_update: empty, or a JSON object
// (whose fields are ignored).
Status ParseOptionalObject(std::string_view body);

// POST /pause?mode=...: "keep" (the default), "wait" or "abort". The daemon
// holds its version in every mode; the mode is accepted for TRL/vLLM
// compatibility and checked so that typos are loud.
Result<std::string> ParsePauseMode(const std::string* mode);

}  // namespace deltasync::server
