// Index encodings: tight loops over contiguous arrays, branch-free where the
// compiler can vectorise them. Unaligned input is read with memcpy.
#include "codec/index_codec.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

static_assert(std::endian::native == std::endian::little, "patch data is little-endian");

namespace deltasync::indexcodec {

size_t FirstNotAscending(std::span<const uint64_t> idx) {
  bool bad = false;
  for (size_t k = 1; k < idx.size(); ++k) bad |= idx[k] <= idx[k - 1];
  if (!bad) return 0;
  size_t k = 1;
  while (idx[k] > idx[k - 1]) ++k;
  return k;
}

namespace {

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// What one pass over the indices learns: the OR of every index and of every
// gap d[k] = idx[k] - idx[k-1] - 1 (d[0] = idx[0]), both mod 2^64. ORs
// vectorise where max and unsigned 64-bit compares do not, and suffice:
//  - when every index is below 2^63, the indices are strictly ascending iff
//    no gap has its top bit set (a step down wraps to d >= 2^63);
//  - every gap fits in w bits iff their OR does.
struct Summary {
  uint64_t or_idx = 0;
  uint64_t or_gap = 0;

  std::optional<bool> Ascending() const {
    if (or_idx >> 63) return std::nullopt;  // positions this large: ask FirstNotAscending
    return (or_gap >> 63) == 0;
  }
};

bool Ascending(const Summary& s, std::span<const uint64_t> idx) {
  std::optional<bool> fast = s.Ascending();
  return fast ? *fast : FirstNotAscending(idx) == 0;
}

// Writes every index as T and summarises. REQUIRES: !idx.empty().
template <typename T>
Summary PackRaw(std::span<const uint64_t> idx, std::vector<uint8_t>& out) {
  out.resize(idx.size() * sizeof(T));
  uint8_t* dst = out.data();
  Summary s{idx[0], idx[0]};
  Store<T>(dst, static_cast<T>(idx[0]));
  for (size_t k = 1; k < idx.size(); ++k) {
    s.or_idx |= idx[k];
    s.or_gap |= idx[k] - idx[k - 1] - 1;
    Store<T>(dst + k * sizeof(T), static_cast<T>(idx[k]));
  }
  return s;
}

// Writes every gap as T (truncating wider ones) and summarises.
// REQUIRES: !idx.empty().
template <typename T>
Summary PackGaps(std::span<const uint64_t> idx, std::vector<uint8_t>& out) {
  out.resize(idx.size() * sizeof(T));
  uint8_t* dst = out.data();
  Summary s{idx[0], idx[0]};
  Store<T>(dst, static_cast<T>(idx[0]));
  for (size_t k = 1; k < idx.size(); ++k) {
    const uint64_t gap = idx[k] - idx[k - 1] - 1;
    s.or_idx |= idx[k];
    s.or_gap |= gap;
    Store<T>(dst + k * sizeof(T), static_cast<T>(gap));
  }
  return s;
}

template <typename T>
DecodeError Raw(ByteSpan bytes, std::vector<uint64_t>& out) {
  const size_t n = bytes.size() / sizeof(T);
  out.resize(n);
  int64_t prev = -1;
  bool bad = false;
  for (size_t k = 0; k < n; ++k) {
    const int64_t v = Load<T>(bytes.data() + k * sizeof(T));
    bad |= v <= prev;  // with prev = -1 first, this also catches negatives
    prev = v;
    out[k] = static_cast<uint64_t>(v);
  }
  if (!bad) return {};
  for (size_t k = 0; k < n; ++k) {  // rare path: find the culprit
    const int64_t v = static_cast<int64_t>(out[k]);
    if (v < 0) return {DecodeError::kNegative, k, v};
    if (k > 0 && out[k] <= out[k - 1]) return {DecodeError::kNotAscending, k, v};
  }
  return {};
}

// idx[k] = idx[k-1] + g[k] + 1, i.e. cumsum(g + 1) - 1.
template <typename T>
DecodeError Gaps(ByteSpan bytes, std::vector<uint64_t>& out) {
  const size_t n = bytes.size() / sizeof(T);
  out.resize(n);
  if (n == 0) return {};
  const uint8_t* src = bytes.data();
  uint64_t idx = Load<T>(src);
  out[0] = idx;
  // Fewer than 2^32 gaps below 2^32 each cannot sum past 2^64: no checks.
  if (sizeof(T) < 8 && n <= (uint64_t{1} << 32)) {
    for (size_t k = 1; k < n; ++k) {
      idx += uint64_t{Load<T>(src + k * sizeof(T))} + 1;
      out[k] = idx;
    }
    return {};
  }
  for (size_t k = 1; k < n; ++k) {
    const uint64_t gap = Load<T>(src + k * sizeof(T));
    if (__builtin_add_overflow(idx, gap, &idx) || __builtin_add_overflow(idx, 1, &idx)) {
      return {DecodeError::kOverflow, k, 0};
    }
    out[k] = idx;
  }
  return {};
}

// Sums g + 1 over each chunk of a U16/U32 stream: below 2^32 elements of
// below 2^32 each nothing overflows 64 bits. A U16 chunk of up to 2^16
// elements sums in 32 bits (vectorises).
template <typename T, typename Acc>
void ChunkStartsNarrow(const uint8_t* src, size_t n, size_t chunk, std::vector<uint64_t>& starts, uint64_t* last) {
  uint64_t prev = ~uint64_t{0};  // idx[-1] = -1
  for (size_t b = 0; b < n; b += chunk) {
    const size_t e = std::min(n, b + chunk);
    starts.push_back(prev + Load<T>(src + b * sizeof(T)) + 1);
    Acc sum = 0;
    for (size_t k = b; k < e; ++k) sum += Load<T>(src + k * sizeof(T));
    prev += uint64_t{sum} + (e - b);
  }
  *last = prev;
}

template <typename T>
T LoadAt(const uint8_t* bytes, size_t k) {
  return Load<T>(bytes + k * sizeof(T));
}

template <typename T>
uint64_t Run(const uint8_t* bytes, size_t k, size_t n, uint64_t prev, uint64_t* out) {
  const uint8_t* src = bytes + k * sizeof(T);
  for (size_t j = 0; j < n; ++j) {
    prev += uint64_t{Load<T>(src + j * sizeof(T))} + 1;
    out[j] = prev;
  }
  return prev;
}

}  // namespace

DecodeError GapChunkStarts(DType dtype, ByteSpan bytes, size_t chunk, std::vector<uint64_t>& starts,
                           uint64_t* last) {
  starts.clear();
  const size_t n = bytes.size() / DTypeSize(dtype);
  *last = 0;
  if (n == 0) return {};
  if (dtype == DType::kU16 && chunk <= (size_t{1} << 16)) {
    ChunkStartsNarrow<uint16_t, uint32_t>(bytes.data(), n, chunk, starts, last);
    return {};
  }
  if (dtype != DType::kU64 && n <= (uint64_t{1} << 32)) {
    if (dtype == DType::kU16) ChunkStartsNarrow<uint16_t, uint64_t>(bytes.data(), n, chunk, starts, last);
    else ChunkStartsNarrow<uint32_t, uint64_t>(bytes.data(), n, chunk, starts, last);
    return {};
  }
  // Wide gaps: checked element by element, as Gaps does.
  uint64_t idx = GapAt(dtype, bytes.data(), 0);
  starts.push_back(idx);
  for (size_t k = 1; k < n; ++k) {
    if (__builtin_add_overflow(idx, GapAt(dtype, bytes.data(), k), &idx) || __builtin_add_overflow(idx, 1, &idx)) {
      starts.clear();
      return {DecodeError::kOverflow, k, 0};
    }
    if (k % chunk == 0) starts.push_back(idx);
  }
  *last = idx;
  return {};
}

uint64_t GapAt(DType dtype, const uint8_t* bytes, size_t k) {
  switch (dtype) {
    case DType::kU16: return LoadAt<uint16_t>(bytes, k);
    case DType::kU32: return LoadAt<uint32_t>(bytes, k);
    default: return LoadAt<uint64_t>(bytes, k);
  }
}

uint64_t DecodeGapRun(DType dtype, const uint8_t* bytes, size_t k, size_t n, uint64_t prev, uint64_t* out) {
  switch (dtype) {
    case DType::kU16: return Run<uint16_t>(bytes, k, n, prev, out);
    case DType::kU32: return Run<uint32_t>(bytes, k, n, prev, out);
    default: return Run<uint64_t>(bytes, k, n, prev, out);
  }
}

std::optional<DType> EncodeRaw(std::span<const uint64_t> idx, std::vector<uint8_t>& out) {
  if (idx.empty()) {
    out.clear();
    return DType::kI32;
  }
  // TRL writes int32; positions past 2^31-1 need int64. If the indices are
  // ascending the last is the largest, so the width chosen up front is right.
  const bool narrow = idx.back() <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max());
  const Summary s = narrow ? PackRaw<int32_t>(idx, out) : PackRaw<int64_t>(idx, out);
  if (!Ascending(s, idx)) return std::nullopt;
  return narrow ? DType::kI32 : DType::kI64;
}

