// Step 1 of the compact decoder alone (internal to src/codec): one stream's
// entropy decode, shared by the decoder (compact_decode.cc) and
// ParseCompactDelta (compact_parse.cc), which measures and tests it apart
// from the walk over the base.
#pragma once

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

}  // namespace deltasync::compact
