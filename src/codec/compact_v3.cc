// Version 3 of the compact bf16 stream (compact_v3.h; docs/format.md,
// "Compact stream version 3").
#include "codec/compact_v3.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <mutex>

#include "codec/compact_rans.h"
#include "codec/compact_rice.h"
#include "common/pages.h"

namespace deltasync::compact {
namespace {

void Finalize(V3Tables::Class& c) {
  c.slots.assign(kRansTotal, 0);
  uint32_t start = 0;
  for (uint32_t s = 0; s < 256; ++s) {
    c.start[s] = static_cast<uint16_t>(start);
    for (uint32_t k = 0; k < c.freq[s]; ++k) c.slots[start + k] = s | k << 8 | (c.freq[s] - 1u) << 20;
    start += c.freq[s];
  }
}

constexpr char kHex[] = "0123456789abcdef";

// WriteBf16StreamV3's working buffers, kept from call to call in a pool
// (one per writer running at once; the encoders' threads are new on every
// call, so thread_local ones would not outlive them): fresh ones would cost
// a page fault per 4 KiB on every publish. They hold one tensor's diff
// bytes and coded pieces (about 2 bytes per change of the largest tensor
// written, per thread).
struct WriterScratch {
  std::vector<uint8_t> diffs;  // the tensor's diff bytes, class order
  std::vector<uint8_t> body;   // the coded pieces, one after another
  std::vector<uint8_t> buf;    // one piece's rANS bytes, written backwards
  BitWriter bits;
  RansEncoderTables encoder;   // the rANS encoder's entries (kept: a delta's tensors share its tables)

