// ShmReader: the reader side of docs/shm.md. The region belongs to another
// process, so every offset is checked before use: the static table once at
// Open, the per-version fields on every copy (a copy taken while the writer
// was inside may hold garbage there; it is discarded, never followed).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "deltasync/shm.h"
#include "server/shm_export.h"

namespace deltasync {
namespace {

using namespace shm_layout;


// [offset, offset + bytes) lies inside a region of `size` bytes.
bool Inside(uint64_t offset, uint64_t bytes, size_t size) { return offset <= size && bytes <= size - offset; }

std::atomic_ref<uint64_t> SeqOf(const uint8_t* base) {
  // atomic_ref needs a non-const object; the mapping is read-only and only
  // ever loaded from.
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(const_cast<uint8_t*>(base) + kOffSeq));
}

}  // namespace

Result<std::unique_ptr<ShmReader>> ShmReader::Open(const std::string& name) {
  DS_ASSIGN_OR_RETURN(std::string normalized, server::NormalizeShmName(name));
  const std::string label = "shm " + normalized;
  int fd = ::shm_open(normalized.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(label + " does not exist (no version held yet?)");
    return Status::IOError(label + ": cannot open: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Status::IOError(label + ": cannot stat: " + std::strerror(errno));
  }
  size_t size = static_cast<size_t>(st.st_size);
  if (size < kHeaderBytes) {
    ::close(fd);
    return Status::NotFound(label + " is being created; retry");
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return Status::IOError(label + ": cannot map: " + std::strerror(errno));
  std::unique_ptr<ShmReader> reader(new ShmReader());
  reader->base_ = static_cast<const uint8_t*>(p);
  reader->size_ = size;
  const uint8_t* h = reader->base_;

  // The writer stores the magic last, after a release fence.
  char magic[8];
  std::memcpy(magic, h + kOffMagic, 8);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (std::all_of(magic, magic + 8, [](char c) { return c == 0; })) {
    return Status::NotFound(label + " is being created; retry");
  }
  if (std::memcmp(magic, kMagic, 8) != 0) return Status::Corruption(label + ": bad magic; not a deltasync region");
  if (server::ShmGet32(h, kOffLayoutVersion) != kLayoutVersion) {
    return Status::Unsupported(label + ": layout version " + std::to_string(server::ShmGet32(h, kOffLayoutVersion)) +
                               ", this reader knows 1");
  }
  if (server::ShmGet32(h, kOffHeaderBytes) != kHeaderBytes || server::ShmGet64(h, kOffRegionBytes) > size ||
      server::ShmGet64(h, kOffTableEntryBytes) != kTableEntryBytes) {
    return Status::Corruption(label + ": header sizes disagree with the layout or the object's size");
  }
  uint64_t count = server::ShmGet64(h, kOffTensorCount);
  uint64_t table = server::ShmGet64(h, kOffTableOffset);
  if (count > size / kTableEntryBytes || !Inside(table, count * kTableEntryBytes, size)) {
    return Status::Corruption(label + ": the tensor table lies outside the region");
  }
  reader->changes_offset_ = server::ShmGet64(h, kOffChangesOffset);
  uint64_t capacity = server::ShmGet64(h, kOffChangesCapacity);
  if (capacity > size / 8 || !Inside(reader->changes_offset_, capacity * 8, size)) {
    return Status::Corruption(label + ": the change lists lie outside the region");
  }
  reader->changes_end_ = reader->changes_offset_ + capacity * 8;
  for (uint64_t i = 0; i < count; ++i) {
    size_t e = table + i * kTableEntryBytes;
    TensorInfo t;
    t.entry_offset = e;
    uint64_t name_off = server::ShmGet64(h, e + kEntNameOffset);
    uint32_t name_len = server::ShmGet32(h, e + kEntNameBytes);
    uint32_t ndim = server::ShmGet32(h, e + kEntNdim);
    if (!Inside(name_off, name_len, size) || ndim > kMaxDims) {
      return Status::Corruption(label + ": tensor entry " + std::to_string(i) + " is malformed");
    }
    t.name.assign(reinterpret_cast<const char*>(h + name_off), name_len);
    char dtype[9] = {};
    std::memcpy(dtype, h + e + kEntDtype, 8);
    std::optional<DType> parsed = ParseDType(dtype);
    if (!parsed) return Status::Corruption(label + ": tensor '" + t.name + "' has unknown dtype '" + dtype + "'");
    t.dtype = *parsed;
    for (uint32_t d = 0; d < ndim; ++d) t.shape.push_back(server::ShmGet64(h, e + kEntShape + 8 * d));
    t.data_offset = server::ShmGet64(h, e + kEntDataOffset);
    t.data_bytes = server::ShmGet64(h, e + kEntDataBytes);
    std::optional<uint64_t> elements = CheckedElementCount(t.shape);
    if (!Inside(t.data_offset, t.data_bytes, size) || !elements ||
        *elements > t.data_bytes / DTypeSize(t.dtype) || *elements * DTypeSize(t.dtype) != t.data_bytes) {
      return Status::Corruption(label + ": tensor '" + t.name + "' has data outside the region or a size that "
                                "disagrees with its shape");
    }
    reader->tensors_.push_back(std::move(t));
  }
  return reader;
}

ShmReader::~ShmReader() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

uint64_t ShmReader::sequence() const { return SeqOf(base_).load(std::memory_order_acquire); }

bool ShmReader::CopyOnce(ShmSnapshot& out) const {
  const uint8_t* h = base_;
  auto seq = SeqOf(h);
  uint64_t s1 = seq.load(std::memory_order_acquire);
  if (s1 & 1) return false;
  out.sequence = s1;
  out.version = server::ShmGet64(h, kOffVersion);
  out.state_hash.hi = server::ShmGet64(h, kOffStateHashHi);
  out.state_hash.lo = server::ShmGet64(h, kOffStateHashLo);
  out.base_version = server::ShmGet64(h, kOffBaseVersion);
  out.changes_complete = server::ShmGet32(h, kOffChangesComplete) == 1;
  out.closed = (server::ShmGet32(h, kOffFlags) & kFlagClosed) != 0;
  out.updated_unix_ms = server::ShmGet64(h, kOffUpdatedUnixMs);
  out.tensors.resize(tensors_.size());
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorInfo& t = tensors_[i];
    ShmTensor& o = out.tensors[i];
    o.name = t.name;
    o.dtype = t.dtype;
    o.shape = t.shape;
    o.data.assign(h + t.data_offset, h + t.data_offset + t.data_bytes);
    uint64_t off = server::ShmGet64(h, t.entry_offset + kEntChangesOffset);
    uint64_t n = server::ShmGet64(h, t.entry_offset + kEntChangesCount);
    // Garbage only while the writer is inside: discard, never follow it.
    if (off < changes_offset_ || n > (changes_end_ - changes_offset_) / 8 || !Inside(off, n * 8, changes_end_)) {
      return false;
    }
    o.changed.resize(n);
    if (n) std::memcpy(o.changed.data(), h + off, n * 8);
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  return seq.load(std::memory_order_relaxed) == s1;
}

Result<ShmSnapshot> ShmReader::Read(double timeout_seconds) const {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  ShmSnapshot snapshot;
  for (int attempt = 0;; ++attempt) {
    if (CopyOnce(snapshot)) return snapshot;
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::IOError("shm region busy: no consistent copy within " + std::to_string(timeout_seconds) + " s");
    }
    // Spin briefly (a write section is short), then yield the CPU.
    if (attempt > 16) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace deltasync
