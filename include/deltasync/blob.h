// Blob: immutable bytes with shared ownership, backed by memory or an mmap.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "deltasync/status.h"
#include "deltasync/tensor.h"

namespace deltasync {

// Cheap to copy (shared). The bytes never change while any copy lives, so
// views into bytes() stay valid for as long as a copy of the Blob is held.
class BlobBuffer;

class Blob {
 public:
  Blob() = default;
  // Takes ownership of `bytes`.
  static Blob FromVector(std::vector<uint8_t> bytes);
  // Maps `path` read-only. An empty file gives an empty Blob. The file must not
  // be modified while mapped (deltasync only ever replaces files by rename).
  static Result<Blob> MapFile(const std::string& path);
  // Reads `path` into memory (for files that may change underneath).
  static Result<Blob> ReadFile(const std::string& path);
  // Takes over `buffer`'s pages (no copy); `buffer` is left empty.
  static Blob FromBuffer(BlobBuffer&& buffer);

  ByteSpan bytes() const { return impl_ ? impl_->bytes : ByteSpan(); }
  size_t size() const { return bytes().size(); }
  const uint8_t* data() const { return bytes().data(); }

  struct Impl {
    virtual ~Impl() = default;
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
};

}  // namespace deltasync
