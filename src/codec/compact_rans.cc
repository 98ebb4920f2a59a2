// The rANS coder of version 3's diff bytes (compact_rans.h).
#include "codec/compact_rans.h"

#include <algorithm>
#include <cstring>

namespace deltasync::compact {
namespace {

// One symbol on state x, reading its renormalisation bytes one by one:
// false when the bytes end early. The reference for FastStep, and the
// path of a piece's last few bytes.
inline bool CarefulStep(uint32_t& x, const uint32_t* slots, uint8_t* out, const uint8_t*& ptr, const uint8_t* end) {
  const uint32_t e = slots[x & (kRansTotal - 1)];
  x = ((e >> 20) + 1) * (x >> kRansScaleBits) + ((e >> 8) & (kRansTotal - 1));
  *out = static_cast<uint8_t>(e);
  while (x < kRansLow) {
    if (ptr == end) return false;
    x = (x << 8) | *ptr++;
  }
  return true;
}

// CarefulStep without branches, for at least 2 bytes left: after a symbol
// x >= 2^11 (x >> 12 >= 2^11 times a frequency >= 1), so it takes n <= 2
// bytes, n = [x < 2^23] + [x < 2^15]; the two next bytes are read always
// and the n first shifted in (first byte most significant). Whether a
// state renormalises is data, and a branch on it mispredicts.
inline void FastStep(uint32_t& x, const uint32_t* slots, uint8_t* out, const uint8_t*& ptr) {
  const uint32_t e = slots[x & (kRansTotal - 1)];
  x = ((e >> 20) + 1) * (x >> kRansScaleBits) + ((e >> 8) & (kRansTotal - 1));
  *out = static_cast<uint8_t>(e);
  const uint32_t n = static_cast<uint32_t>(x < kRansLow) + static_cast<uint32_t>(x < (kRansLow >> 8));
  uint16_t w;
  std::memcpy(&w, ptr, 2);
  const uint32_t next = __builtin_bswap16(w);  // ptr[0] << 8 | ptr[1]
  x = (x << (8 * n)) | (next >> (16 - 8 * n));
  ptr += n;
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
    const uint64_t a = std::max(lo, begin[cl]), b = std::min(hi, begin[cl + 1]);
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