  class Lease {
   public:
    Lease() {
      std::lock_guard<std::mutex> hold(mutex());
      if (!pool().empty()) {
        s_ = std::move(pool().back());
        pool().pop_back();
      } else {
        s_ = std::make_unique<WriterScratch>();
      }
    }
    ~Lease() {
      std::lock_guard<std::mutex> hold(mutex());
      pool().push_back(std::move(s_));
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    WriterScratch& operator*() { return *s_; }

   private:
    static std::mutex& mutex() {
      static std::mutex m;
      return m;
    }
    static std::vector<std::unique_ptr<WriterScratch>>& pool() {
      static auto* p = new std::vector<std::unique_ptr<WriterScratch>>();  // never destroyed: no exit-order race
      return *p;
    }
    std::unique_ptr<WriterScratch> s_;
  };
};

int HexDigit(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  return -1;
}

}  // namespace

void CountDiffs(const Bf16Streams& s, DiffHistogram& h) {
  for (int cl = 0; cl < kClasses; ++cl) {
    for (ByteSpan part : s.diffs[cl]) {
      for (uint8_t d : part) h[cl][d]++;
    }
  }
}

V3Tables V3Tables::Build(const DiffHistogram& h) {
  V3Tables t;
  for (int cl = 0; cl < kClasses; ++cl) {
    uint64_t total = 0;
    for (uint64_t c : h[cl]) total += c;
    if (total == 0) continue;
    Class& c = t.classes[cl];
    c.present = true;
    // Scale to kRansTotal, every symbol seen at least 1; the largest count
    // takes up the rounding (or gives to the largest frequencies above 1).
    int64_t sum = 0;
    int top = 0;
    for (int s = 0; s < 256; ++s) {
      if (h[cl][s] == 0) continue;
      const auto scaled = static_cast<uint64_t>(static_cast<unsigned __int128>(h[cl][s]) * kRansTotal / total);
      c.freq[s] = static_cast<uint16_t>(std::max<uint64_t>(1, scaled));
      sum += c.freq[s];
      if (h[cl][s] > h[cl][top]) top = s;
    }
    if (sum < kRansTotal) c.freq[top] = static_cast<uint16_t>(c.freq[top] + (kRansTotal - sum));
    while (sum > kRansTotal) {
      int big = -1;
      for (int s = 0; s < 256; ++s) {
        if (c.freq[s] > 1 && (big < 0 || c.freq[s] > c.freq[big])) big = s;
      }
      c.freq[big]--;  // at most 256 symbols of at least 1: some frequency is above 1
      sum--;
    }
    Finalize(c);
  }
  return t;
}

std::string V3Tables::SerializeHex() const {
  std::vector<uint8_t> b;
  uint16_t bitmap = 0;
  for (int cl = 0; cl < kClasses; ++cl) bitmap = static_cast<uint16_t>(bitmap | (classes[cl].present ? 1u << cl : 0u));
  b.push_back(static_cast<uint8_t>(bitmap));
  b.push_back(static_cast<uint8_t>(bitmap >> 8));
  for (const Class& c : classes) {
    if (!c.present) continue;
    int n = 0;
    for (uint16_t f : c.freq) n += f > 0;
    PutVarint(b, static_cast<uint64_t>(n - 1));
    int prev = -1;
    for (int s = 0; s < 256; ++s) {
      if (c.freq[s] == 0) continue;
      PutVarint(b, static_cast<uint64_t>(s - prev - 1));
      PutVarint(b, c.freq[s] - 1u);
      prev = s;
    }
  }
  std::string hex;
  for (uint8_t x : b) {
    hex += kHex[x >> 4];
    hex += kHex[x & 15];
  }
  return hex;
}

std::optional<std::string> V3Tables::ParseHex(std::string_view hex, V3Tables& out) {
  if (hex.size() % 2 != 0) return "odd number of hex digits";
  std::vector<uint8_t> b(hex.size() / 2);
  for (size_t i = 0; i < b.size(); ++i) {
    const int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return "not lowercase hex at character " + std::to_string(2 * i);
    b[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  Reader in(b);
  std::optional<uint8_t> b0 = in.Byte(), b1 = in.Byte();
  if (!b0 || !b1) return "truncated class bitmap";
  const unsigned bitmap = *b0 | (*b1 << 8u);
  out = V3Tables{};
  for (int cl = 0; cl < kClasses; ++cl) {
    if (!(bitmap >> cl & 1)) continue;
    Class& c = out.classes[cl];
    c.present = true;
    const std::string where = "class " + std::to_string(cl) + ": ";
    std::optional<uint64_t> n = in.Varint();
    if (!n || *n > 255) return where + "symbol count is malformed or above 256";
    int prev = -1;
    uint32_t sum = 0;
    for (uint64_t k = 0; k <= *n; ++k) {
      std::optional<uint64_t> step = in.Varint();
      std::optional<uint64_t> f = step ? in.Varint() : std::nullopt;
      if (!step || !f) return where + "truncated symbol " + std::to_string(k);
      if (*step > 255 || prev + 1 + static_cast<int>(*step) > 255) return where + "symbol " + std::to_string(k) + " is above 255";
      if (*f >= kRansTotal) return where + "frequency of symbol " + std::to_string(k) + " is above " + std::to_string(kRansTotal);
      prev += 1 + static_cast<int>(*step);
      c.freq[prev] = static_cast<uint16_t>(*f + 1);
      sum += static_cast<uint32_t>(*f + 1);
      if (sum > kRansTotal) return where + "frequencies sum past " + std::to_string(kRansTotal);
    }
    if (sum != kRansTotal) return where + "frequencies sum to " + std::to_string(sum) + ", not " + std::to_string(kRansTotal);
    Finalize(c);
  }
  if (in.remaining() != 0) return std::to_string(in.remaining()) + " trailing bytes";
  return std::nullopt;
}

void WriteBf16StreamV3(const Bf16Streams& s, const V3Tables& tables, std::vector<uint8_t>& out) {
  std::array<uint64_t, kClasses + 1> begin{};
  uint16_t bitmap = 0;
  for (int cl = 0; cl < kClasses; ++cl) {
    begin[cl + 1] = begin[cl] + s.counts[cl];
    if (s.counts[cl] > 0) bitmap = static_cast<uint16_t>(bitmap | 1u << cl);
  }
  const uint64_t count = begin[kClasses];
  out.push_back(kStreamVersion3);
  out.push_back(kModeBf16);
  PutVarint(out, count);
  out.push_back(static_cast<uint8_t>(bitmap));
  out.push_back(static_cast<uint8_t>(bitmap >> 8));
  for (int cl = 0; cl < kClasses; ++cl) {
    if (s.counts[cl] > 0) PutVarint(out, s.counts[cl]);
  }
  WriterScratch::Lease lease;
  WriterScratch& scratch = *lease;
  std::vector<uint8_t>& diffs = scratch.diffs;
  std::vector<uint8_t>& body = scratch.body;
  std::vector<uint8_t>& buf = scratch.buf;
  diffs.clear();
  body.clear();
  diffs.reserve(count);
  for (int cl = 0; cl < kClasses; ++cl) {
    for (ByteSpan p : s.diffs[cl]) diffs.insert(diffs.end(), p.begin(), p.end());
  }
  // The encoder's constants of the classes present (compact_rans.h).
  RansEncoderTables& encoder = scratch.encoder;
  encoder.Update(tables, s.counts);
  const uint64_t pieces = (count + kV3Piece - 1) / kV3Piece;
  // Per piece: its gap bytes and rANS bytes (the directory's entries).
  std::vector<std::pair<uint64_t, uint64_t>> lens(pieces);
  const uint8_t* waiting = nullptr;  // the rANS bytes of the second of two pieces coded at once
  const uint8_t* waiting_end = nullptr;
  for (uint64_t p = 0; p < pieces; ++p) {
    const uint64_t lo = p * kV3Piece, hi = std::min(count, lo + kV3Piece);
    BitWriter& w = scratch.bits;
    for (int cl = 0; cl < kClasses; ++cl) {
      const Span part = ClassPart(begin, cl, lo, hi);
      if (part.a < part.b) PutRiceGaps(w, part.b - part.a, *s.gaps[cl]);
    }
    const size_t gaps_at = body.size();
    w.FinishAppend(body);
    lens[p].first = body.size() - gaps_at;
    // rANS, last symbol first, into the end of buf; two whole pieces at
    // once where they follow (the second's bytes wait in buf until its gaps
    // are written).
    const uint8_t* from;
    const uint8_t* to;
    if (waiting != nullptr) {
      from = waiting;
      to = waiting_end;
      waiting = nullptr;
    } else if (hi - lo == kV3Piece && count - hi >= kV3Piece) {
      buf.resize(2 * (2 * kV3Piece + 8));
      const uint64_t los[2] = {lo, hi}, his[2] = {hi, hi + kV3Piece};
      uint8_t* const ends[2] = {buf.data() + buf.size() / 2, buf.data() + buf.size()};
      uint8_t* starts[2];
      EncodeRansPieces2(diffs.data(), begin, los, his, encoder, ends, starts);
      from = starts[0];
      to = ends[0];
      waiting = starts[1];
      waiting_end = ends[1];
    } else {
      buf.resize(2 * (hi - lo) + 8);
      uint8_t* const end = buf.data() + buf.size();
      from = EncodeRansPiece(diffs.data(), begin, lo, hi, encoder, end);
      to = end;
    }
    body.insert(body.end(), from, to);
    lens[p].second = static_cast<uint64_t>(to - from);
  }
  // Room for all of it at once (the escape block is at most its raw bytes
  // and a 21-byte header): no growth copies of a stream of megabytes. A
  // short buffer grows with an eighth to spare: `out` is mostly a kept one
  // (codec/stream_buffers.h) that held a stream of about this size last
  // publish, often a few bytes shorter, and an exact fit would make nearly
  // every publish allocate it again (fresh pages, faulted in as written).
  size_t escape_bytes = 0;
  for (ByteSpan p : s.escapes) escape_bytes += p.size();
  const size_t room = out.size() + 20 * pieces + body.size() + escape_bytes + 32;
  if (out.capacity() < room) out.reserve(room + room / 8);
  for (uint64_t p = 0; p < pieces; ++p) {
    PutVarint(out, lens[p].first);
    PutVarint(out, lens[p].second);
  }
  out.insert(out.end(), body.begin(), body.end());
  // The escape block, only when there are escapes (the diffs say how many).
  std::vector<uint8_t> escapes;
  for (ByteSpan p : s.escapes) escapes.insert(escapes.end(), p.begin(), p.end());
  if (!escapes.empty()) PutBlock(out, escapes, kLiteralsOnly);
}

namespace {

std::string Where(uint64_t p) { return "piece " + std::to_string(p) + ": "; }

// The first failed piece's error (the caller's order: piece by piece), with
// its piece's number; pieces[j] is piece first + j.
std::optional<std::string> FirstPieceError(std::span<const RansPiece> pieces, uint64_t first) {
  for (size_t j = 0; j < pieces.size(); ++j) {
    if (pieces[j].err) return Where(first + j) + *pieces[j].err;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> ParseBf16StreamV3Gaps(Reader& in, uint64_t count, const V3Tables* tables, ParsedBf16& out,
                                                 std::vector<RansPiece>& pieces, V3Sizes* sizes) {
  const size_t start = in.position();
  std::optional<uint8_t> b0 = in.Byte(), b1 = in.Byte();
  if (!b0 || !b1) return "truncated class bitmap";
  const unsigned bitmap = *b0 | (*b1 << 8u);
  auto& begin = out.class_begin;
  begin[0] = 0;
  for (int cl = 0; cl < kClasses; ++cl) {
    uint64_t m = 0;
    if (bitmap >> cl & 1) {
      std::optional<uint64_t> v = in.Varint();
      if (!v || *v == 0 || *v > count - begin[cl]) {
        return "count of class " + std::to_string(cl) + " is malformed, zero or exceeds the count";
      }
      if (!tables || !tables->classes[cl].present) {
        return "class " + std::to_string(cl) + " has changes but the delta's '" + std::string(kTablesKey) +
               "' has no table for it";
      }
      m = *v;
    }
    begin[cl + 1] = begin[cl] + m;
  }
  if (begin[kClasses] != count) return "class counts do not sum to the count";
  const uint64_t n_pieces = (count + kV3Piece - 1) / kV3Piece;
  std::vector<std::pair<uint64_t, uint64_t>> lens(n_pieces);
  uint64_t body = 0;
  for (uint64_t p = 0; p < n_pieces; ++p) {
    std::optional<uint64_t> g = in.Varint();
    std::optional<uint64_t> r = g ? in.Varint() : std::nullopt;
    if (!g || !r) return "piece directory entry " + std::to_string(p) + " is truncated or malformed";
    if (*g > in.remaining() || *r > in.remaining() - *g || body > in.remaining() - *g - *r) {
      return "piece " + std::to_string(p) + " runs past the end of the stream";
    }
    body += *g + *r;
    lens[p] = {*g, *r};
  }
  if (sizes) sizes->header += in.position() - start;
  out.ranks.Resize(count, out.elements);
  SizeUninit(out.diffs, static_cast<size_t>(count), nullptr);
  std::array<GapRanks, kClasses> ranks;  // a class's ranks run on across pieces
  for (GapRanks& r : ranks) r.elements = out.elements;
  const size_t first = pieces.size();
  for (uint64_t p = 0; p < n_pieces; ++p) {
    const uint64_t lo = p * kV3Piece, hi = std::min(count, lo + kV3Piece);
    BitReader bits(*in.Take(lens[p].first));
    std::optional<std::string> err;
    for (int cl = 0; cl < kClasses && !err; ++cl) {
      const Span part = ClassPart(begin, cl, lo, hi);
      if (part.a >= part.b) continue;
      if (auto e = out.ranks.Read(bits, part.a, part.b - part.a, ranks[cl])) {
        err = Where(p) + "class " + std::to_string(cl) + " gaps: " + *e;
      }
    }
    if (!err && !bits.AtPaddedEnd()) err = Where(p) + "trailing bits after the gaps";
    if (err) {
      // The order one piece at a time gives: an earlier piece's rANS error
      // first.
      const std::span<RansPiece> before(pieces.data() + first, pieces.size() - first);
      DecodeRansPieces(before, *tables);
      if (auto e = FirstPieceError(before, 0)) err = e;
      pieces.resize(first);
      return err;
    }
    if (sizes) {
      sizes->gaps += lens[p].first;
      sizes->diffs += lens[p].second;
    }
    RansPiece piece;
    piece.rans = *in.Take(lens[p].second);
    piece.lo = lo;
    piece.hi = hi;
    piece.begin = &out.class_begin;
    piece.d = out.diffs.data();
    pieces.push_back(piece);
  }
  out.past_class = -1;
  for (int cl = kClasses - 1; cl >= 0; --cl) {
    if (ranks[cl].past) out.past_class = cl;
  }
  return std::nullopt;
}

std::optional<std::string> ParseBf16StreamV3Rest(Reader& in, std::span<const RansPiece> pieces,
                                                 const UninitVector<uint8_t>& diffs, std::vector<uint8_t>& escapes,
                                                 V3Sizes* sizes) {
  if (auto err = FirstPieceError(pieces, 0)) return err;
  const uint64_t n_escapes = static_cast<uint64_t>(std::count(diffs.begin(), diffs.end(), kEscape));
  const size_t esc_start = in.position();
  size_t framing = 0;  // the block's method and two lengths: header, as version 2's (MeasureCompactDelta)
  escapes.clear();
  if (n_escapes > 0) {
    if (Reader peek = in; sizes && peek.Byte() && peek.Varint() && peek.Varint()) framing = peek.position() - esc_start;
    if (auto err = GetBlock(in, 2 * n_escapes, 0, escapes)) return "escape block: " + *err;
  }
  if (sizes) {
    sizes->header += framing;
    sizes->escapes += in.position() - esc_start - framing;
  }
  return std::nullopt;
}

std::optional<std::string> ParseBf16StreamV3(Reader& in, uint64_t count, const V3Tables* tables, ParsedBf16& out,
                                             V3Sizes* sizes) {
  thread_local std::vector<RansPiece> pieces;
  pieces.clear();
  if (auto err = ParseBf16StreamV3Gaps(in, count, tables, out, pieces, sizes)) return err;
  if (!pieces.empty()) DecodeRansPieces(pieces, *tables);
  return ParseBf16StreamV3Rest(in, pieces, out.diffs, out.escapes, sizes);
}

}  // namespace deltasync::compact
