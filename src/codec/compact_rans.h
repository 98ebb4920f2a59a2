// The rANS coder of version 3's diff bytes, one piece at a time (internal to
// the compact codec; docs/format.md, "Compact stream version 3"): static
// 12-bit tables per class (V3Tables), byte-wise renormalisation, states in
// [kRansLow, 2^31), one state or two taking turns (kRansTwoStates).
// The encoder here too (WriteBf16StreamV3 calls it piece by piece).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
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

// One piece to decode (DecodeRansPiece's arguments: its changes [lo, hi)
// of the tensor whose classes are *begin, into d[lo, hi)) and, after
// DecodeRansPieces, its outcome.
struct RansPiece {
  ByteSpan rans;
  uint64_t lo = 0, hi = 0;
  const std::array<uint64_t, kClasses + 1>* begin = nullptr;
  uint8_t* d = nullptr;
  std::optional<std::string> err;  // out: DecodeRansPiece's result
};

// DecodeRansPiece of every piece (pieces of different tensors may mix, their
// outputs disjoint), two two-state pieces' states stepped in turn wherever
// two are left: when one piece ends the next takes its place, so that only
// the last piece's last changes decode on two states alone (pairs formed
// within a tensor left most of a 1024 x 1024 projection's changes, 37% of
// the model's, on two; docs/benchmarks.md, session 44). Outputs and each
// piece's err exactly as one DecodeRansPiece call per piece gives them.
void DecodeRansPieces(std::span<RansPiece> pieces, const V3Tables& tables);

// The encoder's constants for a symbol of frequency f (1 <= f <= 4096) and
// cumulative start: the step x -> (x / f) * 4096 + x % f + start, after the
// renormalisation bytes that leave while x >= x_max, is
//   q = high 64 bits of x * rcp;  x = x + bias + q * cmpl
// with rcp = ceil(2^64 / f) (exactly x / f for x < 2^32: the rounding adds
// below x / 2^64 < 1/f), cmpl = 4096 - f and bias = start. For f = 1 rcp is
// 2^64 - 1, so q = x - 1 (x >= 1), and bias = start + 4095 makes up for it
// (ryg_rans's trick). No division and no shift by a looked-up count on the
// state's chain.
struct RansEncSymbol {
  uint64_t rcp = 0;
  uint32_t x_max = 0;  // 2^19 f (at most 2^31)
  uint16_t bias = 0;   // start, + 4095 for f = 1 (below 2^13)
  uint16_t cmpl = 0;   // 4096 - f
};
RansEncSymbol MakeRansEncSymbol(uint32_t freq, uint32_t start);

// The encoder's entries of a delta's tables, kept from tensor to tensor (a
// writer's scratch holds one): Update makes those of the classes a tensor
// has changes in (counts[cl] > 0) match `tables`, rebuilding only a class
// whose frequencies or starts differ from the last ones it built (every
// tensor of a delta shares its tables).
class RansEncoderTables {
 public:
  void Update(const V3Tables& tables, const std::array<uint64_t, kClasses>& counts);
  // Class cl's 256 entries (those of frequency-0 symbols meaningless).
  const RansEncSymbol* of(int cl) const { return symbols_[cl].data(); }

 private:
  std::array<std::array<RansEncSymbol, 256>, kClasses> symbols_{};
  std::array<std::array<uint16_t, 256>, kClasses> freq_{}, start_{};
  std::array<bool, kClasses> built_{};
};

// The rANS bytes of the piece's changes [lo, hi) (their diff bytes at
// diffs[lo..hi), classes from `begin`), last symbol first, written to end
// at `end`: returns where they start. Two states taking turns from a piece
// of kRansTwoStates changes on (docs/format.md). Needs 2 (hi - lo) + 8
// bytes below end (at most 2 bytes a symbol with 12-bit frequencies, plus
// the final states). Every symbol must have a non-zero frequency.
uint8_t* EncodeRansPiece(const uint8_t* diffs, const std::array<uint64_t, kClasses + 1>& begin, uint64_t lo,
                         uint64_t hi, const RansEncoderTables& tables, uint8_t* end);

// EncodeRansPiece of two pieces at once, [lo[0], hi[0]) written to end at
// end[0] and [lo[1], hi[1]) to end at end[1] (their starts in start[0],
// start[1]): the same bytes as two calls, the two pieces' four state chains
// interleaved (one piece's two chains wait on their multiplies). Each piece
// must have at least kRansTwoStates changes.
void EncodeRansPieces2(const uint8_t* diffs, const std::array<uint64_t, kClasses + 1>& begin, const uint64_t lo[2],
                       const uint64_t hi[2], const RansEncoderTables& tables, uint8_t* const end[2],
                       uint8_t* start[2]);

}  // namespace deltasync::compact
