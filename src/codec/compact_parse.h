// Step 1 of the compact decoder alone (internal to src/codec): one stream's
// entropy decode, shared by the decoder (compact_decode.cc) and
// ParseCompactDelta (compact_parse.cc), which measures and tests it apart
// from the walk over the base.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "codec/compact_v3.h"
#include "codec/compact_walk.h"
#include "deltasync/changes.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"

namespace deltasync::compact {

// The decoder's read of every stream (streams[i] against its base tensor
// bases[i], a bf16 one's buffers in bf[i]): a raw-mode stream decoded
// completely into c[i]; a bf16 one into bf[i] (class counts, ranks, diffs,
// escapes; bf[i].escaped must be empty), c[i] only named; each stream's
// outcome in errors[i]. Exactly what DecodeCompactDelta's step 1 does
// (compact_decode.cc, ReadTensors: tensors in groups, their rANS pieces
// decoded together), on `threads` threads.
void ReadCompactStreams(const std::string& label, const std::vector<const TensorView*>& streams,
                        const std::vector<const TensorView*>& bases, const V3Tables* tables, int threads,
                        std::span<TensorChanges> c, std::span<Bf16Tensor> bf, std::vector<Status>& errors);

// A bf16 stream's change count, read from its header (version, mode,
// count), where the header is well formed for `base` (a bf16 tensor) and the
// count plausible: at most the base's elements and at most 8 per stream
// byte (a version-3 stream codes each change's gap in at least one bit,
// uncompressed; a version-2 one may compress its gaps below that). Else
// nothing. The decoder sizes the stream's parse buffers from it ahead of
// the parse, which checks the stream in full.
std::optional<uint64_t> PlausibleBf16Count(const TensorView& stream, const TensorView& base);

}  // namespace deltasync::compact
