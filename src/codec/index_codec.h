// The index encodings of a delta's `{name}.idx` tensor (internal to
// src/codec; docs/format.md, "Patch objects", "Index encodings"). Pure functions over
// bytes: the patch writer and reader add names and messages.
//
//   raw:       absolute positions, I32 (I64 past 2^31-1, a deltasync extension)
//   gap_delta: g[k] = idx[k] - idx[k-1] - 1 with idx[-1] = -1, as U16 when
//              every gap fits, else U32, else U64 (extension)
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "deltasync/tensor.h"

namespace deltasync::indexcodec {

// Encodes `idx` into `out` (resized to fit) and returns the dtype it chose,
// or nullopt when `idx` is not strictly ascending (then `out` is garbage).
// Empty input gives TRL's empty tensors: I32 / U16. One pass over `idx` in
// the common case (raw within I32, gaps within U16).
std::optional<DType> EncodeRaw(std::span<const uint64_t> idx, std::vector<uint8_t>& out);
std::optional<DType> EncodeGaps(std::span<const uint64_t> idx, std::vector<uint8_t>& out);

// The gap_delta width of a tensor whose gaps ORed together give `or_gap`:
// U16 when every gap fits, else U32, else U64 (EncodeGaps' choice; the fused
// detect+encode's too).
DType GapDType(uint64_t or_gap);

// The first k >= 1 with idx[k] <= idx[k-1], or 0 when strictly ascending.
size_t FirstNotAscending(std::span<const uint64_t> idx);

// Why decoding stopped, and where (an element position).
struct DecodeError {
  enum Kind { kNone, kNegative, kNotAscending, kOverflow };
  Kind kind = kNone;
  size_t position = 0;
  int64_t value = 0;  // kNegative / kNotAscending: the offending raw value

  bool ok() const { return kind == kNone; }
};

// Decodes `bytes` of `dtype` into absolute positions in `out`. raw: I32 or
// I64, checked non-negative and strictly ascending; gap_delta: U16, U32 or
// U64, checked for 64-bit overflow. REQUIRES: dtype is one of those listed.
DecodeError DecodeRaw(DType dtype, ByteSpan bytes, std::vector<uint64_t>& out);
DecodeError DecodeGaps(DType dtype, ByteSpan bytes, std::vector<uint64_t>& out);

// The positions of a gap stream at every `chunk`-th element, without
// decoding the rest: starts[c] = idx[c * chunk], and *last = idx[n-1] (n > 0).
// The same overflow check (and error) as DecodeGaps. REQUIRES: dtype U16,
// U32 or U64.
DecodeError GapChunkStarts(DType dtype, ByteSpan bytes, size_t chunk, std::vector<uint64_t>& starts,
                           uint64_t* last);

// Decodes elements [k, k + n) of a gap stream into out[0, n), given
// `prev` = idx[k-1] (uint64_t(-1) when k = 0), and returns idx[k+n-1]. No
// checks: the stream passed GapChunkStarts.
uint64_t DecodeGapRun(DType dtype, const uint8_t* bytes, size_t k, size_t n, uint64_t prev, uint64_t* out);
// The gap of element k (to recover idx[k-1] = starts[c] - gap(c*chunk) - 1).
uint64_t GapAt(DType dtype, const uint8_t* bytes, size_t k);

}  // namespace deltasync::indexcodec
