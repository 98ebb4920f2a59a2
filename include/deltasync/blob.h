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

}  // namespace deltasync
