// safetensors reading and writing.
//
// Format (huggingface/safetensors): 8-byte little-endian header length N, N
// bytes of UTF-8 JSON, then the data section. The JSON maps tensor names to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
// data section) plus an optional "__metadata__" object of string values.
//
// The reader treats its input as untrusted and checks every rule (see
// docs/format.md, "safetensors rules"): header length vs size, a 100 MB header
// cap, UTF-8 JSON object, known dtypes, shape x dtype size == byte span with
// overflow checks, offsets in bounds, tensors contiguous and non-overlapping
// and covering the data section exactly, unique names, string metadata
// values. A violation is kCorruption naming the file (label), the tensor and
// the rule. It never crashes, hangs or reads out of bounds.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deltasync/blob.h"
#include "deltasync/file_stamp.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"

namespace deltasync {

inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

using Metadata = std::map<std::string, std::string>;

class SafetensorsFile {
 public:
  // Maps `path` and parses it (stamped first: CheckUnchanged). Errors name
  // `path`.
  static Result<SafetensorsFile> Open(const std::string& path);
  // Parses bytes held by `blob` (kept alive by the result). Errors name `label`.
  static Result<SafetensorsFile> Parse(Blob blob, std::string label);

  // Tensors in data-offset order. Views point into blob() and stay valid while
  // this object (or a copy of blob()) lives.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // nullptr when absent.
  const TensorView* Find(std::string_view name) const;
  const Metadata& metadata() const { return metadata_; }
  const std::string& label() const { return label_; }
  const Blob& blob() const { return blob_; }

  // OK when the file Open mapped is still the file it stamped, unchanged
  // (FileChangeSince), and was not cut short while mapped (Blob::cut).
  // kFailedPrecondition naming it and how it changed otherwise: what was
  // read from it may mix two saves (or zeros), so a publisher or `diff` asks
  // this after reading every tensor and before it commits or writes. (A
  // file already being written when it was opened may go unseen: see
  // FileStamp.) For a Parse()d Blob: only the cut.
  Status CheckUnchanged() const;

 private:
  Blob blob_;
  std::string label_;
  std::vector<TensorView> tensors_;
  Metadata metadata_;
  std::optional<FileStamp> stamp_;  // Open's
};

// The header bytes (length prefix + JSON, padded with spaces to a multiple of
// 8 bytes) for `tensors` laid out back to back in the given order. The data
// section is then the tensors' bytes in that order. Deterministic: the same
// input gives the same bytes. kInvalidArgument for duplicate names, a name
// "__metadata__", or data sizes that disagree with shape x dtype.
Result<std::vector<uint8_t>> EncodeSafetensorsHeader(const Metadata& metadata,
                                                     std::span<const TensorView> tensors);

// A tensor's header entry without its bytes: what the header needs to say
// about it (name, dtype, shape) and the byte length its data will have.
// Lets a writer emit the header of data it sends as several parts (no copy
// into one buffer to make a TensorView of it). Views into the caller's name
// and shape, which must outlive it.
struct TensorLayout {
  std::string_view name;
  DType dtype = DType::kU8;
  std::span<const uint64_t> shape;
  uint64_t bytes = 0;
};

// EncodeSafetensorsHeader with each tensor's byte length in place of its
// data: the same bytes as the view-based overload for views of those
// lengths, and the same checks and errors (byte length vs shape x dtype).
Result<std::vector<uint8_t>> EncodeSafetensorsHeader(const Metadata& metadata,
                                                     std::span<const TensorLayout> tensors);

// Header followed by every tensor's bytes, as one buffer (for small files).
Result<std::vector<uint8_t>> SerializeSafetensors(const Metadata& metadata,
                                                  std::span<const TensorView> tensors);

// Streams header and tensors to `path` (temp file + fsync + rename, so `path`
// is either untouched or complete).
Status WriteSafetensorsFile(const std::string& path, const Metadata& metadata,
                            std::span<const TensorView> tensors);

}  // namespace deltasync
