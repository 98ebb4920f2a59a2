// --out DIR [--keep N]: one safetensors file per held version, for engines
// that reload weights from disk.
#pragma once

#include <memory>
#include <string>

#include "deltasync/store.h"
#include "server/sink.h"

namespace deltasync::server {

// DIR/step_000012.safetensors: the full state as a plain checkpoint
// (metadata format "pt" and model_version 12: CheckpointMetadata),
// written atomically (temporary file, fsync, rename), then DIR/latest.json
// ({"version", "file", "state_hash", "size"}) names it. Only the newest
// `keep` step_*.safetensors files are kept; other files are never touched.
class OutDirSink : public StateSink {
 public:
  // Creates DIR when missing. kInvalidArgument for keep < 1.
  static Result<std::unique_ptr<OutDirSink>> Open(const std::string& dir, int keep);

  Status Export(uint64_t version, const StateHash& hash, const WeightState& state) override;
  std::string Describe() const override { return "--out " + dir_; }

  // "step_000012.safetensors".
  static std::string FileName(uint64_t version);

 private:
  OutDirSink(std::shared_ptr<LocalStore> store, std::string dir, int keep)
      : store_(std::move(store)), dir_(std::move(dir)), keep_(keep) {}
  Status Prune(uint64_t newest);

  std::shared_ptr<LocalStore> store_;
  std::string dir_;
  int keep_;
};

}  // namespace deltasync::server
