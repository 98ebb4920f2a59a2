// ScanCompactSpan (the fused compact scan's kernel) against a scalar
// reference written here, element by element, on every SIMD target (the
// AVX-512 raw route and its Highway twin, "AVX3-no-raw", included): the
// class streams, old values, bitmap, hash change, state and return value,
// for fp32 inputs that the hardware bf16 conversion would round otherwise
// (NaN payloads, denormals, ties, overflow to Inf), every class in every
// word, spans of any length and state carried in from a previous span.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bf16/bf16_test_util.h"
#include "bf16/compact_scan.h"
#include "bf16/hash_term.h"
#include "bf16/round.h"
#include "codec/compact_bf16.h"

namespace deltasync {
namespace {

using kernels::CompactScanSpan;
using kernels::CompactScanState;
using kernels::kScanClasses;
using testing_bf16::ForEachTarget;

constexpr uint64_t kSeed[2] = {0x0123456789ABCDEFull, 0xFEDCBA9876543210ull};

// What one span's scan leaves.
struct ScanOut {
  std::array<std::vector<uint32_t>, kScanClasses> gaps;
  std::array<std::vector<uint8_t>, kScanClasses> diffs;
  std::array<std::vector<uint16_t>, kScanClasses> escapes;
  std::vector<uint16_t> old_values;
  std::vector<uint64_t> words;
  std::vector<uint16_t> published;
  CompactScanState state;
  size_t result = 0;
};

bool operator==(const CompactScanState& a, const CompactScanState& b) {
  return a.seen == b.seen && a.next == b.next && a.changes == b.changes && a.escapes == b.escapes &&
         a.old_values == b.old_values && a.hash[0] == b.hash[0] && a.hash[1] == b.hash[1];
}

// The span's new value of element e.
uint16_t Fresh(const std::vector<uint32_t>& cur, bool f32, size_t e) {
  return f32 ? bf16::RoundFp32ToBf16(cur[e]) : static_cast<uint16_t>(cur[e]);
}

// Element by element, as compact_scan.h describes the kernel.
ScanOut Reference(std::vector<uint16_t> pub, const std::vector<uint32_t>& cur, bool f32, bool check_finite,
                  uint64_t index0, CompactScanState st) {
  ScanOut out;
  const size_t n = pub.size();
  size_t stop = n;
  out.result = n;
  if (check_finite) {
    for (size_t e = 0; e < n; ++e) {
      if (bf16::IsNonFinite(Fresh(cur, f32, e), bf16::kBf16ExpMask)) {
        out.result = e;
        stop = e / kernels::kScanBlockElements * kernels::kScanBlockElements;
        break;
      }
    }
  }
  out.words.assign((n + 63) / 64, 0);
  for (size_t e = 0; e < stop; ++e) {
    const uint16_t p = pub[e], r = Fresh(cur, f32, e);
    const int c = compact::ClassOf(p);
    if (r != p) {
      out.gaps[c].push_back(static_cast<uint32_t>(st.seen[c] - st.next[c]));
      st.next[c] = st.seen[c] + 1;
      const uint8_t d = compact::DiffByte(p, r);
      out.diffs[c].push_back(d);
      if (d == compact::kEscape) {
        out.escapes[c].push_back(r);
        ++st.escapes[c];
      }
      ++st.changes[c];
      out.old_values.push_back(p);
      ++st.old_values;
      out.words[e / 64] |= uint64_t{1} << (e % 64);
      for (int lane = 0; lane < 2; ++lane) {
        st.hash[lane] += state_hash::ElementTerm(lane, kSeed[lane], index0 + e, r) -
                         state_hash::ElementTerm(lane, kSeed[lane], index0 + e, p);
      }
      pub[e] = r;
    }
    ++st.seen[c];
  }
  out.published = std::move(pub);
  out.state = st;
  return out;
}

// The kernel on the active target; its outputs hold entries from `st`'s
// counts on (those before are left as zeros, as the reference has none).
ScanOut Kernel(std::vector<uint16_t> pub, const std::vector<uint32_t>& cur, bool f32, bool check_finite,
               uint64_t index0, CompactScanState st) {
  const size_t n = pub.size();
  std::vector<uint16_t> cur16(n);
  for (size_t e = 0; e < n; ++e) cur16[e] = static_cast<uint16_t>(cur[e]);
  std::array<std::vector<uint32_t>, kScanClasses> gaps;
  std::array<std::vector<uint8_t>, kScanClasses> diffs;
  std::array<std::vector<uint16_t>, kScanClasses> escapes;
  std::vector<uint16_t> old_values(st.old_values + n + kernels::kScanOldSlack);
  std::vector<uint64_t> words((n + 63) / 64 + 1, ~uint64_t{0});
  CompactScanSpan span;
  span.published = pub.data();
  span.current = f32 ? static_cast<const void*>(cur.data()) : cur16.data();
  span.f32 = f32;
  span.check_finite = check_finite;
  span.n = n;
  span.index0 = index0;
  span.seed = kSeed;
  for (int c = 0; c < kScanClasses; ++c) {
    gaps[c].assign(st.changes[c] + n + 1, 0);
    diffs[c].assign(st.changes[c] + n + 1, 0);
    escapes[c].assign(st.escapes[c] + n + 1, 0);
    span.gaps[c] = gaps[c].data();
    span.diffs[c] = diffs[c].data();
    span.escapes[c] = escapes[c].data();
  }
  span.old_values = old_values.data();
  span.changed_words = words.data();
  const CompactScanState before = st;
  ScanOut out;
  out.result = kernels::ScanCompactSpan(span, st);
  for (int c = 0; c < kScanClasses; ++c) {
    out.gaps[c].assign(gaps[c].begin() + before.changes[c], gaps[c].begin() + st.changes[c]);
    out.diffs[c].assign(diffs[c].begin() + before.changes[c], diffs[c].begin() + st.changes[c]);
    out.escapes[c].assign(escapes[c].begin() + before.escapes[c], escapes[c].begin() + st.escapes[c]);
  }
  out.old_values.assign(old_values.begin() + before.old_values, old_values.begin() + st.old_values);
  // Words of blocks not scanned (after a refused value) are not written.
  const size_t scanned = out.result == n ? n : out.result / kernels::kScanBlockElements * kernels::kScanBlockElements;
  words.resize((n + 63) / 64);
  for (size_t w = (scanned + 63) / 64; w < words.size(); ++w) words[w] = 0;
  out.words = std::move(words);
  out.published = std::move(pub);
  out.state = st;
  return out;
}

void ExpectSame(const ScanOut& got, const ScanOut& want) {
  EXPECT_EQ(got.result, want.result);
  for (int c = 0; c < kScanClasses; ++c) {
    EXPECT_EQ(got.gaps[c], want.gaps[c]) << "class " << c;
    EXPECT_EQ(got.diffs[c], want.diffs[c]) << "class " << c;
    EXPECT_EQ(got.escapes[c], want.escapes[c]) << "class " << c;
  }
  EXPECT_EQ(got.old_values, want.old_values);
  EXPECT_EQ(got.words, want.words);
  EXPECT_EQ(got.published, want.published);
  EXPECT_TRUE(got.state == want.state);
}

// fp32 bit patterns whose rounding is easy to get wrong.
uint32_t SpecialF32(std::mt19937_64& rng) {
  static constexpr uint32_t kSpecial[] = {
      0x00000000, 0x80000000, 0x00000001, 0x00008000, 0x00008001, 0x00018000, 0x0001FFFF, 0x007FFFFF,
      0x807FFFFF, 0x80018001, 0x00800000, 0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0xFF7F8000,
      0x7F800000, 0xFF800000, 0x7FC00000, 0x7FA00001, 0xFFC12345, 0x7F800001, 0xFFFFFFFF, 0x7FFF8000};
  return kSpecial[rng() % (sizeof(kSpecial) / sizeof(kSpecial[0]))];
}

// A base of n bf16 values with every class in every word (exponents 100-140
// and a few zeros, denormals and non-finite values), and new values: the
// same (as fp32: the base's bits << 16, plus low bits that round back),
// one ULP or more away, sign flips, and special fp32 at `special` rate.
void MakeSpan(std::mt19937_64& rng, size_t n, double rate, double special, bool f32, std::vector<uint16_t>& pub,
              std::vector<uint32_t>& cur) {
  pub.resize(n);
  cur.resize(n);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (size_t e = 0; e < n; ++e) {
    const uint64_t r = rng();
    uint16_t p;
    if (r % 50 == 0) {
      static constexpr uint16_t kOdd[] = {0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC0, 0x7F7F, 0x0080};
      p = kOdd[(r >> 8) % (sizeof(kOdd) / sizeof(kOdd[0]))];
    } else {
      p = static_cast<uint16_t>(((r >> 8) & 0x8000) | (100 + (r >> 16) % 41) << 7 | ((r >> 24) & 0x7F));
    }
    pub[e] = p;
    uint16_t next = p;
    if (u(rng) < rate) {
      const uint64_t k = rng() % 6;
      next = static_cast<uint16_t>(k < 3 ? p + 1 : k < 4 ? p - 3 : k < 5 ? p ^ 0x8000 : static_cast<int>(rng() & 0xFFFF));
    }
    if (f32) {
      // Low bits that round back to `next` (below half an ULP, or a tie to
      // an even value).
      uint32_t low = static_cast<uint32_t>(rng() % 0x8000);
      if (rng() % 16 == 0 && (next & 1) == 0) low = 0x8000;
      cur[e] = static_cast<uint32_t>(next) << 16 | low;
      if ((next & 0x7F80) == 0x7F80) cur[e] = static_cast<uint32_t>(next) << 16;  // Inf, or a NaN kept a NaN
      if (u(rng) < special) cur[e] = SpecialF32(rng);
    } else {
      cur[e] = next;
    }
  }
}

TEST(CompactScanKernel, EqualsTheScalarReferenceOnEveryTarget) {
  std::mt19937_64 rng(77);
  for (bool f32 : {true, false}) {
    for (size_t n : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1000}, size_t{1024}, size_t{1025},
                     size_t{3100}, size_t{5000}}) {
      for (double rate : {0.0, 0.03, 0.5, 1.0}) {
        for (double special : {0.0, 0.002, 0.3}) {
          SCOPED_TRACE((f32 ? "f32 n " : "bf16 n ") + std::to_string(n) + " rate " + std::to_string(rate) +
                       " special " + std::to_string(special));
          std::vector<uint16_t> pub;
          std::vector<uint32_t> cur;
          MakeSpan(rng, n, rate, special, f32, pub, cur);
          // Carried in from an earlier span of the chunk.
          CompactScanState st;
          for (int c = 0; c < kScanClasses; ++c) {
            st.seen[c] = 1000 + 7 * c;
            st.next[c] = c % 3 == 0 ? 0 : 990 + 7 * c;
            st.changes[c] = c;
            st.escapes[c] = c % 2;
          }
          st.old_values = 5;
          st.hash[0] = 11;
          st.hash[1] = 13;
          const uint64_t index0 = 12345;
          const ScanOut want = Reference(pub, cur, f32, false, index0, st);
          ForEachTarget([&] { ExpectSame(Kernel(pub, cur, f32, false, index0, st), want); });
        }
      }
    }
  }
}

