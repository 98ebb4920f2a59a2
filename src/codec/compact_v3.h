// Version 3 of the compact bf16 stream (internal to the compact codec;
// docs/format.md, "Compact stream version 3"). It codes what version 2 codes
// (per exponent class: the changes' count, their gaps among base elements
// of the class, their diff bytes, the escapes' raw values) with fewer fixed
// costs and closer to the entropy:
//   - the classes present as a 16-bit bitmap and only their counts;
//   - diff bytes rANS-coded (static, 12-bit frequencies) with one table per
//     class shared by every tensor of the delta (in the delta's
//     `__metadata__`), instead of a zstd frame and Huffman table per
//     (tensor, class) that cannot go below 1 bit per symbol;
//   - gaps Rice-coded as in version 2;
//   - the tensor's changes, in class order, cut into pieces of kV3Piece
//     changes, each piece's gap bits and rANS bytes coded alone, with their
//     lengths up front: a decoder can start at any piece (the piece's first
//     change has rank p x kV3Piece; its class follows from the counts).
// Its decoder yields the intermediate that version 2's parse yields, so the
// position walk is the same for both.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "codec/compact_bf16.h"
#include "codec/compact_rice.h"
#include "codec/compact_streams.h"
#include "deltasync/safetensors.h"
#include "deltasync/status.h"

namespace deltasync::compact {

inline constexpr uint8_t kStreamVersion3 = 3;
inline constexpr uint64_t kV3Piece = uint64_t{1} << 16;
inline constexpr int kRansScaleBits = 12;
inline constexpr uint32_t kRansTotal = uint32_t{1} << kRansScaleBits;
inline constexpr uint32_t kRansLow = uint32_t{1} << 23;  // states live in [kRansLow, 2^31)
// A piece of at least this many changes codes them on two rANS states taking
// turns (twice the decoder's instruction-level parallelism); a smaller one on
// one (4 bytes less).
inline constexpr uint64_t kRansTwoStates = 64;
// `__metadata__` key of a version-3 delta's diff tables (hex of
// V3Tables::Serialize()).
inline constexpr std::string_view kTablesKey = "deltasync_compact_tables";

void CountDiffs(const Bf16Streams& s, DiffHistogram& h);

// One static rANS table per class (classes without changes in the delta
// have none).
struct V3Tables {
  struct Class {
    bool present = false;
    std::array<uint16_t, 256> freq{};   // sums to kRansTotal when present
    std::array<uint16_t, 256> start{};  // cumulative
    // Decoding, per slot: symbol (bits 0-7), slot - start (bits 8-19),
    // freq - 1 (bits 20-31); kRansTotal entries.
    std::vector<uint32_t> slots;
  };
  std::array<Class, kClasses> classes;

  static V3Tables Build(const DiffHistogram& h);
  std::string SerializeHex() const;
  // nullopt-style: a reason on failure.
  static std::optional<std::string> ParseHex(std::string_view hex, V3Tables& out);
};

// Appends one tensor's version-3 bf16 stream. Every diff byte of the
// streams must have a non-zero frequency in its class's table.
void WriteBf16StreamV3(const Bf16Streams& s, const V3Tables& tables, std::vector<uint8_t>& out);

// What version 2's and 3's parses hand to the position walk.
struct ParsedBf16 {
  std::array<uint64_t, kClasses + 1> class_begin{};  // class cl: changes [begin[cl], begin[cl+1])
  // In: the base's elements (the bound of every rank; inspect leaves it).
  uint64_t elements = ~uint64_t{0};
  RankBuffer ranks;            // class order, each class's gaps as ranks (GapRanks), sized by `elements`
  int past_class = -1;         // out: the first class whose ranks reach `elements`, or -1
  UninitVector<uint8_t> diffs;                       // class order
  std::vector<uint8_t> escapes;                      // u16 LE each, class order
};

// Parses the rest of a version-3 bf16 stream after its version, mode and
// `count` (count <= the base's elements, checked by the caller). On failure a
// reason naming the field (the caller adds file and tensor).
// With `sizes`, adds the stored bytes of its parts (inspect): header (bitmap,
// counts, piece directory, the escape block's framing), gaps, diffs (rANS)
// and the escape block's payload (as version 2's parts are counted).
struct V3Sizes {
  uint64_t header = 0, gaps = 0, diffs = 0, escapes = 0;
};
std::optional<std::string> ParseBf16StreamV3(Reader& in, uint64_t count, const V3Tables* tables, ParsedBf16& out,
                                             V3Sizes* sizes = nullptr);

// ParseBf16StreamV3 in two parts around the rANS decode, so that a caller
// can decode the pieces of many tensors together (DecodeRansPieces keeps
// two pieces' states in flight across tensors, compact_rans.h):
//  - Gaps: the header and every piece's gaps (into out's ranks;
//    out.past_class set), each piece's rANS bytes appended to `pieces`
//    (begin &out.class_begin, outputs out.diffs, sized here), not decoded.
//    A gap error comes after an earlier piece's rANS error, as the
//    one-call parse gives them (those pieces decoded here; `pieces` then
//    as it came in);
//  - the caller decodes the appended pieces (DecodeRansPieces; their
//    begin and d may be moved to where out's class_begin and diffs went);
//  - Rest, with `in` past the last piece (where Gaps left it): the first
//    failed piece's error, else the escape block into `escapes`.
struct RansPiece;
std::optional<std::string> ParseBf16StreamV3Gaps(Reader& in, uint64_t count, const V3Tables* tables, ParsedBf16& out,
                                                 std::vector<RansPiece>& pieces, V3Sizes* sizes = nullptr);
std::optional<std::string> ParseBf16StreamV3Rest(Reader& in, std::span<const RansPiece> pieces,
                                                 const UninitVector<uint8_t>& diffs, std::vector<uint8_t>& escapes,
                                                 V3Sizes* sizes = nullptr);

// A version-3 delta's diff tables into `tables`, when its metadata has
// them (left empty otherwise); kCorruption when they are malformed.
Status ParseDeltaTables(const SafetensorsFile& file, std::optional<V3Tables>& tables);

// A tensor's changes in class order [lo, hi) (a piece) intersected with
// class cl's [begin[cl], begin[cl + 1]); empty when a >= b.
struct Span {
  uint64_t a, b;
};
inline Span ClassPart(const std::array<uint64_t, kClasses + 1>& begin, int cl, uint64_t lo, uint64_t hi) {
  return {std::max(lo, begin[cl]), std::min(hi, begin[cl + 1])};
}

}  // namespace deltasync::compact
