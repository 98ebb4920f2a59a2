// Blob: immutable bytes with shared ownership, backed by memory or an mmap.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "deltasync/status.h"
#include "deltasync/tensor.h"

namespace deltasync {

// Cheap to copy (shared). The bytes never change while any copy lives, so
// views into bytes() stay valid for as long as a copy of the Blob is held.
class BlobBuffer;
class BufferPool;

class Blob {
 public:
  Blob() = default;
  // Takes ownership of `bytes`.
  static Blob FromVector(std::vector<uint8_t> bytes);
  // Maps `path` read-only. An empty file gives an empty Blob. The file must not
  // be modified while mapped (deltasync only ever replaces files by rename):
  // a file cut short while mapped does not kill the process with SIGBUS; the
  // pages past the cut read as zeros and cut() turns true
  // (common/mapping_guard.h), so a reader checks cut() after reading.
  static Result<Blob> MapFile(const std::string& path);
  // Reads `path` into memory (for files that may change underneath).
  static Result<Blob> ReadFile(const std::string& path);
  // Takes over `buffer`'s pages (no copy); `buffer` is left empty. When the
  // buffer came from a BufferPool, the last copy of the Blob hands the pages
  // back to that pool (if it still exists) instead of unmapping them.
  static Blob FromBuffer(BlobBuffer&& buffer);

  ByteSpan bytes() const { return impl_ ? impl_->bytes : ByteSpan(); }
  size_t size() const { return bytes().size(); }
  const uint8_t* data() const { return bytes().data(); }
  // True when the file behind a MapFile Blob was cut short while mapped and
  // part of the bytes read as zeros instead of the file's: what was read
  // from it must not be used. Always false for other Blobs.
  bool cut() const { return impl_ && impl_->cut(); }

  struct Impl {
    virtual ~Impl() = default;
    virtual bool cut() const { return false; }
    ByteSpan bytes;
  };

 private:
  explicit Blob(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Writable bytes on their way to becoming a Blob (a download, say), in
// anonymous pages of their own: never zero-filled or copied by deltasync
// (bytes are unspecified until written), grown by remapping pages rather
// than copying them, huge-page-advised from 2 MiB on. Move-only.
class BlobBuffer {
 public:
  BlobBuffer() = default;
  // Growth to 2 MiB and more takes released pages from `pool` when it holds a
  // mapping that fits (see BufferPool), and the pages go back to it when the
  // buffer, or the Blob made from it, is released.
  explicit BlobBuffer(std::weak_ptr<BufferPool> pool) : pool_(std::move(pool)) {}
  BlobBuffer(BlobBuffer&& other) noexcept;
  BlobBuffer& operator=(BlobBuffer&& other) noexcept;
  BlobBuffer(const BlobBuffer&) = delete;
  BlobBuffer& operator=(const BlobBuffer&) = delete;
  ~BlobBuffer();

  // Makes room for `bytes` bytes in all without changing size() (the bytes
  // may move). False when out of memory: the buffer is then unchanged.
  bool Reserve(size_t bytes);
  // Sets size() to `bytes`, keeping the first min(old, new) bytes; bytes
  // past the old size are unwritten. False when out of memory (unchanged).
  bool Resize(size_t bytes);
  // Appends `bytes`, growing the room geometrically. False when out of
  // memory (unchanged).
  bool Append(ByteSpan bytes);
  void Clear() { size_ = 0; }

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }

 private:
  friend class Blob;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  std::weak_ptr<BufferPool> pool_;
};

// Pages of released BlobBuffers (and of the Blobs made from them) kept
// mapped for the next buffer of about their size, so that the kernel neither
// faults nor clears them again: a fresh page costs a fault and a clear of 4
// KiB (~0.25 s per GiB here), a reused one nothing. Holds at most
// max_bytes() of idle pages: a released mapping that would exceed it drops
// the oldest held ones first (one larger than max_bytes() is unmapped at
// once). Idle pages are unmapped when they are dropped so, and all of them
// when the pool is destroyed; pages in use belong to their buffer or Blob and
// are not counted. A buffer of n bytes (n >= 2 MiB) takes the smallest held
// mapping of n to 2n bytes. When kMaxMisses buffers in a row find nothing
// that fits, everything held is unmapped too (the sizes asked for have moved
// on: a replica back to deltas after an anchor gives the anchor's pages
// back). Thread-safe.
class BufferPool {
 public:
  static constexpr int kMaxMisses = 4;

  explicit BufferPool(size_t max_bytes) : max_bytes_(max_bytes) {}
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  size_t max_bytes() const { return max_bytes_; }
  size_t held_bytes() const;
  size_t held_mappings() const;

  // Internal (BlobBuffer, Blob): takes a held mapping of `bytes` to
  // 2 x `bytes` bytes, or {nullptr, 0}; hands one back (unmapped at once
  // when it cannot be kept). Mappings are page-aligned read-write anonymous.
  struct Mapping {
    uint8_t* data = nullptr;
    size_t bytes = 0;
  };
  Mapping Take(size_t bytes);
  void Give(Mapping m);

 private:
  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::vector<Mapping> held_;  // oldest first
  int misses_ = 0;             // Takes in a row that found nothing
  size_t held_bytes_ = 0;
};

}  // namespace deltasync
