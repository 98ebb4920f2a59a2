// Byte-level helpers of the compact codecs (internal to src/codec;
// docs/format.md, "Compact objects"): LEB128 varints, zigzag, and "blocks" (a byte stream
// stored raw or as one zstd frame, with its decompressed length up front).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "deltasync/status.h"
#include "deltasync/tensor.h"

namespace deltasync::compact {

inline void PutVarint(std::vector<uint8_t>& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v) | 0x80);
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}

inline uint32_t ZigZag(int32_t v) { return (static_cast<uint32_t>(v) << 1) ^ static_cast<uint32_t>(v >> 31); }
inline int32_t UnZigZag(uint32_t v) { return static_cast<int32_t>(v >> 1) ^ -static_cast<int32_t>(v & 1); }

// A bounds-checked reader over untrusted bytes.
class Reader {
 public:
  explicit Reader(ByteSpan bytes) : bytes_(bytes) {}
  size_t remaining() const { return bytes_.size() - pos_; }
  size_t position() const { return pos_; }
  std::optional<uint8_t> Byte() {
    if (pos_ >= bytes_.size()) return std::nullopt;
    return bytes_[pos_++];
  }
  // A canonical LEB128 varint of at most 10 bytes that fits uint64 (no
  // redundant trailing zero groups).
  std::optional<uint64_t> Varint();
  std::optional<ByteSpan> Take(size_t n) {
    if (n > remaining()) return std::nullopt;
    ByteSpan s = bytes_.subspan(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  ByteSpan bytes_;
  size_t pos_ = 0;
};

// Block methods.
inline constexpr uint8_t kStored = 0;
inline constexpr uint8_t kZstd = 1;

// PutBlock's `level` for a literal-only zstd frame (order-0 Huffman per
// 128 KiB block, no matches): near the order-0 entropy on match-free data.
inline constexpr int kLiteralsOnly = -1000;

// PutBlock's `level` for data that is already entropy-coded: always stored.
inline constexpr int kStoredOnly = -1001;

// Appends `data` as a block: u8 method, varint raw length, varint stored
// length, stored bytes. zstd at `level` when that is smaller, else stored.
// Deterministic.
void PutBlock(std::vector<uint8_t>& out, ByteSpan data, int level);

// Reads a block whose raw length must be exactly `expected_raw` when set,
// else at most `max_raw`. Decompresses into `out` (resized). On failure, a
// short reason (the caller adds file and tensor).
std::optional<std::string> GetBlock(Reader& in, std::optional<uint64_t> expected_raw, uint64_t max_raw,
                                    std::vector<uint8_t>& out);

// A view of a block without decompressing it (for anchors: decode later, in
// parallel). raw_len and the payload bounds are checked; the payload not.
struct BlockRef {
  uint8_t method = kStored;
  uint64_t raw_len = 0;
  ByteSpan payload;
};
std::optional<std::string> PeekBlock(Reader& in, uint64_t expected_raw, BlockRef& out);
// Decompresses `ref` into exactly ref.raw_len bytes at `dst`.
std::optional<std::string> DecodeBlock(const BlockRef& ref, uint8_t* dst);

// A bit stream, least significant bit first within each byte; the last byte
// is padded with zero bits.
class BitWriter {
 public:
  // The low `bits` bits of `value` (bits <= 64).
  void Put(uint64_t value, int bits) {
    Local l = Begin(static_cast<uint64_t>(bits));
    l.Put(value, bits);
    End(l);
  }
  // The writer's state in locals for a hot loop (PutRiceGaps): through the
  // members every byte store may alias them, so the compiler reloads them
  // after each one. Begin makes room for `max_bits` more bits; Local::Put is
  // Put without growing, for at most that many; End hands the state back.
  struct Local {
    uint8_t* out;
    size_t pos;
    uint64_t acc;
    int n;
    void Put(uint64_t value, int bits) {
      if (bits > 56) {
        Put(value & 0xFFFFFFFFu, 32);
        Put(value >> 32, bits - 32);
        return;
      }
      if (bits < 64) value &= (uint64_t{1} << bits) - 1;
      acc |= value << n;  // n < 8, bits <= 56: fits
      n += bits;
      // Store all 8 accumulator bytes, keep the whole ones.
      std::memcpy(out + pos, &acc, 8);
      const int whole = n >> 3;
      pos += static_cast<size_t>(whole);
      acc = whole == 8 ? 0 : acc >> (8 * whole);
      n &= 7;
    }
    // Put for a value known to fit: bits <= 56 and value < 2^bits (no
    // mask, no split; n + bits <= 63, so at most 7 whole bytes leave).
    void PutFitting(uint64_t value, int bits) {
      acc |= value << n;
      n += bits;
      std::memcpy(out + pos, &acc, 8);
      pos += static_cast<size_t>(n >> 3);
      acc >>= (n & ~7);
      n &= 7;
    }
  };
  Local Begin(uint64_t max_bits) {
    const size_t need = pos_ + static_cast<size_t>(max_bits / 8) + 16;
    if (out_.size() < need) out_.resize(std::max<size_t>(64, 2 * need));
    return Local{out_.data(), pos_, acc_, n_};
  }
  void End(const Local& l) {
    pos_ = l.pos;
    acc_ = l.acc;
    n_ = l.n;
  }
  // Appends the stream to `dst` (as Finish would return it) and starts a
  // new one, keeping this writer's buffer: a writer reused for stream after
  // stream touches no fresh memory once its buffer has grown.
  void FinishAppend(std::vector<uint8_t>& dst) {
    dst.insert(dst.end(), out_.data(), out_.data() + pos_);
    if (n_ > 0) dst.push_back(static_cast<uint8_t>(acc_));
    acc_ = 0;
    n_ = 0;
    pos_ = 0;
  }
  std::vector<uint8_t> Finish() {
    out_.resize(pos_);
    if (n_ > 0) out_.push_back(static_cast<uint8_t>(acc_));
    acc_ = 0;
    n_ = 0;
    pos_ = 0;
    return std::move(out_);
  }

 private:
  std::vector<uint8_t> out_;
  size_t pos_ = 0;   // whole bytes written
  uint64_t acc_ = 0;
  int n_ = 0;  // < 8 between calls
};

// Reads a BitWriter's stream; every read is bounds-checked (nullopt past the
// end).
class BitReader {
 public:
  explicit BitReader(ByteSpan bytes) : bytes_(bytes) {}
  // `bits` <= 64 bits.
  std::optional<uint64_t> Get(int bits) {
    if (bits > 32) {
      std::optional<uint64_t> lo = Get(32), hi = lo ? Get(bits - 32) : std::nullopt;
      if (!hi) return std::nullopt;
      return *lo | (*hi << 32);
    }
    Refill();
    if (n_ < bits) return std::nullopt;
    const uint64_t v = bits == 0 ? 0 : acc_ & ((uint64_t{1} << bits) - 1);
    Drop(bits);
    return v;
  }
  // Counts one bits up to a zero bit (consumed) or up to `max` ones (no
  // terminator then), max <= 56.
  std::optional<int> Unary(int max) {
    Refill();
    const int ones = ~acc_ == 0 ? 64 : __builtin_ctzll(~acc_);
    if (ones >= max) {
      if (n_ < max) return std::nullopt;
      Drop(max);
      return max;
    }
    if (ones >= n_) return std::nullopt;  // no terminator before the end
    Drop(ones + 1);
    return ones;
  }
  // The fast path of the Rice reader (GetRiceGaps): codes with parameter k
  // into out[i, e) for as long as each code's unary part is shorter than
  // kFastUnary and the whole code is at hand; returns the index of the first
  // gap left for a slower reader (e when none; i at once where k >
  // kFastK). The state lives in locals meanwhile, so the loop runs in
  // registers. With `rank` (a GapRanks), writes ranks instead (the ranks
  // GapRanks::Next gives, and the same `past`); a uint32_t `out` takes each
  // rank's low 32 bits (GetRiceGaps).
  // The window is read at a bit offset b instead of shifted per code: the
  // loop's chain per code is b -> shift of the complemented window -> TZCNT
  // -> add (the code's end), where a shifted window's was shift, NOT,
  // TZCNT, add, and a test for 64 ones. Always inlined, so that
  // GetRiceGaps's BMI2 copy compiles it with BMI1/2 (codec_targets.h).
  static constexpr int kFastUnary = 16;
  static constexpr int kFastK = 40;
  static constexpr uint64_t kFastRun = 1024;  // codes at most per call (GetRiceGaps: a block's)
  template <typename T, typename Ranks = std::nullptr_t>
  __attribute__((always_inline)) inline uint64_t RiceRun(int k, T* out, uint64_t i, uint64_t e,
                                                          Ranks rank = nullptr) {
    if (k > kFastK || i >= e) return i;
    e = std::min(e, i + kFastRun);
    uint64_t acc = acc_;
    size_t pos = pos_;
    const uint8_t* data = bytes_.data();
    const size_t size = bytes_.size();
    const uint64_t low_mask = (uint64_t{1} << k) - 1;
    const uint64_t uk = static_cast<uint64_t>(k);
    // The ranks' state in a local (through the pointer every store to out[]
    // may alias it). `past` is settled once at the end (below).
    constexpr bool kRanks = !std::is_same_v<Ranks, std::nullptr_t>;
    uint64_t next = 0;
    if constexpr (kRanks) next = rank->next;
    const uint64_t next0 = next;
    // Bits [b, n) of acc are the stream's next (n <= 63; above n zeros or
    // the stream's next bits, as in Refill). inv is ~acc with bit 63 set:
    // no code ends there (n <= 63), and TZCNT of inv >> b (b <= 63) is never
    // of 0. A code whose terminator or low bits lie at or past n has
    // end > n and refills. Unsigned 64-bit throughout (no sign extensions
    // on the chain); b + k + 1 is summed beside the shift and TZCNT.
    constexpr uint64_t kTop = uint64_t{1} << 63;
    uint64_t inv = ~acc | kTop;
    uint64_t b = 0, un = static_cast<uint64_t>(n_);
    // Two codes a step: the second's unary part is counted from the first's
    // end (a shift count masked to 6 bits: past the window it reads
    // anything, and then the pair's end is past n too), and one test of the
    // pair's end and one of both unary parts decide for both. A pair that
    // does not fit refills and is tried again; one still not fitting (a long
    // code, the stream's end, a block's last odd code) is read alone, as the
    // one-code loop did, or left to the slower reader.
    // The loop's state in as few registers as it can: the outputs by a
    // pointer (no index beside it), k + 1 added by LEA.
    T* o = out + i;
    T* const oe = out + e;
    const auto emit = [&](uint64_t gap) {
      if constexpr (kRanks) {
        *o = static_cast<T>(next + gap);
        next += gap + 1;
      } else {
        *o = gap;
      }
      ++o;
    };
    const auto pair = [&]() -> bool {
      const uint64_t o1 = static_cast<uint64_t>(__builtin_ctzll(inv >> b));
      const uint64_t end1 = b + o1 + uk + 1;
      const uint64_t o2 = static_cast<uint64_t>(__builtin_ctzll(inv >> (end1 & 63)));
      const uint64_t end2 = end1 + o2 + uk + 1;
      if (end2 > un || (o1 | o2) >= kFastUnary) [[unlikely]] return false;
      // The k low bits after each terminator (end - k <= n - k <= 63).
      emit((o1 << uk) | ((acc >> (end1 - uk)) & low_mask));
      emit((o2 << uk) | ((acc >> (end2 - uk)) & low_mask));
      b = end2;
      return true;
    };
    while (o < oe) {
      if (oe - o >= 2 && pair()) continue;
      // A refill: the consumed bits dropped, then one load of as many whole
      // bytes as fit above the n bits held.
      acc >>= b;
      un -= b;
      b = 0;
      const bool refilled = un <= 56 && pos + 8 <= size;
      if (refilled) {
        uint64_t w;
        std::memcpy(&w, data + pos, 8);
        acc |= w << un;
        const uint64_t take = (63 - un) >> 3;
        pos += static_cast<size_t>(take);
        un += 8 * take;
      }
      inv = ~acc | kTop;
      // Without new bits the pair failed above already.
      if (refilled && oe - o >= 2 && pair()) continue;
      // One code alone.
      const uint64_t ones = static_cast<uint64_t>(__builtin_ctzll(inv));
      const uint64_t end = ones + uk + 1;
      if (end > un || ones >= kFastUnary) break;
      emit((ones << uk) | ((acc >> (end - uk)) & low_mask));
      b = end;
    }
    i = static_cast<uint64_t>(o - out);
    acc_ = acc >> b;
    n_ = static_cast<int>(un - b);
    pos_ = pos;
    if constexpr (kRanks) {
      // GapRanks::Next sets `past` once a rank reaches `elements` (or the
      // sum wraps). Here a gap is below kFastUnary << kFastK = 2^44, so the
      // run (at most kFastRun codes) adds below 2^54 to next0: the ranks
      // rise, and wrap at most once (then the last one is below next0). So
      // some rank reached `elements` exactly when the last did or the sum
      // wrapped: one test per run instead of per code.
      if (next != next0) {
        const uint64_t last = next - 1;
        rank->past |= (last >= rank->elements) | (last < next0);
      }
      rank->next = next;
    }
    return i;
  }
  // True when only zero padding (fewer than 8 bits) is left.
  bool AtPaddedEnd() {
    Refill();
    return pos_ == bytes_.size() && n_ < 8 && acc_ == 0;
  }

 private:
  void Refill() {
    if (n_ <= 56 && pos_ + 8 <= bytes_.size()) {
      // One load: as many whole bytes as fit above the n_ bits held.
      uint64_t w;
      std::memcpy(&w, bytes_.data() + pos_, 8);
      acc_ |= w << n_;
      const int take = (63 - n_) >> 3;
      pos_ += static_cast<size_t>(take);
      n_ += 8 * take;
      return;
    }
    while (n_ <= 56 && pos_ < bytes_.size()) {
      acc_ |= static_cast<uint64_t>(bytes_[pos_++]) << n_;
      n_ += 8;
    }
  }
  void Drop(int bits) {
    acc_ = bits >= 64 ? 0 : acc_ >> bits;
    n_ -= bits;
  }
  ByteSpan bytes_;
  size_t pos_ = 0;
  uint64_t acc_ = 0;
  int n_ = 0;
};

}  // namespace deltasync::compact
