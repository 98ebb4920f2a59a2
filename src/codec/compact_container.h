// How a compact delta holds its per-tensor streams (docs/format.md,
// "Compact delta", "Containers"): container 1, one U8 tensor `{P}.cmp` per
// changed parameter P; container 2 (the default since issue 16's session
// 25), every stream back to back in ONE U8 tensor `streams`, after a
// directory of (base tensor index, stream length) entries. The streams'
// bytes are the same in both. The one listing of a file's streams that every
// reader uses (the decoder, ParseCompactDelta, MeasureCompactDelta), and
// the writer's side (internal to src/codec).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deltasync/safetensors.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"

namespace deltasync::compact {

// Metadata key and value marking container 2; container 1 has no such key.
inline constexpr std::string_view kContainerKey = "deltasync_compact_container";
inline constexpr std::string_view kContainer2Value = "2";
// Container 1's stream tensors are `{P}.cmp`; container 2's one tensor:
inline constexpr std::string_view kStreamSuffix = ".cmp";
inline constexpr std::string_view kContainerTensor = "streams";

// One stream of a file, not yet tied to a base: container 1 names its
// parameter, container 2 gives its base tensor index (in the base's name
// order).
struct RawStream {
  std::string param;   // container 1: P of `P.cmp`; container 2: empty
  uint64_t index = 0;  // container 2: base tensor index; container 1: 0
  ByteSpan bytes;      // the stream (version, mode, count, ...)
};

struct RawStreams {
  int container = 1;
  // Container 1: in name order; container 2: in directory order (indices
  // strictly ascending, hence name order too).
  std::vector<RawStream> streams;
};

// Reads `file`'s container: the metadata's container key ("2", or absent
// for 1; any other value refused), container 1's tensor names (`.cmp`
// suffix, 1-D U8), or container 2's single `streams` tensor and its
// directory (canonical varints, lengths that fill the tensor exactly).
// kCorruption "<label>: ..." naming the problem. Needs no base.
Result<RawStreams> ReadContainer(const SafetensorsFile& file);

// A stream tied to its base tensor.
struct Stream {
  size_t base = 0;    // index into the `base` span given to ListStreams
  TensorView stream;  // U8, 1-D; named `{P}.cmp` in both containers (errors name it)
};

// ReadContainer, then each stream's base tensor: by name (container 1) or by
// index into `base` sorted by name (container 2; an index past the last
// tensor is kCorruption). `base` in any order, names unique. Streams in name
// order.
Result<std::vector<Stream>> ListStreams(const SafetensorsFile& file, std::span<const TensorView> base);

// Container 2's directory for `indices` (strictly ascending) and the
// streams' lengths: the start of its one tensor, which the streams follow
// back to back (a writer sends the directory and each stream as separate
// parts, never copied into one buffer).
std::vector<uint8_t> WriteContainer2Directory(std::span<const uint64_t> indices,
                                              std::span<const std::vector<uint8_t>> streams);

}  // namespace deltasync::compact