// Diff bytes at and around where they turn into escapes (|new - old| of
// 127 and 128 ULPs, both ways), large steps within a sign, steps across
// zero and into Inf/NaN: each change's diff byte is worked out per word
// (AVX-512: on 32 lanes at once), so every step size is set out here.
TEST(CompactScanKernel, DiffBytesAroundTheEscapeBoundsOnEveryTarget) {
  std::mt19937_64 rng(79);
  std::vector<int> steps;
  for (int d = -131; d <= 131; ++d) steps.push_back(d);
  for (int d : {-0x7F00, -0x4000, -0x1000, -300, -255, -254, 254, 255, 256, 300, 0x1000, 0x4000, 0x7F00}) {
    steps.push_back(d);
  }
  for (bool f32 : {true, false}) {
    for (size_t density : {size_t{1}, size_t{3}, size_t{40}}) {
      SCOPED_TRACE((f32 ? "f32 one change in " : "bf16 one change in ") + std::to_string(density));
      const size_t n = steps.size() * density * 2 + 17;
      std::vector<uint16_t> pub(n);
      std::vector<uint32_t> cur(n);
      for (size_t e = 0; e < n; ++e) {
        const uint64_t r = rng();
        // Exponents 1-254 (every class, finite), either sign.
        uint16_t p = static_cast<uint16_t>((r & 0x8000) | (1 + (r >> 16) % 254) << 7 | ((r >> 32) & 0x7F));
        if (e % 97 == 5) p = static_cast<uint16_t>(0x7F80 | (r & 0x8000) | ((r >> 8) & 1));  // Inf or a NaN base
        uint16_t next = p;
        if (e % density == 0) next = static_cast<uint16_t>(p + steps[(e / density) % steps.size()]);
        pub[e] = p;
        cur[e] = f32 ? (static_cast<uint32_t>(next) << 16 |
                        ((next & 0x7F80) == 0x7F80 ? 0u : static_cast<uint32_t>(rng() % 0x8000)))
                     : next;
      }
      const ScanOut want = Reference(pub, cur, f32, false, 777, {});
      ForEachTarget([&] { ExpectSame(Kernel(pub, cur, f32, false, 777, {}), want); });
    }
  }
}