std::optional<DType> EncodeGaps(std::span<const uint64_t> idx, std::vector<uint8_t>& out) {
  if (idx.empty()) {
    out.clear();
    return DType::kU16;
  }
  // Optimistically U16 (the common case at RL sparsity), then re-pack wider
  // if a gap did not fit: the narrowest width for this tensor alone.
  const Summary s = PackGaps<uint16_t>(idx, out);
  if (!Ascending(s, idx)) return std::nullopt;
  const DType dtype = GapDType(s.or_gap);
  if (dtype == DType::kU32) {
    PackGaps<uint32_t>(idx, out);
  } else if (dtype == DType::kU64) {
    PackGaps<uint64_t>(idx, out);
  }
  return dtype;
}

DType GapDType(uint64_t or_gap) {
  if (or_gap <= std::numeric_limits<uint16_t>::max()) return DType::kU16;
  return or_gap <= std::numeric_limits<uint32_t>::max() ? DType::kU32 : DType::kU64;
}

DecodeError DecodeRaw(DType dtype, ByteSpan bytes, std::vector<uint64_t>& out) {
  return dtype == DType::kI32 ? Raw<int32_t>(bytes, out) : Raw<int64_t>(bytes, out);
}

DecodeError DecodeGaps(DType dtype, ByteSpan bytes, std::vector<uint64_t>& out) {
  switch (dtype) {
    case DType::kU16: return Gaps<uint16_t>(bytes, out);
    case DType::kU32: return Gaps<uint32_t>(bytes, out);
    default: return Gaps<uint64_t>(bytes, out);
  }
}

}  // namespace deltasync::indexcodec
