// The rANS coder of version 3's diff bytes (compact_rans.h).
#include "codec/compact_rans.h"

#include <algorithm>
#include <cstring>

namespace deltasync::compact {
namespace {

// The symbol of state x to *out, and x stepped past it (before its
// renormalisation). A slot's entry: the symbol in bits 0..7, the slot's
// place among its symbol's slots in bits 8..19, frequency - 1 in 20..31.
inline void Symbol(uint32_t& x, const uint32_t* slots, uint8_t* out) {
  const uint32_t e = slots[x & (kRansTotal - 1)];
  x = ((e >> 20) + 1) * (x >> kRansScaleBits) + ((e >> 8) & (kRansTotal - 1));
  *out = static_cast<uint8_t>(e);
}

// One symbol on state x, reading its renormalisation bytes one by one:
// false when the bytes end early. The reference for FastStep, and the
// path of a piece's last few bytes.
inline bool CarefulStep(uint32_t& x, const uint32_t* slots, uint8_t* out, const uint8_t*& ptr, const uint8_t* end) {
  Symbol(x, slots, out);
  while (x < kRansLow) {
    if (ptr == end) return false;
    x = (x << 8) | *ptr++;
  }
  return true;
}

// CarefulStep for at least 2 bytes left: after a symbol x >= 2^11 (x >> 12
// >= 2^11 times a frequency >= 1), so two bytes always suffice and are not
// checked. The renormalisation stays a branch: at the deltas' 1-2 bits a
// symbol it is rarely taken and well predicted, and a branch-free one
// (n = [x < 2^23] + [x < 2^15] bytes, two read always) put the byte load
// on the state's chain: 3.87-3.93 against 3.12-3.76 ns a change for the
// rANS part (compact_parse_bench, docs/benchmarks.md, session 27 H1).
inline void FastStep(uint32_t& x, const uint32_t* slots, uint8_t* out, const uint8_t*& ptr) {
  Symbol(x, slots, out);
  if (x < kRansLow) {
    x = (x << 8) | *ptr++;
    if (x < kRansLow) x = (x << 8) | *ptr++;
  }
}

}  // namespace

std::optional<std::string> DecodeRansPiece(ByteSpan rans, const std::array<uint64_t, kClasses + 1>& begin,
                                           uint64_t lo, uint64_t hi, const V3Tables& tables, uint8_t* d) {
  const bool two = hi - lo >= kRansTwoStates;
  const size_t state_bytes = two ? 8 : 4;
  if (rans.size() < state_bytes) return "rANS bytes shorter than the initial states";
  uint32_t x0, x1 = kRansLow;
  std::memcpy(&x0, rans.data(), 4);  // little-endian hosts only (as the whole codec)
  if (two) std::memcpy(&x1, rans.data() + 4, 4);
  for (uint32_t x : {x0, x1}) {
    if (x < kRansLow || x >= (uint32_t{1} << 31)) return "rANS state out of range";
  }
  const uint8_t* ptr = rans.data() + state_bytes;
  const uint8_t* const end = rans.data() + rans.size();
  for (int cl = 0; cl < kClasses; ++cl) {
    const auto [a, b] = ClassPart(begin, cl, lo, hi);
    if (a >= b) continue;
    const uint32_t* slots = tables.classes[cl].slots.data();
    uint64_t r = a;
    bool ok = true;
    if (!two) {
      for (; r < b && end - ptr >= 2; ++r) FastStep(x0, slots, d + r, ptr);
      for (; ok && r < b; ++r) ok = CarefulStep(x0, slots, d + r, ptr, end);
    } else {
      // Change r is on state (r - lo) & 1.
      if ((r - lo) & 1) ok = CarefulStep(x1, slots, d + r, ptr, end), ++r;
      for (; ok && r + 1 < b && end - ptr >= 4; r += 2) {
        FastStep(x0, slots, d + r, ptr);
        FastStep(x1, slots, d + r + 1, ptr);
      }
      for (; ok && r + 1 < b; r += 2) {
        ok = CarefulStep(x0, slots, d + r, ptr, end) && CarefulStep(x1, slots, d + r + 1, ptr, end);
      }
      if (ok && r < b) ok = CarefulStep(x0, slots, d + r, ptr, end), ++r;
    }
    if (!ok) return "rANS bytes end early, in class " + std::to_string(cl);
  }
  if (x0 != kRansLow || x1 != kRansLow) return "rANS final states are not the initial ones";
  if (ptr != end) return std::to_string(end - ptr) + " trailing rANS bytes";
  return std::nullopt;
}

}  // namespace deltasync::compact
