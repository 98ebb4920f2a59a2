// The rANS coder of version 3's diff bytes, one piece at a time (internal to
// the compact codec; docs/format.md, "Compact stream version 3"): static
// 12-bit tables per class (V3Tables), byte-wise renormalisation, states in
// [kRansLow, 2^31), one state or two taking turns (kRansTwoStates).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "codec/compact_v3.h"

namespace deltasync::compact {

// Decodes the diff bytes of the piece's changes [lo, hi) (class order;
// class cl holds [begin[cl], begin[cl + 1])) from its rANS bytes `rans`
// into d[lo, hi). Every class with changes in the piece must have a table.
// On failure a reason (the caller adds the piece): too short for the
// states, a state out of range, bytes ending early (naming the class),
// final states not the initial ones, trailing bytes.
std::optional<std::string> DecodeRansPiece(ByteSpan rans, const std::array<uint64_t, kClasses + 1>& begin,
                                           uint64_t lo, uint64_t hi, const V3Tables& tables, uint8_t* d);

}  // namespace deltasync::compact
