// The --shm region of `deltasync serve`: a POSIX shared-memory object with
// the full state of the held version, a seqlock-style sequence counter and
// the elements the newest update changed, so an inference engine on the same
// host can map it and copy only what changed. docs/shm.md specifies every
// byte; the constants below are that layout, for C++ readers.
//
// ShmReader is a complete reader (it copies a consistent snapshot); engines
// that copy straight into their own buffers follow docs/shm.md instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"

namespace deltasync {

namespace shm_layout {
inline constexpr char kMagic[8] = {'D', 'S', 'Y', 'N', 'C', 'S', 'H', 'M'};
inline constexpr uint32_t kLayoutVersion = 1;
inline constexpr size_t kHeaderBytes = 256;
inline constexpr size_t kTableEntryBytes = 128;
inline constexpr size_t kMaxDims = 8;
// Header fields: byte offsets from the start of the region (all integers
// little-endian).
inline constexpr size_t kOffMagic = 0;            // char[8]
inline constexpr size_t kOffLayoutVersion = 8;    // u32
inline constexpr size_t kOffHeaderBytes = 12;     // u32
inline constexpr size_t kOffSeq = 16;             // u64, odd while the writer is inside
inline constexpr size_t kOffVersion = 24;         // u64, 0 before the first version
inline constexpr size_t kOffStateHashHi = 32;     // u64
inline constexpr size_t kOffStateHashLo = 40;     // u64
inline constexpr size_t kOffBaseVersion = 48;     // u64, the version the change lists start from
inline constexpr size_t kOffChangesComplete = 56; // u32, 1: the lists name every changed element
inline constexpr size_t kOffFlags = 60;           // u32, bit 0: closed (the writer stopped)
inline constexpr size_t kOffUpdatedUnixMs = 64;   // u64
inline constexpr size_t kOffRegionBytes = 72;     // u64
inline constexpr size_t kOffTensorCount = 80;     // u64
inline constexpr size_t kOffTableOffset = 88;     // u64
inline constexpr size_t kOffTableEntryBytes = 96; // u64
inline constexpr size_t kOffNamesOffset = 104;    // u64
inline constexpr size_t kOffDataOffset = 112;     // u64
inline constexpr size_t kOffDataBytes = 120;      // u64
inline constexpr size_t kOffChangesOffset = 128;  // u64
inline constexpr size_t kOffChangesCapacity = 136;// u64, u64 index slots
inline constexpr size_t kOffChangedElements = 144;// u64, slots used by this version
inline constexpr size_t kOffWriterPid = 152;      // u64
// Tensor table entry fields: offsets from the start of the entry.
inline constexpr size_t kEntNameOffset = 0;       // u64 (from the region start)
inline constexpr size_t kEntNameBytes = 8;        // u32
inline constexpr size_t kEntNdim = 12;            // u32
inline constexpr size_t kEntDtype = 16;           // char[8], safetensors spelling, NUL-padded
inline constexpr size_t kEntDataOffset = 24;      // u64 (from the region start)
inline constexpr size_t kEntDataBytes = 32;       // u64
inline constexpr size_t kEntChangesOffset = 40;   // u64 (from the region start)
inline constexpr size_t kEntChangesCount = 48;    // u64
inline constexpr size_t kEntShape = 56;           // u64[8]
inline constexpr uint32_t kFlagClosed = 1;
}  // namespace shm_layout

// One tensor of a snapshot.
struct ShmTensor {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> data;
  // Flat indices that differ from base_version, ascending (meaningful when
  // changes_complete).
  std::vector<uint64_t> changed;

  TensorView view() const { return {name, dtype, shape, data}; }
};

// A consistent copy of the region: every field from one writer update.
struct ShmSnapshot {
  uint64_t sequence = 0;  // the (even) seqlock value it was read at
  uint64_t version = 0;
  StateHash state_hash;
  uint64_t base_version = 0;
  bool changes_complete = false;
  bool closed = false;
  uint64_t updated_unix_ms = 0;
  std::vector<ShmTensor> tensors;
};

class ShmReader {
 public:
  // Maps the object read-only and validates the header and tensor table
  // (every offset inside the region). kNotFound when there is no such object,
  // kCorruption when it is not a deltasync region, kUnsupported for a newer
  // layout version.
  static Result<std::unique_ptr<ShmReader>> Open(const std::string& name);
  ~ShmReader();

  // The current seqlock value (odd while the writer is inside).
  uint64_t sequence() const;
  // A consistent snapshot. Retries while the writer is inside or moved on
  // during the copy; kIOError ("busy") after `timeout_seconds`.
  Result<ShmSnapshot> Read(double timeout_seconds = 10) const;

 private:
  ShmReader() = default;
  // The table, validated once at Open (it never changes after creation).
  struct TensorInfo {
    std::string name;
    DType dtype = DType::kBF16;
    std::vector<uint64_t> shape;
    size_t entry_offset = 0;
    size_t data_offset = 0;
    size_t data_bytes = 0;
  };
  bool CopyOnce(ShmSnapshot& out) const;

  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  std::vector<TensorInfo> tensors_;
  size_t changes_offset_ = 0;
  size_t changes_end_ = 0;
};

}  // namespace deltasync