// check_finite: the block holding the first non-finite new value (after
// rounding) and all after it are left untouched, the offset returned.
TEST(CompactScanKernel, StopsAtTheFirstNonFiniteValueOnEveryTarget) {
  std::mt19937_64 rng(78);
  for (bool f32 : {true, false}) {
    for (size_t bad_at : {size_t{0}, size_t{700}, size_t{1024}, size_t{2047}, size_t{4000}}) {
      SCOPED_TRACE((f32 ? "f32 bad at " : "bf16 bad at ") + std::to_string(bad_at));
      std::vector<uint16_t> pub;
      std::vector<uint32_t> cur;
      MakeSpan(rng, 4100, 0.05, 0.0, f32, pub, cur);
      for (size_t e = 0; e < cur.size(); ++e) {
        if (bf16::IsNonFinite(Fresh(cur, f32, e), bf16::kBf16ExpMask)) cur[e] = f32 ? 0x3F800000 : 0x3F80;
        if (bf16::IsNonFinite(pub[e], bf16::kBf16ExpMask)) pub[e] = 0x3F80;
      }
      // A finite fp32 that rounds to Inf, or a bf16 NaN.
      cur[bad_at] = f32 ? 0x7F7FFFFF : 0x7FC1;
      const ScanOut want = Reference(pub, cur, f32, true, 0, {});
      ASSERT_EQ(want.result, bad_at);
      ForEachTarget([&] { ExpectSame(Kernel(pub, cur, f32, true, 0, {}), want); });
    }
  }
}

