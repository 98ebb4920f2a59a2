// StateSink: where the daemon hands each version it holds to the inference
// engine (--out folders or files, the --shm region). The watcher thread calls Export
// after every move, and again on later cycles while a previous Export failed,
// so a sink is never left behind silently.
#pragma once

#include <cstdint>
#include <string>

#include "deltasync/manifest.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/weight_state.h"

namespace deltasync::server {

class StateSink {
 public:
  virtual ~StateSink() = default;
  // Makes `state` (verified, at `version`, hashing to `hash`) visible to
  // readers. On error, readers still see the previously exported version,
  // whole. `files`: the version's side files as the manifest lists them
  // (Manifest::FilesAt; empty for a version published from a plain file), for
  // sinks that write model folders. Called from one thread at a time.
  virtual Status Export(uint64_t version, const StateHash& hash, const WeightState& state,
                        const FileSet& files) = 0;
  // "--out /dir", "--shm /name": for messages.
  virtual std::string Describe() const = 0;
};

}  // namespace deltasync::server
