// Step 1 of the compact decoder (internal to src/codec; compact_read.cc):
// every stream's read (header checks, entropy decode, tensors in groups),
// shared by the decoder (compact_decode.cc) and ParseCompactDelta
// (compact_parse.cc), which measures and tests it apart from the walk over
// the base.
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

// The decoder's step 1 over every stream (streams[i] against its base
// tensor bases[i]): tensors in groups of about 512k changes, by counts[i]
// (stream i's PlausibleBf16Count, 0 where it has none; a guide to the
// grouping only: each stream's read checks its header itself), the groups
// in parallel on `threads` threads; in a group, each tensor's gaps, then
// the rANS pieces of all its tensors together (DecodeRansPieces: two
// pieces' states in flight across tensor borders), then each tensor's end.
// A raw-mode stream is decoded completely into changes[i]; a bf16 one into
// read[i] (class counts, ranks, diffs, escapes; read[i].escaped must be
// empty), changes[i] named and, unless `fused` (an apply, which writes the
// base instead), its indices and values sized. Each stream's outcome is its
// own (errors[i], errors sized by the caller), whatever the grouping.
void ReadTensors(const std::string& label, const std::vector<const TensorView*>& streams,
                 const std::vector<const TensorView*>& bases, std::span<const uint64_t> counts,
                 const V3Tables* tables, bool fused, int threads, std::span<TensorChanges> changes,
                 std::span<Bf16Tensor> read, std::vector<Status>& errors);

// The decoder's read of every stream (ReadTensors, as a fused apply does:
// c[i] only named for a bf16 stream), the counts read here, errors sized.
void ReadCompactStreams(const std::string& label, const std::vector<const TensorView*>& streams,
                        const std::vector<const TensorView*>& bases, const V3Tables* tables, int threads,
                        std::span<TensorChanges> c, std::span<Bf16Tensor> bf, std::vector<Status>& errors);

// A bf16 stream's change count, read from its header (version, mode,
// count), where the header is well formed for `base` (a bf16 tensor) and the
// count plausible: at most the base's elements and at most 8 per stream
// byte (a version-3 stream codes each change's gap in at least one bit,
// uncompressed; a version-2 one may compress its gaps below that). Else
// nothing. The decoder sizes the stream's parse buffers from it ahead of
// the parse, which checks the stream in full, and groups the tensors by it.
std::optional<uint64_t> PlausibleBf16Count(const TensorView& stream, const TensorView& base);

}  // namespace deltasync::compact