// Block patterns at the edges of a block pass, on every target: no change;
// every element; words with 0 to 9 changes (a branch-free pass that writes
// a fixed number of offsets a word has its edge there: session 46 tried six);
// only each block's last element; all changes in class 0 or class 15 (the
// first and last class) or in the one class of the whole base; every class
// present but changes in one; and with check_finite, a NaN as the last
// element of a fully changed block.
TEST(CompactScanKernel, BlockPassEdgesOnEveryTarget) {
  std::mt19937_64 rng(81);
  enum Pattern { kNone, kAll, kPerWordCount, kLastOfBlock, kClass0, kClass15, kOneClassBase, kOneClassOfMany };
  for (bool f32 : {true, false}) {
    for (size_t n : {size_t{1024}, size_t{2048 + 37}, size_t{64 * 6 + 1}}) {
      for (Pattern pattern : {kNone, kAll, kPerWordCount, kLastOfBlock, kClass0, kClass15, kOneClassBase,
                              kOneClassOfMany}) {
        SCOPED_TRACE((f32 ? "f32 n " : "bf16 n ") + std::to_string(n) + " pattern " + std::to_string(pattern));
        std::vector<uint16_t> pub(n);
        std::vector<uint32_t> cur(n);
        for (size_t e = 0; e < n; ++e) {
          const uint64_t r = rng();
          // Exponents 100-140 (classes 0-15, ends included), or one class.
          uint16_t exponent = static_cast<uint16_t>(100 + r % 41);
          if (pattern == kOneClassBase) exponent = 120;
          if (pattern == kClass0 && e % 3 == 0) exponent = 105;
          if (pattern == kClass15 && e % 3 == 0) exponent = 133;
          if ((pattern == kClass0 || pattern == kClass15) && e % 3 != 0) exponent = static_cast<uint16_t>(113 + r % 13);
          const uint16_t p = static_cast<uint16_t>(((r >> 8) & 0x8000) | exponent << 7 | ((r >> 24) & 0x7F));
          const size_t in_word = e % 64, word = e / 64;
          bool change = false;
          switch (pattern) {
            case kNone: break;
            case kAll: change = true; break;
            case kPerWordCount: change = in_word < word % 10 * 3 && in_word % 3 == 0; break;
            case kLastOfBlock: change = e % kernels::kScanBlockElements == kernels::kScanBlockElements - 1 || e == n - 1; break;
            case kClass0:
            case kClass15: change = e % 3 == 0; break;
            case kOneClassBase: change = r % 4 == 0; break;
            case kOneClassOfMany: change = compact::ClassOf(p) == 7; break;
          }
          const uint16_t next = change ? static_cast<uint16_t>(p + 1 + (r >> 40) % 3) : p;
          pub[e] = p;
          cur[e] = f32 ? static_cast<uint32_t>(next) << 16 | static_cast<uint32_t>((r >> 44) % 0x8000) : next;
        }
        const ScanOut want = Reference(pub, cur, f32, false, 99, {});
        ForEachTarget([&] { ExpectSame(Kernel(pub, cur, f32, false, 99, {}), want); });
        if (pattern == kAll) {
          // check_finite: the first block's last element a NaN.
          const size_t bad = std::min(n, kernels::kScanBlockElements) - 1;
          cur[bad] = f32 ? 0x7FC00000 : 0x7FC0;
          const ScanOut refused = Reference(pub, cur, f32, true, 99, {});
          ASSERT_EQ(refused.result, bad);
          ForEachTarget([&] { ExpectSame(Kernel(pub, cur, f32, true, 99, {}), refused); });
        }
      }
    }
  }
}

