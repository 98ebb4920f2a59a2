// The compact decoder's per-block select (kernels::ClassPlace16,
// ClassPlaceDecode16, ClassPlaceApply16; src/bf16/class_place_kernels.cc) against a
// one-change-at-a-time reference of their contract (simd_kernels.h), on every SIMD target, block after block
// with the cursors carried over: bases at every class edge (zeros,
// subnormals, NaN, Inf, both signs), classes with every element changed,
// none, or a few; change codes that are canonical, escapes, and
// non-canonical ones of every kind (a diff into the other sign, a diff
// from or to a non-finite value, a diff wrapping around 16 bits, an escape
// where a diff fits), whose smallest offset both must return.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "bf16/bf16_test_util.h"
#include "bf16/simd_kernels.h"
#include "codec/compact_bf16.h"

namespace deltasync {
namespace {

constexpr size_t kBlock = 1024, kWords = 16;
constexpr uint64_t kNone = ~uint64_t{0};

struct Streams {
  std::vector<uint64_t> ranks;
  std::vector<uint8_t> diffs;
  std::vector<uint8_t> escapes;  // u16 LE each
  std::array<uint64_t, 16> begin{}, end{}, first_escape{};

  // Classes are written in order: BeginClass(c), its changes by Add in
  // rank order, EndClass(c).
  void BeginClass(int c) {
    begin[c] = ranks.size();
    first_escape[c] = escapes.size() / 2;
  }
  // One change: its rank in the class, its diff byte, and the new value
  // (written to the escapes when the diff byte is the escape code).
  void Add(uint64_t rank, uint8_t diff, uint16_t raw) {
    ranks.push_back(rank);
    diffs.push_back(diff);
    if (diff == compact::kEscape) {
      escapes.push_back(static_cast<uint8_t>(raw));
      escapes.push_back(static_cast<uint8_t>(raw >> 8));
    }
  }
  void EndClass(int c) { end[c] = ranks.size(); }
};

// The base: values around every class edge and anywhere, a run of one
// class, specials.
std::vector<uint16_t> Base(std::mt19937_64& rng, size_t n) {
  static constexpr uint16_t kExps[] = {0, 1, 111, 112, 113, 114, 118, 120, 122, 125, 126, 127, 128, 200, 254, 255};
  std::uniform_int_distribution<size_t> pick(0, std::size(kExps) - 1);
  std::uniform_int_distribution<uint32_t> any(0, 0xFFFF), mant(0, 0x7F), kind(0, 7);
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (i >= 1500 && i < 1800) {
      v[i] = static_cast<uint16_t>(120 << 7 | mant(rng));  // class 8 only
    } else if (i < 8) {
      static constexpr uint16_t kEnds[] = {0x0000, 0x0001, 0x007E, 0xFFFF, 0xFF81, 0x7FFF, 0x7F80, 0x8000};
      v[i] = kEnds[i];
    } else {
      v[i] = kind(rng) == 0 ? static_cast<uint16_t>(any(rng))
                            : static_cast<uint16_t>((any(rng) & 0x8000) | kExps[pick(rng)] << 7 | mant(rng));
    }
  }
  return v;
}

uint8_t ZigZag(int32_t d) { return static_cast<uint8_t>((static_cast<uint32_t>(d) << 1) ^ static_cast<uint32_t>(d >> 31)); }

// Per class a change rate (class 3 none, class 8 every element), each
// change's code: mostly canonical (+-1..3 ULP, or an escape where it must
// be one), one in `bad_one_in` non-canonical (when > 0).
Streams MakeStreams(std::mt19937_64& rng, const std::vector<uint16_t>& base, int bad_one_in) {
  std::array<std::vector<uint64_t>, 16> of_class;
  for (size_t i = 0; i < base.size(); ++i) of_class[compact::ClassOf(base[i])].push_back(i);
  std::uniform_real_distribution<double> u(0, 1);
  std::uniform_int_distribution<uint32_t> any(0, 0xFFFF), small(1, 3), byte(0, 254);
  Streams s;
  for (int c = 0; c < 16; ++c) {
    const double rate = c == 3 ? 0.0 : c == 8 ? 1.0 : c == 0 ? 0.5 : c % 4 == 1 ? 0.002 : 0.05;
    s.BeginClass(c);
    for (uint64_t r = 0; r < of_class[c].size(); ++r) {
      if (u(rng) >= rate) continue;
      const uint16_t o = base[of_class[c][r]];
      uint8_t d;
      uint16_t raw = 0;
      if (bad_one_in > 0 && any(rng) % static_cast<uint32_t>(bad_one_in) == 0) {
        switch (any(rng) % 3) {
          case 0:  // any diff byte: into the other sign, from/to NaN or Inf, wrapping, or canonical
            d = static_cast<uint8_t>(byte(rng));
            break;
          case 1:  // a diff that wraps or crosses the sign from the ends of the range
            d = ZigZag(o & 0x8000 ? 127 : -127);
            break;
          default:  // an escape where a diff fits (or a canonical one)
            raw = static_cast<uint16_t>(o + small(rng));
            d = compact::kEscape;
            break;
        }
      } else {
        const uint16_t v = static_cast<uint16_t>(u(rng) < 0.05 ? any(rng) : o + (any(rng) & 1 ? small(rng) : -small(rng)));
        d = compact::DiffByte(o, v);
        raw = v;
      }
      s.Add(r, d, raw);
    }
    s.EndClass(c);
  }
  return s;
}

kernels::ClassWalkCursor StartCursor(const Streams& s) {
  kernels::ClassWalkCursor cur{};
  for (int c = 0; c < 16; ++c) {
    cur.g[c] = s.begin[c];
    cur.e[c] = s.first_escape[c];
    cur.rem[c] = s.begin[c] < s.end[c] ? s.ranks[s.begin[c]] : kNone;
  }
  return cur;
}

struct BlockOut {
  std::vector<uint64_t> hits = std::vector<uint64_t>(kWords);
  std::vector<uint16_t> values = std::vector<uint16_t>(kBlock);  // at the hits only
  std::vector<uint16_t> data;                                    // the apply's block after
  std::vector<uint32_t> undo_pos;  // from the chunk's start (index0: the block's offset in it)
  std::vector<uint16_t> undo_old, h_new;
  size_t bad = 0;
};

// The contract, one change at a time, in class order.
BlockOut Reference(const uint16_t* data, size_t n, uint64_t index0, uint32_t classes, const Streams& s,
                   kernels::ClassWalkCursor& cur) {
  BlockOut o;
  o.data.assign(data, data + n);
  o.bad = n;
  for (int c = 0; c < 16; ++c) {
    if (!(classes >> c & 1)) continue;
    std::vector<size_t> pos;
    for (size_t i = 0; i < n; ++i) {
      if (compact::ClassOf(data[i]) == c) pos.push_back(i);
    }
    uint64_t r = cur.rem[c];
    while (r != kNone && r < pos.size()) {
      const size_t i = pos[r];
      const uint16_t old = data[i];
      const uint8_t d = s.diffs[cur.g[c]];
      uint16_t v;
      if (d == compact::kEscape) {
        std::memcpy(&v, s.escapes.data() + 2 * cur.e[c]++, 2);
      } else {
        v = static_cast<uint16_t>(old + (static_cast<int32_t>(d >> 1) ^ -static_cast<int32_t>(d & 1)));
      }
      if (compact::DiffByte(old, v) != d) o.bad = std::min(o.bad, i);
      o.hits[i / 64] |= uint64_t{1} << (i % 64);
      o.values[i] = v;
      o.data[i] = v;
      o.undo_pos.push_back(static_cast<uint32_t>(index0 + i));
      o.undo_old.push_back(old);
      o.h_new.push_back(v);
      const uint64_t g = cur.g[c]++;
      r = cur.g[c] >= s.end[c] ? kNone : r + (s.ranks[g + 1] - s.ranks[g]);
    }
    cur.rem[c] = r == kNone ? kNone : r - pos.size();
  }
  return o;
}

// ClassPlaceDecode16 on one block against the reference's hits and values:
// the changes in element order (index, new value, old value from `data`),
// their count, the return; nothing written past the count (each output
// one slot longer, its last slot a sentinel).
void ExpectDecodes(const uint64_t* masks, const uint32_t* before, uint32_t classes, const uint16_t* data, size_t n,
                   uint64_t at, const kernels::ClassWalkStreams& streams, kernels::ClassWalkCursor& cur,
                   const BlockOut& ref) {
  std::vector<uint64_t> want_indices;
  std::vector<uint16_t> want_values, want_side;
  for (size_t i = 0; i < n; ++i) {
    if (!(ref.hits[i / 64] >> (i % 64) & 1)) continue;
    want_indices.push_back(at + i);
    want_values.push_back(ref.values[i]);
    want_side.push_back(data[i]);
  }
  const size_t count = want_indices.size();
  std::vector<uint64_t> indices(count + 1, 0x5A5A5A5A5A5A5A5Aull);
  std::vector<uint8_t> values(2 * count + 2, 0x5A);
  std::vector<uint16_t> side(count + 1, 0x5A5A);
  size_t placed = ~size_t{0};
  const kernels::ClassDecodeOut out{at, indices.data(), values.data(), side.data()};
  ASSERT_EQ(kernels::ClassPlaceDecode16(masks, before, classes, data, n, streams, cur, out, &placed), ref.bad)
      << "decode, block at " << at;
  ASSERT_EQ(placed, count) << "decode, block at " << at;
  ASSERT_EQ(indices.back(), 0x5A5A5A5A5A5A5A5Aull) << "written past the count, block at " << at;
  ASSERT_EQ(values[2 * count], 0x5A) << "written past the count, block at " << at;
  ASSERT_EQ(values[2 * count + 1], 0x5A) << "written past the count, block at " << at;
  ASSERT_EQ(side.back(), 0x5A5A) << "written past the count, block at " << at;
  indices.pop_back();
  side.pop_back();
  std::vector<uint16_t> got_values(count);
  std::memcpy(got_values.data(), values.data(), 2 * count);
  ASSERT_EQ(indices, want_indices) << "decode, block at " << at;
  ASSERT_EQ(got_values, want_values) << "decode, block at " << at;
  ASSERT_EQ(side, want_side) << "decode, block at " << at;
}

void ExpectCursorsEqual(const kernels::ClassWalkCursor& a, const kernels::ClassWalkCursor& b, size_t at) {
  for (int c = 0; c < 16; ++c) {
    ASSERT_EQ(a.rem[c], b.rem[c]) << "block at " << at << ", class " << c;
    ASSERT_EQ(a.g[c], b.g[c]) << "block at " << at << ", class " << c;
    ASSERT_EQ(a.e[c], b.e[c]) << "block at " << at << ", class " << c;
  }
}

// Every block of `base` in turn (the last partial), both kernels against
// the reference, the cursors carried over; the ranks as u64 or (`narrow`)
// as u32 (ClassWalkStreams::ranks32), each in a vector of exactly their
// count.
void ExpectPlacesOfRoute(const std::vector<uint16_t>& base, const Streams& s, uint32_t classes, bool narrow) {
  SCOPED_TRACE(narrow ? "u32 ranks" : "u64 ranks");
  const std::vector<uint32_t> ranks32(s.ranks.begin(), s.ranks.end());
  const kernels::ClassWalkStreams streams{narrow ? nullptr : s.ranks.data(), narrow ? ranks32.data() : nullptr,
                                          s.end.data(), s.diffs.data(), s.escapes.data()};
  kernels::ClassWalkCursor want = StartCursor(s), select = want, apply = want, decode = want;
  alignas(64) uint8_t bytes[kBlock];
  uint16_t counts[16];
  uint64_t masks[16 * kWords];
  uint32_t before[16 * (kWords + 1)];
  size_t bad_blocks = 0;
  for (size_t at = 0; at < base.size(); at += kBlock) {
    const size_t n = std::min(kBlock, base.size() - at);
    kernels::ClassCountsBytes16(base.data() + at, n, classes, counts, bytes);
    kernels::ClassMasksOfBytes16(bytes, n, classes, masks, before);
    const BlockOut ref = Reference(base.data() + at, n, at, classes, s, want);
    bad_blocks += ref.bad < n;

    std::vector<uint64_t> hits(kWords, ~uint64_t{0});
    std::vector<uint16_t> values(kBlock, 0);
    const size_t bad = kernels::ClassPlace16(masks, before, classes, base.data() + at, n, streams, select, hits.data(),
                                             values.data());
    ASSERT_EQ(bad, ref.bad) << "select, block at " << at;
    ASSERT_EQ(hits, ref.hits) << "block at " << at;
    for (size_t i = 0; i < n; ++i) {
      if (ref.hits[i / 64] >> (i % 64) & 1) ASSERT_EQ(values[i], ref.values[i]) << "element " << at + i;
    }
    ExpectCursorsEqual(select, want, at);
    ExpectDecodes(masks, before, classes, base.data() + at, n, at, streams, decode, ref);
    ExpectCursorsEqual(decode, want, at);

    std::vector<uint16_t> data(base.begin() + static_cast<ptrdiff_t>(at), base.begin() + static_cast<ptrdiff_t>(at + n));
    std::vector<uint32_t> undo_pos(n + 1, 0);
    std::vector<uint16_t> undo_old(n + 1, 0), h_new(n + 1, 0);
    size_t placed = 0;
    const kernels::ClassApplyOut out{static_cast<uint32_t>(at), undo_pos.data(), undo_old.data(), h_new.data()};
    const size_t bad_apply =
        kernels::ClassPlaceApply16(masks, before, classes, data.data(), n, streams, apply, out, &placed);
    ASSERT_EQ(bad_apply, ref.bad) << "apply, block at " << at;
    ASSERT_EQ(placed, ref.undo_pos.size()) << "block at " << at;
    ASSERT_EQ(data, ref.data) << "block at " << at;
    undo_pos.resize(placed);
    undo_old.resize(placed);
    h_new.resize(placed);
    ASSERT_EQ(undo_pos, ref.undo_pos) << "block at " << at;
    ASSERT_EQ(undo_old, ref.undo_old) << "block at " << at;
    ASSERT_EQ(h_new, ref.h_new) << "block at " << at;
    ExpectCursorsEqual(apply, want, at);
  }
  for (int c = 0; c < 16; ++c) {
    if (classes >> c & 1) ASSERT_EQ(want.g[c], s.end[c]) << "class " << c << ": the case's changes were not all placed";
  }
  (void)bad_blocks;
}

void ExpectPlaces(const std::vector<uint16_t>& base, const Streams& s, uint32_t classes) {
  ExpectPlacesOfRoute(base, s, classes, false);
  ExpectPlacesOfRoute(base, s, classes, true);
}

TEST(ClassPlace, CanonicalChangesEqualTheReferenceOnEveryTarget) {
  std::mt19937_64 rng(26);
  const std::vector<uint16_t> base = Base(rng, 5 * kBlock + 300);
  const Streams s = MakeStreams(rng, base, 0);
  uint32_t classes = 0;
  for (int c = 0; c < 16; ++c) classes |= uint32_t{s.end[c] > s.begin[c]} << c;
  testing_bf16::ForEachTarget([&] { ExpectPlaces(base, s, classes); });
}

// Non-canonical codes of every kind: the smallest offset of one in each
// block, from both kernels; everything placed as the reference places it.
TEST(ClassPlace, NonCanonicalCodesAreFoundOnEveryTarget) {
  for (int seed = 0; seed < 6; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(100 + seed);
    const std::vector<uint16_t> base = Base(rng, 4 * kBlock + 77);
    const Streams s = MakeStreams(rng, base, seed < 3 ? 3 : 40);
    uint32_t classes = 0;
    for (int c = 0; c < 16; ++c) classes |= uint32_t{s.end[c] > s.begin[c]} << c;
    // The case holds non-canonical codes (so a check that passes everything fails here).
    size_t bad = 0;
    {
      kernels::ClassWalkCursor cur = StartCursor(s);
      for (size_t at = 0; at < base.size(); at += kBlock) {
        const size_t n = std::min(kBlock, base.size() - at);
        bad += Reference(base.data() + at, n, at, classes, s, cur).bad < n;
      }
    }
    ASSERT_GT(bad, 0u);
    testing_bf16::ForEachTarget([&] { ExpectPlaces(base, s, classes); });
  }
}

// Every diff byte's check against compact::DiffByte from bases spread over
// the range and every base near +-0, the sign change at 0x7FFF/0x8000 and
// the non-finite values: one change, in a one-element block.
TEST(ClassPlace, EveryDiffByteFromEveryBaseIsCheckedAsDiffByte) {
  std::vector<uint16_t> bases;
  for (uint32_t b = 0; b < 0x10000; b += 0x3F) bases.push_back(static_cast<uint16_t>(b));
  // Every base within a diff's reach of a sign change or a non-finite value.
  for (uint32_t b = 0x7E00; b < 0x8200; ++b) bases.push_back(static_cast<uint16_t>(b));
  for (uint32_t b = 0; b < 0x100; ++b) bases.push_back(static_cast<uint16_t>(b));
  for (uint32_t b = 0xFE00; b < 0x10000; ++b) bases.push_back(static_cast<uint16_t>(b));
  for (uint16_t b : {0x0000, 0x0001, 0x007E, 0x007F, 0x7F7F, 0x7F80, 0x7F81, 0x7FFF, 0x8000, 0x8001, 0xFF7F, 0xFF80,
                     0xFF81, 0xFFFF}) {
    bases.push_back(b);
  }
  testing_bf16::ForEachTarget([&] {
    for (uint16_t b : bases) {
      const int c = compact::ClassOf(b);
      alignas(64) uint8_t bytes[64];
      uint16_t counts[16];
      uint64_t masks[kWords];
      uint32_t before[kWords + 1];
      kernels::ClassCountsBytes16(&b, 1, 1u << c, counts, bytes);
      kernels::ClassMasksOfBytes16(bytes, 1, 1u << c, masks, before);
      for (int d = 0; d < 255; ++d) {
        const uint64_t rank = 0;
        std::array<uint64_t, 16> end{};
        end[c] = 1;
        const uint8_t diff = static_cast<uint8_t>(d);
        const kernels::ClassWalkStreams streams{&rank, nullptr, end.data(), &diff, nullptr};
        kernels::ClassWalkCursor cur{};
        cur.rem[c] = 0;
        uint64_t hits[kWords];
        uint16_t values[kBlock];
        const uint16_t v = static_cast<uint16_t>(b + (static_cast<int32_t>(d >> 1) ^ -static_cast<int32_t>(d & 1)));
        const size_t want = compact::DiffByte(b, v) == diff ? 1 : 0;
        ASSERT_EQ(kernels::ClassPlace16(masks, before, 1u << c, &b, 1, streams, cur, hits, values), want)
            << "base " << b << ", diff byte " << d;
        ASSERT_EQ(values[0], v);
        ASSERT_EQ(cur.rem[c], kNone);
        // The decode's alike.
        kernels::ClassWalkCursor decode_cur{};
        decode_cur.rem[c] = 0;
        uint64_t index = 0;
        uint8_t value[2] = {0, 0};
        uint16_t side = 0;
        size_t decoded = 0;
        const kernels::ClassDecodeOut dout{7, &index, value, &side};
        ASSERT_EQ(kernels::ClassPlaceDecode16(masks, before, 1u << c, &b, 1, streams, decode_cur, dout, &decoded), want)
            << "decode: base " << b << ", diff byte " << d;
        ASSERT_EQ(decoded, 1u);
        ASSERT_EQ(index, 7u);
        ASSERT_EQ(value[0] | value[1] << 8, v);
        ASSERT_EQ(side, b);
        // The apply's check (ORed into a flag per class and block) alike.
        kernels::ClassWalkCursor apply_cur{};
        apply_cur.rem[c] = 0;
        uint16_t data = b, undo_old = 0, h_new = 0;
        uint32_t undo_pos = 0;
        size_t placed = 0;
        const kernels::ClassApplyOut out{0, &undo_pos, &undo_old, &h_new};
        ASSERT_EQ(kernels::ClassPlaceApply16(masks, before, 1u << c, &data, 1, streams, apply_cur, out, &placed), want)
            << "apply: base " << b << ", diff byte " << d;
        ASSERT_EQ(data, v);
        ASSERT_EQ(placed, 1u);
      }
    }
  });
}

// Per block and class a given number of changes around the AVX-512 route's
// batches of 16 ranks (0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, all),
// placed at the class's last elements of the block (its last word) or
// spread; blocks 2 and 3 wholly of class 9, every element of block 2
// changed, block 3's last word only; a short last block; canonical diffs,
// escapes, and (when `bad`) a non-canonical code now and then.
Streams CountedStreams(std::mt19937_64& rng, const std::vector<uint16_t>& base, bool bad) {
  static constexpr size_t kCounts[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 48, kBlock};
  std::array<std::vector<uint64_t>, 16> of_class;
  for (size_t i = 0; i < base.size(); ++i) of_class[compact::ClassOf(base[i])].push_back(i);
  std::uniform_int_distribution<uint32_t> any(0, 0xFFFF), small(1, 3);
  Streams s;
  for (int c = 0; c < 16; ++c) {
    s.BeginClass(c);
    const std::vector<uint64_t>& pos = of_class[c];
    for (size_t r0 = 0; r0 < pos.size();) {
      const size_t blk = pos[r0] / kBlock;
      size_t r1 = r0;
      while (r1 < pos.size() && pos[r1] / kBlock == blk) ++r1;
      const size_t avail = r1 - r0;
      size_t want = std::min(avail, kCounts[(blk + static_cast<size_t>(c)) % std::size(kCounts)]);
      bool last = (blk + static_cast<size_t>(c)) % 2 == 1;
      if (blk == 2) want = avail;
      if (blk == 3) {
        want = std::min<size_t>(avail, 64);
        last = true;
      }
      for (size_t j = 0; j < want; ++j) {
        // The last `want` of the block's class elements, or spread over them.
        const size_t r = last ? r1 - want + j : r0 + j * avail / want;
        const uint16_t o = base[pos[r]];
        const uint32_t kind = any(rng) % 16;
        uint16_t v = static_cast<uint16_t>(kind == 0 ? any(rng) : o + (kind % 2 ? small(rng) : -small(rng)));
        uint8_t d = compact::DiffByte(o, v);
        if (bad && kind == 2) {
          d = static_cast<uint8_t>(any(rng) % 255);  // any diff byte: canonical or not
        } else if (bad && kind == 4) {
          d = compact::kEscape;  // an escape, maybe where a diff fits
        }
        s.Add(r, d, v);
      }
      r0 = r1;
    }
    s.EndClass(c);
  }
  return s;
}

TEST(ClassPlace, BlocksWithEveryBatchSizeOfChangesOnEveryTarget) {
  for (int seed = 0; seed < 4; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(340 + seed);
    std::vector<uint16_t> base = Base(rng, 14 * kBlock + 515);
    for (size_t i = 2 * kBlock; i < 4 * kBlock; ++i) {
      base[i] = static_cast<uint16_t>(121 << 7 | (i & 0x7F));  // blocks 2 and 3: class 9 only
    }
    const Streams s = CountedStreams(rng, base, seed % 2 == 1);
    uint32_t classes = 0;
    for (int c = 0; c < 16; ++c) classes |= uint32_t{s.end[c] > s.begin[c]} << c;
    testing_bf16::ForEachTarget([&] { ExpectPlaces(base, s, classes); });
  }
}

// The one non-canonical code of a block at the edge of the edge classes'
// changes in a block of classes 0, 5 and 15 (the AVX-512 route checks the
// diff bytes of its block list's first entries, class 0's, and its last,
// class 15's, only): block 0 the last change of class 0, block 1 the first
// of class 15, block 2 both, block 3 none; every other change canonical.
// Both kernels must return exactly that offset, as the reference does.
TEST(ClassPlace, TheEdgeClassesOnlyBadCodeAtTheirListEndsIsFoundOnEveryTarget) {
  constexpr size_t kBlocks = 4;
  std::vector<uint16_t> base(kBlocks * kBlock);
  for (size_t i = 0; i < base.size(); ++i) {
    const auto mant = static_cast<uint16_t>(1 + i % 0x7D);  // 1..0x7D: one ULP up stays finite, same exponent
    base[i] = i % 3 == 0 ? mant : i % 3 == 1 ? static_cast<uint16_t>(117 << 7 | mant) : static_cast<uint16_t>(200 << 7 | mant);
  }
  // The targets: block 0's last class-0 element (0x0000 one ULP down: NaN),
  // block 1's first class-15 element (0x7F7F one ULP up: Inf), both in block 2.
  const auto last0 = [](size_t b) { return (b + 1) * kBlock - 1 - ((b + 1) * kBlock - 1) % 3; };  // i % 3 == 0
  const auto first15 = [](size_t b) { return b * kBlock + (2 + 3 - b * kBlock % 3) % 3; };          // i % 3 == 2
  const std::vector<size_t> zeros = {last0(0), last0(2)}, tops = {first15(1), first15(2)};
  for (size_t t : zeros) base[t] = 0x0000;
  for (size_t t : tops) base[t] = 0x7F7F;
  auto is_target = [&](size_t i) {
    return std::find(zeros.begin(), zeros.end(), i) != zeros.end() || std::find(tops.begin(), tops.end(), i) != tops.end();
  };
  Streams s;
  for (int c = 0; c < 16; ++c) {
    s.BeginClass(c);
    uint64_t r = 0;
    for (size_t i = 0; i < base.size(); ++i) {
      if (compact::ClassOf(base[i]) != c) continue;
      // Every fifth element of the class changes, and the targets.
      if (r % 5 == 1 || is_target(i)) s.Add(r, is_target(i) ? ZigZag(base[i] == 0 ? -1 : 1) : ZigZag(1), 0);
      ++r;
    }
    s.EndClass(c);
  }
  const uint32_t classes = 1u << 0 | 1u << 5 | 1u << 15;
  for (int c = 0; c < 16; ++c) ASSERT_EQ(s.end[c] > s.begin[c], (classes >> c & 1) != 0) << "class " << c;
  // The reference finds exactly the intended offsets.
  {
    kernels::ClassWalkCursor cur = StartCursor(s);
    const size_t want[kBlocks] = {last0(0), first15(1) - kBlock, std::min(last0(2), first15(2)) - 2 * kBlock, kBlock};
    for (size_t b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(Reference(base.data() + b * kBlock, kBlock, b * kBlock, classes, s, cur).bad, want[b]) << "block " << b;
    }
  }
  testing_bf16::ForEachTarget([&] { ExpectPlaces(base, s, classes); });
}

// A block whose last element ends a readable page (the next one
// unmapped), every element changed: neither kernel reads past the block's
// last element on any target (a route that loads a base value wider than
// its element, e.g. a dword gather, must load the block's last one alone:
// session 35 tried one), and both place what the reference places; blocks
// of 1024, 37, 1 and 1023 elements (the data 4-byte aligned or 2 bytes off).
TEST(ClassPlace, NothingPastTheBlockIsReadOnEveryTarget) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* const map = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  ASSERT_EQ(mprotect(static_cast<uint8_t*>(map) + page, page, PROT_NONE), 0);
  uint16_t* const page_end = reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(map) + page);
  for (const size_t n : {kBlock, size_t{37}, size_t{1}, size_t{1023}}) {
    SCOPED_TRACE("block of " + std::to_string(n));
    std::mt19937_64 rng(350 + n);
    const std::vector<uint16_t> base = Base(rng, n);
    // Every element changed by one ULP (an escape where that is not a
    // diff), the ranks, diff bytes and escapes in class order.
    Streams s;
    std::array<std::vector<size_t>, 16> where;
    for (size_t i = 0; i < n; ++i) where[compact::ClassOf(base[i])].push_back(i);
    uint32_t classes = 0;
    for (int c = 0; c < 16; ++c) {
      s.BeginClass(c);
      for (size_t r = 0; r < where[c].size(); ++r) {
        const size_t i = where[c][r];
        const auto v = static_cast<uint16_t>(base[i] + 1);
        s.Add(r, compact::DiffByte(base[i], v), v);
      }
      s.EndClass(c);
      classes |= uint32_t{s.end[c] > s.begin[c]} << c;
    }
    uint16_t* const data = page_end - n;
    std::memcpy(data, base.data(), 2 * n);
    alignas(64) uint8_t bytes[kBlock];
    uint16_t counts[16];
    uint64_t masks[16 * kWords];
    uint32_t before[16 * (kWords + 1)];
    kernels::ClassCountsBytes16(data, n, classes, counts, bytes);
    kernels::ClassMasksOfBytes16(bytes, n, classes, masks, before);
    const kernels::ClassWalkStreams streams{s.ranks.data(), nullptr, s.end.data(), s.diffs.data(), s.escapes.data()};
    testing_bf16::ForEachTarget([&] {
      std::memcpy(data, base.data(), 2 * n);
      kernels::ClassWalkCursor want = StartCursor(s), select = want, apply = want, decode = want;
      const BlockOut ref = Reference(base.data(), n, 0, classes, s, want);
      ExpectDecodes(masks, before, classes, data, n, 0, streams, decode, ref);
      ExpectCursorsEqual(decode, want, 0);
      std::vector<uint64_t> hits(kWords, 0);
      std::vector<uint16_t> values(kBlock, 0);
      ASSERT_EQ(kernels::ClassPlace16(masks, before, classes, data, n, streams, select, hits.data(), values.data()), ref.bad);
      ASSERT_EQ(hits, ref.hits);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(values[i], ref.values[i]) << "element " << i;
      ExpectCursorsEqual(select, want, 0);
      std::vector<uint32_t> undo_pos(n);
      std::vector<uint16_t> undo_old(n), h_new(n);
      size_t placed = 0;
      const kernels::ClassApplyOut out{0, undo_pos.data(), undo_old.data(), h_new.data()};
      ASSERT_EQ(kernels::ClassPlaceApply16(masks, before, classes, data, n, streams, apply, out, &placed), ref.bad);
      ASSERT_EQ(placed, n);
      ASSERT_EQ(std::vector<uint16_t>(data, data + n), ref.data);
      ASSERT_EQ(undo_pos, ref.undo_pos);
      ASSERT_EQ(undo_old, ref.undo_old);
      ASSERT_EQ(h_new, ref.h_new);
      ExpectCursorsEqual(apply, want, 0);
    });
  }
  munmap(map, 2 * page);
}

