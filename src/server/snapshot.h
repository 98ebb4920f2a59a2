// What the watcher reports about itself: the one structure /status, /healthz
// and /metrics read. Copied out under the watcher's lock, so a route never
// waits for an update in progress.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "deltasync/replica.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"

namespace deltasync::server {

// ErrorCodeName with '_' for ' ' ("not_found", "io_error"): the spelling of
// error kinds in JSON replies and metric labels.
inline std::string KindName(ErrorCode code) {
  std::string name(ErrorCodeName(code));
  for (char& c : name) {
    if (c == ' ') c = '_';
  }
  return name;
}

// A failure, kept until the stage that failed succeeds again.
struct ErrorRecord {
  std::string stage;  // "manifest" (reading it), "update" (fetch/verify/apply), "export" (--out/--shm)
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
  uint64_t unix_ms = 0;
};

struct FollowerSnapshot {
  uint64_t version = 0;  // the verified version held; 0 before the first
  StateHash state_hash;
  uint64_t updated_unix_ms = 0;  // when `version` was reached
  uint64_t latest_version = 0;   // the newest version in the manifest as last read
  uint64_t lag_versions = 0;     // versions in that manifest newer than `version`
  uint64_t oldest_pending_unix_ms = 0;  // created_unix_ms of the first of them; 0 when none
  bool paused = false;
  bool in_weight_update = false;  // between /start_weight_update and /finish_weight_update
  bool manifest_read_ever = false;
  bool waiting_for_first_version = false;  // no manifest in the bucket yet: nothing published
  std::chrono::steady_clock::time_point last_manifest_read;  // the last successful one
  std::optional<ErrorRecord> last_error;
  std::string export_error;  // non-empty while an --out/--shm export is behind `version`
  std::vector<BadObject> bad_objects;  // Replica::bad_objects(): routed around, not fetched again
};

}  // namespace deltasync::server
