// Step 1 of the compact decoder alone (internal to src/codec): one stream's
// entropy decode, shared by the decoder (compact_decode.cc) and
// ParseCompactDelta (compact_parse.cc), which measures and tests it apart
// from the walk over the base.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "codec/compact_v3.h"
#include "codec/compact_walk.h"
#include "deltasync/changes.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"

namespace deltasync::compact {

// The decoder's read of `stream` against its base tensor `base`: a raw-mode
// stream decoded completely into `c`; a bf16 one into `bf` (class counts,
// ranks, diffs, escapes; bf.escaped must be empty), `c` only named. Exactly
// what DecodeCompactDelta's step 1 does (compact_decode.cc, ReadTensor).
Status ReadCompactStream(const std::string& label, const TensorView& stream, const TensorView& base,
                         const V3Tables* tables, TensorChanges& c, Bf16Tensor& bf);

// A bf16 stream's change count, read from its header (version, mode,
// count), where the header is well formed for `base` (a bf16 tensor) and the
// count plausible: at most the base's elements and at most 8 per stream
// byte (a version-3 stream codes each change's gap in at least one bit,
// uncompressed; a version-2 one may compress its gaps below that). Else
// nothing. The decoder sizes the stream's parse buffers from it ahead of
// the parse, which checks the stream in full.
std::optional<uint64_t> PlausibleBf16Count(const TensorView& stream, const TensorView& base);

}  // namespace deltasync::compact