// Why the kernels test a diff byte's change only in classes 0 and 15
// (class_place_kernels.cc, kEdgeClasses): from every base of any other
// class, every diff byte but the escape codes exactly itself (DiffByte of
// the base and base + UnZigZag(d)); and classes 0 and 15 both hold bases
// where some diff byte does not (so neither may be skipped).
TEST(ClassPlace, OnlyClassesZeroAndFifteenHoldNonCanonicalDiffBytes) {
  std::array<uint64_t, 16> wrong{};
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto o = static_cast<uint16_t>(b);
    for (int d = 0; d < 255; ++d) {
      const auto v = static_cast<uint16_t>(o + (static_cast<int32_t>(d >> 1) ^ -static_cast<int32_t>(d & 1)));
      wrong[compact::ClassOf(o)] += compact::DiffByte(o, v) != static_cast<uint8_t>(d);
    }
  }
  for (int c = 1; c < 15; ++c) EXPECT_EQ(wrong[c], 0u) << "class " << c;
  EXPECT_GT(wrong[0], 0u);
  EXPECT_GT(wrong[15], 0u);
}

}  // namespace
}  // namespace deltasync

namespace deltasync {
namespace {

// kernels::HitOffsets16 (the decode's hits in element order) against a bit
// by bit reference on every target: words with no set bit, one, up to the
// four written unconditionally, more (the loop past them), all 64 (bit 63
// set), random ones; the slack past the count may be written, nothing
// beyond it.
TEST(ClassPlace, HitOffsetsAreTheSetBitsInOrderOnEveryTarget) {
  std::mt19937_64 rng(28);
  std::vector<std::array<uint64_t, kWords>> cases;
  cases.push_back({});                                   // no hits
  cases.push_back({});
  cases.back().fill(~uint64_t{0});                       // every element
  std::array<uint64_t, kWords> edges{};
  for (size_t w = 0; w < kWords; ++w) edges[w] = (uint64_t{1} << (w % 8)) - 1 | (w % 3 == 0 ? uint64_t{1} << 63 : 0);
  cases.push_back(edges);                                // 0..7 low bits, some with bit 63
  for (int k = 0; k < 200; ++k) {
    std::array<uint64_t, kWords> words{};
    const int density = k % 8;  // 1 in 2^density bits set, about
    for (uint64_t& w : words) {
      w = rng();
      for (int d = 0; d < density; ++d) w &= rng();
    }
    cases.push_back(words);
  }
  testing_bf16::ForEachTarget([&] {
    for (const auto& words : cases) {
      std::vector<uint16_t> want;
      for (size_t w = 0; w < kWords; ++w) {
        for (size_t b = 0; b < 64; ++b) {
          if (words[w] >> b & 1) want.push_back(static_cast<uint16_t>(64 * w + b));
        }
      }
      std::vector<uint16_t> got(kBlock + kernels::kHitOffsetsSlack + 1, 0xBEEF);
      const size_t n = kernels::HitOffsets16(words.data(), got.data());
      ASSERT_EQ(n, want.size());
      ASSERT_EQ(std::vector<uint16_t>(got.begin(), got.begin() + static_cast<ptrdiff_t>(n)), want);
      for (size_t j = n + kernels::kHitOffsetsSlack; j < got.size(); ++j) {
        ASSERT_EQ(got[j], 0xBEEF) << "written at " << j;
      }
    }
  });
}

}  // namespace
}  // namespace deltasync
