// The rANS coder of version 3's diff bytes (compact_rans.h).
#include "codec/compact_rans.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "codec/codec_targets.h"

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

namespace {

// One piece's decode in progress: the next change r of [lo, hi), the states
// of the changes with (r - lo) even (x0) and odd (x1; kRansLow with one
// state), the bytes [ptr, end) not yet read.
struct RansLane {
  uint64_t lo = 0, hi = 0, r = 0;
  uint32_t x0 = kRansLow, x1 = kRansLow;
  bool two = false;
  const uint8_t* ptr = nullptr;
  const uint8_t* end = nullptr;
  const std::array<uint64_t, kClasses + 1>* begin = nullptr;  // the piece's tensor's classes
  uint8_t* d = nullptr;                                       // its diff bytes (change r at d[r])
};

// The piece's initial states: DecodeRansPiece's first errors.
std::optional<std::string> StartLane(ByteSpan rans, uint64_t lo, uint64_t hi,
                                     const std::array<uint64_t, kClasses + 1>& begin, uint8_t* d, RansLane& l) {
  l.begin = &begin;
  l.d = d;
  l.lo = lo;
  l.hi = hi;
  l.r = lo;
  l.two = hi - lo >= kRansTwoStates;
  const size_t state_bytes = l.two ? 8 : 4;
  if (rans.size() < state_bytes) return "rANS bytes shorter than the initial states";
  std::memcpy(&l.x0, rans.data(), 4);  // little-endian hosts only (as the whole codec)
  l.x1 = kRansLow;
  if (l.two) std::memcpy(&l.x1, rans.data() + 4, 4);
  for (uint32_t x : {l.x0, l.x1}) {
    if (x < kRansLow || x >= (uint32_t{1} << 31)) return "rANS state out of range";
  }
  l.ptr = rans.data() + state_bytes;
  l.end = rans.data() + rans.size();
  return std::nullopt;
}

// The piece's changes [l.r, hi) one state after the other, then the final
// checks: the rest of DecodeRansPiece from wherever the lane stands.
std::optional<std::string> FinishLane(RansLane& l, const V3Tables& tables) {
  const std::array<uint64_t, kClasses + 1>& begin = *l.begin;
  uint8_t* const d = l.d;
  const uint64_t lo = l.lo;
  uint32_t x0 = l.x0, x1 = l.x1;
  const uint8_t* ptr = l.ptr;
  const uint8_t* const end = l.end;
  for (int cl = 0; cl < kClasses; ++cl) {
    const auto [a, b] = ClassPart(begin, cl, std::max(l.r, lo), l.hi);
    if (a >= b) continue;
    const uint32_t* slots = tables.classes[cl].slots.data();
    uint64_t r = a;
    bool ok = true;
    if (!l.two) {
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

// The class of change r (begin[cl] <= r < begin[cl + 1]; r < begin[kClasses]).
int ClassOf(const std::array<uint64_t, kClasses + 1>& begin, uint64_t r) {
  int cl = 0;
  while (begin[cl + 1] <= r) ++cl;
  return cl;
}

// Two two-state lanes stepped in turn, four states in registers: a run is
// as many changes as both lanes have left in their present classes and
// bytes for (at least 2 a change: FastStep never checks), both lanes' r
// advancing together. Stops where either lane ends or runs short of bytes
// (FinishLane then takes it on alone, the careful steps included). The
// lanes may be pieces of different tensors (their own classes and outputs).
void Lockstep(RansLane& A, RansLane& B, const V3Tables& tables) {
  const std::array<uint64_t, kClasses + 1>& begin_a = *A.begin;
  const std::array<uint64_t, kClasses + 1>& begin_b = *B.begin;
  while (A.r < A.hi && B.r < B.hi) {
    const int ca = ClassOf(begin_a, A.r), cb = ClassOf(begin_b, B.r);
    uint64_t n = std::min(std::min(begin_a[ca + 1], A.hi) - A.r, std::min(begin_b[cb + 1], B.hi) - B.r);
    n = std::min<uint64_t>(n, static_cast<uint64_t>(A.end - A.ptr) / 2);
    n = std::min<uint64_t>(n, static_cast<uint64_t>(B.end - B.ptr) / 2);
    if (n == 0) return;
    const uint32_t* const sa = tables.classes[ca].slots.data();
    const uint32_t* const sb = tables.classes[cb].slots.data();
    // The state of each lane's next change first.
    const bool odd_a = (A.r - A.lo) & 1, odd_b = (B.r - B.lo) & 1;
    uint32_t ac = odd_a ? A.x1 : A.x0, ao = odd_a ? A.x0 : A.x1;
    uint32_t bc = odd_b ? B.x1 : B.x0, bo = odd_b ? B.x0 : B.x1;
    const uint8_t* pa = A.ptr;
    const uint8_t* pb = B.ptr;
    uint8_t* da = A.d + A.r;
    uint8_t* db = B.d + B.r;
    uint64_t j = 0;
    for (; j + 2 <= n; j += 2) {
      FastStep(ac, sa, da + j, pa);
      FastStep(bc, sb, db + j, pb);
      FastStep(ao, sa, da + j + 1, pa);
      FastStep(bo, sb, db + j + 1, pb);
    }
    if (j < n) {
      FastStep(ac, sa, da + j, pa);
      FastStep(bc, sb, db + j, pb);
      std::swap(ac, ao);
      std::swap(bc, bo);
    }
    A.r += n;
    B.r += n;
    A.ptr = pa;
    B.ptr = pb;
    const bool now_odd_a = (A.r - A.lo) & 1, now_odd_b = (B.r - B.lo) & 1;
    A.x0 = now_odd_a ? ao : ac;
    A.x1 = now_odd_a ? ac : ao;
    B.x0 = now_odd_b ? bo : bc;
    B.x1 = now_odd_b ? bc : bo;
  }
}

}  // namespace

std::optional<std::string> DecodeRansPiece(ByteSpan rans, const std::array<uint64_t, kClasses + 1>& begin,
                                           uint64_t lo, uint64_t hi, const V3Tables& tables, uint8_t* d) {
  RansLane l;
  if (auto err = StartLane(rans, lo, hi, begin, d, l)) return err;
  return FinishLane(l, tables);
}

void DecodeRansPieces(std::span<RansPiece> pieces, const V3Tables& tables) {
  // Two lane slots, each holding a two-state piece in progress (or none).
  // Whenever both hold one they step in turn (Lockstep); a lane that ended
  // or ran short of bytes is finished alone (FinishLane: its careful steps
  // and final checks) and its slot takes the next two-state piece. A piece
  // of one state, or one whose start fails, is done at once.
  RansLane lane[2];
  RansPiece* in_lane[2] = {nullptr, nullptr};
  size_t next = 0;
  const auto fill = [&](int s) {
    while (next < pieces.size()) {
      RansPiece& p = pieces[next++];
      RansLane l;
      p.err = StartLane(p.rans, p.lo, p.hi, *p.begin, p.d, l);
      if (p.err) continue;
      if (!l.two) {
        p.err = FinishLane(l, tables);
        continue;
      }
      lane[s] = l;
      in_lane[s] = &p;
      return;
    }
    in_lane[s] = nullptr;
  };
  fill(0);
  fill(1);
  while (in_lane[0] != nullptr && in_lane[1] != nullptr) {
    Lockstep(lane[0], lane[1], tables);
    // Lockstep stops only where a lane ended or has under 2 bytes left:
    // that lane (or both) is finished and replaced.
    for (int s = 0; s < 2; ++s) {
      const RansLane& l = lane[s];
      if (l.r < l.hi && l.end - l.ptr >= 2) continue;
      in_lane[s]->err = FinishLane(lane[s], tables);
      fill(s);
    }
  }
  for (int s = 0; s < 2; ++s) {
    if (in_lane[s] != nullptr) in_lane[s]->err = FinishLane(lane[s], tables);
  }
}

namespace {

// ceil(2^64 / f) for f in [2, 4096] = floor((2^64 - 1) / f) + 1 (f a power
// of two included), 2^64 - 1 for f = 1 (with the bias of RansEncSymbol);
// computed once, so that a table needs no division.
const std::array<uint64_t, kRansTotal + 1>& Reciprocals() {
  static const auto* table = [] {
    auto* t = new std::array<uint64_t, kRansTotal + 1>();
    (*t)[1] = ~uint64_t{0};
    for (uint32_t f = 2; f <= kRansTotal; ++f) (*t)[f] = ~uint64_t{0} / f + 1;
    return t;
  }();
  return *table;
}

}  // namespace

RansEncSymbol MakeRansEncSymbol(uint32_t freq, uint32_t start) {
  RansEncSymbol e;
  e.x_max = ((kRansLow >> kRansScaleBits) << 8) * freq;
  e.cmpl = static_cast<uint16_t>(kRansTotal - freq);
  e.rcp = Reciprocals()[freq];
  e.bias = static_cast<uint16_t>(start + (freq == 1 ? kRansTotal - 1 : 0));
  return e;
}

void RansEncoderTables::Update(const V3Tables& tables, const std::array<uint64_t, kClasses>& counts) {
  for (int cl = 0; cl < kClasses; ++cl) {
    const V3Tables::Class& t = tables.classes[cl];
    if (counts[cl] == 0 || (built_[cl] && freq_[cl] == t.freq && start_[cl] == t.start)) continue;
    for (int sym = 0; sym < 256; ++sym) symbols_[cl][sym] = MakeRansEncSymbol(t.freq[sym], t.start[sym]);
    freq_[cl] = t.freq;
    start_[cl] = t.start;
    built_[cl] = true;
  }
}

namespace {

// Encodes a symbol on rANS state x (the encoder's step; symbols go in last
// first), its renormalisation bytes below ptr, which moves down past them.
// Bytes out while x >= x_max = 2^19 f: n <= 2 (x < 2^31, x_max >= 2^19),
// without a branch on them (data: it mispredicts). The two low bytes are
// stored always, low byte at ptr - 1 (the decoder reads it last); below the
// new ptr a store is overwritten later. Needs ptr - 2 inside the buffer.
// The state's chain: two compares and two selects (x, x >> 8 or x >> 16,
// the shifts beside the compares), the high multiply, the multiply by cmpl
// and an add (RansEncSymbol).
DS_CODEC_INLINE void RansPut(uint32_t& x, const RansEncSymbol& e, uint8_t*& ptr) {
  const uint64_t x64 = x, x8 = x64 >> 8;
  const uint64_t x_max = e.x_max;
  // x >= 2^8 x_max exactly when floor(x / 2^8) >= x_max.
  const bool one = x64 >= x_max, two = x8 >= x_max;
  const uint16_t low2 = __builtin_bswap16(static_cast<uint16_t>(x));
  std::memcpy(ptr - 2, &low2, 2);
  ptr -= static_cast<size_t>(one) + static_cast<size_t>(two);
  uint64_t y = one ? x8 : x64;
  y = two ? x8 >> 8 : y;
  const auto q = static_cast<uint64_t>((static_cast<unsigned __int128>(y) * e.rcp) >> 64);
  x = static_cast<uint32_t>(y + e.bias + q * e.cmpl);
}

// EncodeRansPiece's body, inlined into its two copies (codec_targets.h).
DS_CODEC_INLINE uint8_t* EncodeRansPieceBody(const uint8_t* diffs, const std::array<uint64_t, kClasses + 1>& begin,
                                             uint64_t lo, uint64_t hi, const RansEncoderTables& tables,
                                             uint8_t* end) {
  const bool two = hi - lo >= kRansTwoStates;
  uint8_t* ptr = end;
  uint32_t xs[2] = {kRansLow, kRansLow};
  for (int cl = kClasses - 1; cl >= 0; --cl) {
    const Span part = ClassPart(begin, cl, lo, hi);
    if (part.a >= part.b) continue;
    const RansEncSymbol* t = tables.of(cl);
    // Descending r; change r is on state (r - lo) & 1 (always 0 with one
    // state). Two at a time, state 1 then 0, so that both stay in
    // registers (a state picked by index lives in memory, and its store
    // and reload lengthen every step's chain).
    uint64_t r = part.b;
    if (!two) {
      for (; r > part.a; --r) RansPut(xs[0], t[diffs[r - 1]], ptr);
    } else {
      uint32_t x0 = xs[0], x1 = xs[1];
      if (r > part.a && ((r - 1 - lo) & 1) == 0) --r, RansPut(x0, t[diffs[r]], ptr);
      for (; r >= part.a + 2; r -= 2) {
        RansPut(x1, t[diffs[r - 1]], ptr);
        RansPut(x0, t[diffs[r - 2]], ptr);
      }
      if (r > part.a) --r, RansPut(x1, t[diffs[r]], ptr);
      xs[0] = x0;
      xs[1] = x1;
    }
  }
  for (int j = two ? 1 : 0; j >= 0; --j) {
    ptr -= 4;
    for (int k = 0; k < 4; ++k) ptr[k] = static_cast<uint8_t>(xs[j] >> (8 * k));
  }
  return ptr;
}

// One piece's encoder inside EncodeRansPieces2Body: symbols r - 1 down to lo
// left, the current class's table down to seg_lo, state a for symbol r - 1
// and b for the one after (they take turns), bytes below ptr.
struct EncLane {
  uint64_t r, lo, seg_lo;
  int cl;
  const RansEncSymbol* t;
  uint32_t a, b;
  uint8_t* ptr;
};

// Moves the lane to the class of symbol r - 1 (r > lo).
DS_CODEC_INLINE void EncLaneClass(EncLane& l, const std::array<uint64_t, kClasses + 1>& begin,
                                   const RansEncoderTables& tables) {
  while (begin[l.cl] > l.r - 1) --l.cl;
  l.seg_lo = std::max(begin[l.cl], l.lo);
  l.t = tables.of(l.cl);
}

// EncodeRansPieces2's body, inlined into its two copies (codec_targets.h).
// Both pieces have two states (at least kRansTwoStates changes): symbol r
// on state (r - lo) & 1, so the states simply take turns from the last
// symbol down. Runs of symbols where neither piece crosses a class border
// go two symbols of each piece a step.
DS_CODEC_INLINE void EncodeRansPieces2Body(const uint8_t* diffs, const std::array<uint64_t, kClasses + 1>& begin,
                                           const uint64_t lo[2], const uint64_t hi[2],
                                           const RansEncoderTables& tables, uint8_t* const end[2],
                                           uint8_t* start[2]) {
  EncLane l[2];
  for (int j = 0; j < 2; ++j) {
    l[j] = EncLane{hi[j], lo[j], 0, kClasses - 1, nullptr, kRansLow, kRansLow, end[j]};
    EncLaneClass(l[j], begin, tables);
  }
  while (l[0].r > l[0].lo && l[1].r > l[1].lo) {
    const uint64_t m = std::min(l[0].r - l[0].seg_lo, l[1].r - l[1].seg_lo);  // >= 1
    const RansEncSymbol* const t0 = l[0].t;
    const RansEncSymbol* const t1 = l[1].t;
    const uint8_t* const d0 = diffs + l[0].r;  // symbol r - 1 - k at d[-1 - k]
    const uint8_t* const d1 = diffs + l[1].r;
    uint32_t a0 = l[0].a, b0 = l[0].b, a1 = l[1].a, b1 = l[1].b;
    uint8_t* p0 = l[0].ptr;
    uint8_t* p1 = l[1].ptr;
    uint64_t k = 0;
    for (; k + 2 <= m; k += 2) {
      RansPut(a0, t0[d0[-1 - static_cast<int64_t>(k)]], p0);
      RansPut(a1, t1[d1[-1 - static_cast<int64_t>(k)]], p1);
      RansPut(b0, t0[d0[-2 - static_cast<int64_t>(k)]], p0);
      RansPut(b1, t1[d1[-2 - static_cast<int64_t>(k)]], p1);
    }
    if (k < m) {
      RansPut(a0, t0[d0[-1 - static_cast<int64_t>(k)]], p0);
      RansPut(a1, t1[d1[-1 - static_cast<int64_t>(k)]], p1);
      std::swap(a0, b0);
      std::swap(a1, b1);
    }
    l[0].a = a0, l[0].b = b0, l[1].a = a1, l[1].b = b1;
    l[0].ptr = p0, l[1].ptr = p1;
    for (EncLane& lane : l) {
      lane.r -= m;
      if (lane.r > lane.lo && lane.r == lane.seg_lo) EncLaneClass(lane, begin, tables);
    }
  }
  for (EncLane& lane : l) {  // the longer piece's rest, one symbol at a time
    while (lane.r > lane.lo) {
      if (lane.r == lane.seg_lo) EncLaneClass(lane, begin, tables);
      --lane.r;
      RansPut(lane.a, lane.t[diffs[lane.r]], lane.ptr);
      std::swap(lane.a, lane.b);
    }
    // Symbol lo took its piece's state 0 and the turn passed: a is state 1,
    // which goes last (EncodeRansPieceBody: state 1's bytes, then state 0's below).
    const uint32_t xs[2] = {lane.b, lane.a};
    for (int j = 1; j >= 0; --j) {
      lane.ptr -= 4;
      for (int k = 0; k < 4; ++k) lane.ptr[k] = static_cast<uint8_t>(xs[j] >> (8 * k));
    }
  }
  start[0] = l[0].ptr;
  start[1] = l[1].ptr;
}

uint8_t* EncodeRansPieceBaseline(const uint8_t* diffs, const std::array<uint64_t, kClasses + 1>& begin, uint64_t lo,
                                 uint64_t hi, const RansEncoderTables& tables, uint8_t* end) {
  return EncodeRansPieceBody(diffs, begin, lo, hi, tables, end);
}

DS_CODEC_BMI2_TARGET uint8_t* EncodeRansPieceBmi2(const uint8_t* diffs, const std::array<uint64_t, kClasses + 1>& begin,
                                                  uint64_t lo, uint64_t hi, const RansEncoderTables& tables,
                                                  uint8_t* end) {
  return EncodeRansPieceBody(diffs, begin, lo, hi, tables, end);
}

void EncodeRansPieces2Baseline(const uint8_t* diffs, const std::array<uint64_t, kClasses + 1>& begin,
                               const uint64_t lo[2], const uint64_t hi[2], const RansEncoderTables& tables,
                               uint8_t* const end[2], uint8_t* start[2]) {
  EncodeRansPieces2Body(diffs, begin, lo, hi, tables, end, start);
}

DS_CODEC_BMI2_TARGET void EncodeRansPieces2Bmi2(const uint8_t* diffs, const std::array<uint64_t, kClasses + 1>& begin,
                                                const uint64_t lo[2], const uint64_t hi[2],
                                                const RansEncoderTables& tables, uint8_t* const end[2],
                                                uint8_t* start[2]) {
  EncodeRansPieces2Body(diffs, begin, lo, hi, tables, end, start);
}

}  // namespace

void EncodeRansPieces2(const uint8_t* diffs, const std::array<uint64_t, kClasses + 1>& begin, const uint64_t lo[2],
                       const uint64_t hi[2], const RansEncoderTables& tables, uint8_t* const end[2],
                       uint8_t* start[2]) {
  if (UseCodecBmi2()) return EncodeRansPieces2Bmi2(diffs, begin, lo, hi, tables, end, start);
  EncodeRansPieces2Baseline(diffs, begin, lo, hi, tables, end, start);
}

uint8_t* EncodeRansPiece(const uint8_t* diffs, const std::array<uint64_t, kClasses + 1>& begin, uint64_t lo,
                         uint64_t hi, const RansEncoderTables& tables, uint8_t* end) {
  if (UseCodecBmi2()) return EncodeRansPieceBmi2(diffs, begin, lo, hi, tables, end);
  return EncodeRansPieceBaseline(diffs, begin, lo, hi, tables, end);
}

}  // namespace deltasync::compact
