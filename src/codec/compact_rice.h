// The Rice code of a compact bf16 stream's gaps (docs/format.md, "Compact
// objects"; internal to src/codec): gaps are coded per class in blocks of up
// to kRiceBlock gaps, each block with its own parameter k (6 bits): q =
// gap >> k in unary (q one bits, a zero bit) and then k low bits; q >=
// kUnaryEscape is written as kUnaryEscape one bits, the gap's bit width L
// (7 bits) and its L bits. Near the entropy of geometric gaps, and blocks
// follow the change rate along a tensor (rows with large gradients change
// more often).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "codec/compact_bf16.h"
#include "codec/compact_streams.h"

namespace deltasync::compact {

inline constexpr size_t kRiceBlock = 1024;
inline constexpr int kMaxRiceK = 56;
inline constexpr int kUnaryEscape = 31;

// Appends `count` gaps from `source` (which has at least that many).
void PutRiceGaps(BitWriter& w, uint64_t count, GapSource& source);

// Reads `count` gaps of one class into `out`; on failure a short reason.
std::optional<std::string> GetRiceGaps(BitReader& r, uint64_t count, uint64_t* out);

}  // namespace deltasync::compact