// The old values' run is the caller's (CompactScan keeps one per worker
// and chunk after chunk in it): the scan writes nothing before its count
// nor past n + kScanOldSlack entries after it (the raw route stores whole
// vectors past the count), whether every element changes or a block is
// refused.
TEST(CompactScanKernel, OldValuesStayInsideTheirRoomOnEveryTarget) {
  std::mt19937_64 rng(80);
  constexpr uint16_t kGuard = 0xA5A5;
  for (bool f32 : {true, false}) {
    for (size_t n : {size_t{1}, size_t{64}, size_t{1000}, size_t{2048}, size_t{3071}}) {
      for (bool refuse : {false, true}) {
        SCOPED_TRACE((f32 ? "f32 n " : "bf16 n ") + std::to_string(n) + (refuse ? " refused" : ""));
        std::vector<uint16_t> pub;
        std::vector<uint32_t> cur;
        MakeSpan(rng, n, 1.0, 0.0, f32, pub, cur);
        for (size_t e = 0; e < n; ++e) {
          if (bf16::IsNonFinite(Fresh(cur, f32, e), bf16::kBf16ExpMask)) cur[e] = f32 ? 0x3F800000 : 0x3F80;
          if (bf16::IsNonFinite(pub[e], bf16::kBf16ExpMask)) pub[e] = 0x3F80;
          if (pub[e] == Fresh(cur, f32, e)) pub[e] ^= 1;  // every element changes
        }
        if (refuse) cur[n - 1] = f32 ? 0x7F800000 : 0x7F80;
        CompactScanState st;
        st.old_values = 7;
        const ScanOut want = Reference(pub, cur, f32, refuse, 0, st);
        ForEachTarget([&] {
          const size_t room = st.old_values + n + kernels::kScanOldSlack;
          std::vector<uint16_t> old_values(room + 64, kGuard);
          std::array<std::vector<uint32_t>, kScanClasses> gaps;
          std::array<std::vector<uint8_t>, kScanClasses> diffs;
          std::array<std::vector<uint16_t>, kScanClasses> escapes;
          std::vector<uint64_t> words((n + 63) / 64);
          std::vector<uint16_t> p = pub;
          CompactScanSpan span;
          span.published = p.data();
          std::vector<uint16_t> cur16(n);
          for (size_t e = 0; e < n; ++e) cur16[e] = static_cast<uint16_t>(cur[e]);
          span.current = f32 ? static_cast<const void*>(cur.data()) : cur16.data();
          span.f32 = f32;
          span.check_finite = refuse;
          span.n = n;
          span.seed = kSeed;
          for (int c = 0; c < kScanClasses; ++c) {
            gaps[c].assign(n + 1, 0);
            diffs[c].assign(n + 1, 0);
            escapes[c].assign(n + 1, 0);
            span.gaps[c] = gaps[c].data();
            span.diffs[c] = diffs[c].data();
            span.escapes[c] = escapes[c].data();
          }
          span.old_values = old_values.data();
          span.changed_words = words.data();
          CompactScanState got = st;
          EXPECT_EQ(kernels::ScanCompactSpan(span, got), want.result);
          EXPECT_EQ(got.old_values, want.state.old_values);
          EXPECT_EQ(p, want.published);
          for (size_t i = 0; i < st.old_values; ++i) ASSERT_EQ(old_values[i], kGuard) << "before the count, entry " << i;
          for (size_t i = st.old_values; i < got.old_values; ++i) {
            ASSERT_EQ(old_values[i], want.old_values[i - st.old_values]) << "entry " << i;
          }
          for (size_t i = room; i < old_values.size(); ++i) ASSERT_EQ(old_values[i], kGuard) << "past the room, entry " << i;
        });
      }
    }
  }
}

}  // namespace
}  // namespace deltasync
