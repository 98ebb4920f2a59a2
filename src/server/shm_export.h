// --shm NAME: the held state in a POSIX shared-memory object, under a
// seqlock, with the elements the newest update changed (docs/shm.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "server/sink.h"

namespace deltasync::server {

// Little-endian field access in the --shm region (docs/shm.md), shared by the
// writer (shm_export.cc) and the reader (shm_reader.cc).
inline void ShmPut32(uint8_t* p, size_t off, uint32_t v) { std::memcpy(p + off, &v, 4); }
inline void ShmPut64(uint8_t* p, size_t off, uint64_t v) { std::memcpy(p + off, &v, 8); }
inline uint32_t ShmGet32(const uint8_t* p, size_t off) {
  uint32_t v;
  std::memcpy(&v, p + off, 4);
  return v;
}
inline uint64_t ShmGet64(const uint8_t* p, size_t off) {
  uint64_t v;
  std::memcpy(&v, p + off, 8);
  return v;
}

// "/name" for a valid --shm argument ("name" or "/name": 1-200 characters
// from [A-Za-z0-9._-], no other '/'); kInvalidArgument otherwise.
Result<std::string> NormalizeShmName(const std::string& name);

class ShmExport : public StateSink {
 public:
  // Removes a stale object of that name (a killed daemon's) so that readers
  // never map a region whose writer is gone; the region itself is created at
  // the first Export, when the tensor table is known.
  static Result<std::unique_ptr<ShmExport>> Create(const std::string& name);
  // Marks the region closed and unlinks the name (mappings stay valid).
  ~ShmExport() override;

  Status Export(uint64_t version, const StateHash& hash, const WeightState& state, const FileSet& files) override;
  std::string Describe() const override { return "--shm " + name_; }

 private:
  explicit ShmExport(std::string name) : name_(std::move(name)) {}
  Status CreateRegion(const WeightState& state);
  bool SameLayout(const WeightState& state) const;
  // Writes `state` into the region inside one seqlock write section.
  void WriteVersion(uint64_t version, const StateHash& hash, const WeightState& state, bool first);

  std::string name_;
  uint8_t* base_ = nullptr;
  size_t size_ = 0;
  uint64_t version_ = 0;  // the version the region holds
  // Per tensor, in state order (sorted by name): where its bytes live.
  struct Slot {
    std::string name;
    size_t entry_offset = 0;
    size_t data_offset = 0;
    size_t data_bytes = 0;
    size_t width = 0;
  };
  std::vector<Slot> slots_;
  size_t changes_offset_ = 0;
  uint64_t changes_capacity_ = 0;
};

}  // namespace deltasync::server
