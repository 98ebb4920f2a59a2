// Rice-coded gaps of the compact streams (versions 2 and 3; internal to
// src/codec; docs/format.md, "Compact objects").
//
// A class's gaps are coded in blocks of up to kRiceBlock gaps, each block
// with its own parameter k (6 bits): q = gap >> k in unary (q one bits, a
// zero bit) and then k low bits; q >= kUnaryEscape is written as
// kUnaryEscape one bits, the gap's bit width L (7 bits) and its L bits.
// Near the entropy of geometric gaps, and blocks follow the change rate
// along a tensor (rows with large gradients change more often).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "codec/compact_bf16.h"
#include "codec/compact_streams.h"
#include "deltasync/tensor.h"
#include "deltasync/uninit_vector.h"

namespace deltasync::compact {

inline constexpr size_t kRiceBlock = 1024;
inline constexpr int kMaxRiceK = 56;
inline constexpr int kUnaryEscape = 31;

// Writes the next `count` gaps of `source` (blocks restart here).
void PutRiceGaps(BitWriter& w, uint64_t count, GapSource& source);

// A class's running rank while its gaps are read: rank_0 = gap_0,
// rank_j = rank_{j-1} + 1 + gap_j; `past` is set (not an error here, so that
// the caller reports it after any malformed code, as it always has) once a
// rank reaches `elements` (the base's), the later ranks then meaningless.
struct GapRanks {
  uint64_t next = 0;  // the rank a zero gap gives
  uint64_t elements = ~uint64_t{0};
  bool past = false;
  uint64_t Next(uint64_t gap) {
    past |= (gap >= elements) | (next >= elements - gap);  // next + gap >= elements, without overflow
    const uint64_t rank = next + gap;
    next = rank + 1;
    return rank;
  }
};

// Reads `count` gaps into `out`, or with `ranks` the class's ranks (gaps and
// ranks in one pass); on failure a short reason. A uint32_t `out` takes
// ranks only (`ranks` set), each cut to its low 32 bits: exact while
// ranks->elements <= 2^32 and !ranks->past (RankBuffer's narrow route).
template <typename T>
std::optional<std::string> GetRiceGaps(BitReader& r, uint64_t count, T* out, GapRanks* ranks = nullptr);
extern template std::optional<std::string> GetRiceGaps(BitReader&, uint64_t, uint64_t*, GapRanks*);
extern template std::optional<std::string> GetRiceGaps(BitReader&, uint64_t, uint32_t*, GapRanks*);

// A bf16 tensor's ranks (class order, ascending within a class), as the
// parse writes them and the walk reads them: u32 where the tensor has at
// most 2^32 elements (every rank is below the element count, so it fits:
// half the bytes the parse writes and the walk reads back), else u64.
// docs/format.md, "Decoding in parallel inside a tensor".
struct RankBuffer {
  static constexpr uint64_t kNarrowMax = uint64_t{1} << 32;  // elements the narrow route takes
  UninitVector<uint32_t> narrow;
  UninitVector<uint64_t> wide;
  bool is_narrow = false;
  // Sizes the route for a tensor of `elements` to `count` ranks without
  // writing any (SizeUninit: a fresh allocation joins *fresh where given),
  // and empties the other route's vector (keeping its capacity).
  void Resize(uint64_t count, uint64_t elements, std::vector<MutableByteSpan>* fresh = nullptr);
  uint64_t size() const { return is_narrow ? narrow.size() : wide.size(); }
  uint64_t operator[](uint64_t j) const { return is_narrow ? narrow[j] : wide[j]; }
  // Class cl's ranks [begin, begin + count) read from `r` (GetRiceGaps).
  std::optional<std::string> Read(BitReader& r, uint64_t begin, uint64_t count, GapRanks& ranks);
  // f(span of the route's ranks), typed uint32_t or uint64_t.
  template <typename F>
  decltype(auto) Visit(F&& f) const {
    return is_narrow ? f(std::span<const uint32_t>(narrow)) : f(std::span<const uint64_t>(wide));
  }
  void swap(RankBuffer& o) {
    narrow.swap(o.narrow);
    wide.swap(o.wide);
    std::swap(is_narrow, o.is_narrow);
  }
};

// For tests only: every RankBuffer sized after this takes the wide (u64)
// route, so that both routes run on small tensors. Off by default.
void ForceWideRanks(bool wide);

// Hands out one vector's gaps.
class VectorGaps final : public GapSource {
 public:
  explicit VectorGaps(const std::vector<uint64_t>& gaps) : gaps_(gaps) {}
  size_t Next(uint64_t* out, size_t max) override;

 private:
  const std::vector<uint64_t>& gaps_;
  size_t pos_ = 0;
};

}  // namespace deltasync::compact
