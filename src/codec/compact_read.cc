// The compact decoder's step 1 (compact_read.h; docs/format.md, "Compact
// objects"): every stream's read, version 2 or 3, whole (they are
// O(changes)), its header checked against its base tensor; a raw-mode
// stream decoded completely, a bf16 one's gaps turned into ranks (a
// change's position among the tensor's elements of its class) and its
// diffs and escapes decoded. Tensors are read in groups of about kReadGroup
// changes, the groups in parallel, a group's rANS pieces decoded together.
// Used by the decoder (compact_decode.cc, which then walks the base) and
// ParseCompactDelta (compact_parse.cc).
#include "codec/compact_read.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "bf16/hash_term.h"
#include "codec/compact_bf16.h"
#include "codec/compact_rans.h"
#include "codec/compact_rice.h"
#include "codec/compact_streams.h"
#include "common/pages.h"  // ReserveForReuse
#include "common/parallel.h"

namespace deltasync::compact {
namespace {

// Version 2's bf16 parse, after version, mode and count: class counts, the
// Rice-coded gap block, a diff block per non-empty class, the escape block.
std::optional<std::string> ParseBf16StreamV2(Reader& in, uint64_t count, compact::ParsedBf16& out) {
  auto& class_begin = out.class_begin;
  class_begin[0] = 0;
  for (int cl = 0; cl < kClasses; ++cl) {
    std::optional<uint64_t> m = in.Varint();
    if (!m || *m > count - class_begin[cl]) return "class counts are malformed or exceed the count";
    class_begin[cl + 1] = class_begin[cl] + *m;
  }
  if (class_begin[kClasses] != count) return "class counts do not sum to the count";
  thread_local std::vector<uint8_t> gap_bytes;  // reused (as compact_decode.cc, TakeParseBuffers)
  out.ranks.Resize(count, out.elements);
  // A Rice-coded gap takes at most 31 + 7 + 64 bits, each block 6 more.
  const uint64_t max_bytes = (count * 102 + (count / kRiceBlock + kClasses) * 6) / 8 + 1;
  if (auto err = compact::GetBlock(in, std::nullopt, max_bytes, gap_bytes)) return "gap block: " + *err;
  compact::BitReader bits(gap_bytes);
  out.past_class = -1;
  for (int cl = 0; cl < kClasses; ++cl) {
    compact::GapRanks ranks;
    ranks.elements = out.elements;
    if (auto err = out.ranks.Read(bits, class_begin[cl], class_begin[cl + 1] - class_begin[cl], ranks)) {
      return "class " + std::to_string(cl) + ": " + *err;
    }
    if (ranks.past && out.past_class < 0) out.past_class = cl;
  }
  if (!bits.AtPaddedEnd()) return "trailing bits in the gap block";
  UninitVector<uint8_t>& diffs = out.diffs;
  thread_local std::vector<uint8_t> class_diffs;
  diffs.clear();
  diffs.reserve(count);
  for (int cl = 0; cl < kClasses; ++cl) {
    const uint64_t m = class_begin[cl + 1] - class_begin[cl];
    if (m == 0) continue;
    if (auto err = compact::GetBlock(in, m, 0, class_diffs)) return "diff block of class " + std::to_string(cl) + ": " + *err;
    diffs.insert(diffs.end(), class_diffs.begin(), class_diffs.end());
  }
  const uint64_t n_escapes = static_cast<uint64_t>(std::count(diffs.begin(), diffs.end(), kEscape));
  if (auto err = compact::GetBlock(in, 2 * n_escapes, 0, out.escapes)) return "escape block: " + *err;
  return std::nullopt;
}

// Sizes an output vector to n elements, reusing its memory: within its
// capacity only resized (the decode overwrites every element; only those
// past its old size are zero-filled), else replaced by a fresh vector (its
// old contents not copied) with room for 1/8 more where it held memory
// before, so that slowly growing counts do not reallocate every call
// (ReserveForReuse, as DetectChanges's outputs; no huge pages: they gained
// nothing here). A fresh vector gets exactly n.
template <typename T>
void SizeOutput(std::vector<T>& v, size_t n) {
  ReserveForReuse(v, n, /*huge=*/false);
  v.resize(n);
}

// The end of a bf16 tensor's read, after its parse (`in` past it): the
// checks and outputs that need its diffs decoded.
Status FinishBf16(const std::string& label, const TensorView& stream, Reader& in, bool fused, TensorChanges& c,
                  Bf16Tensor& bf) {
  auto bad = [&](const std::string& msg) { return CorruptTensor(label, stream.name, msg); };
  const uint64_t count = bf.class_begin[kClasses];
  // The parse turned the gaps into ranks as it read them (GapRanks): all
  // below n (the class has at most n elements), checked without overflow.
  if (bf.past_class >= 0) {
    return bad("gaps run past the elements of exponent class " + std::to_string(bf.past_class));
  }
  // The escapes' positions: rare, so found by memchr (vectorised) rather
  // than a test of every diff byte.
  const uint8_t* const diffs = bf.diffs.data();
  for (const uint8_t* p = diffs; p < diffs + count; ++p) {
    p = static_cast<const uint8_t*>(std::memchr(p, kEscape, static_cast<size_t>(diffs + count - p)));
    if (p == nullptr) break;
    bf.escaped.push_back(static_cast<uint64_t>(p - diffs));
  }
  if (bf.escapes.size() != 2 * bf.escaped.size()) return bad("escape block does not match the escaped changes");
  if (in.remaining() != 0) return bad(std::to_string(in.remaining()) + " trailing bytes after the last block");
  bf.count = count;
  if (!fused) {
    SizeOutput(c.indices, static_cast<size_t>(count));
    SizeOutput(c.values, static_cast<size_t>(2 * count));
  }
  return Status::OK();
}

// Step 1. Raw-mode tensors are decoded completely; bf16 ones into `bf`
// (c's indices and values sized, reusing c's memory: SizeOutput). With
// `pieces`, a version-3 stream's rANS pieces are appended there instead of
// decoded (pointing at bf's class_begin and diffs) and bf.deferred set: the
// caller decodes them (DecodeRansPieces, with other tensors' pieces), then
// FinishDeferred ends the read.
Status ReadTensor(const std::string& label, const TensorView& stream, const TensorView& base,
                  const compact::V3Tables* tables, bool fused, TensorChanges& c, Bf16Tensor& bf,
                  std::vector<compact::RansPiece>* pieces = nullptr) {
  auto bad = [&](const std::string& msg) { return CorruptTensor(label, stream.name, msg); };
  // Not deferred until this read defers (a caller's reused bf may hold an
  // earlier read's flag: ReadTensors would then finish a raw-mode or
  // version-2 stream as a deferred version-3 one).
  bf.deferred = false;
  Reader in(stream.data);
  std::optional<uint8_t> version = in.Byte();
  std::optional<uint8_t> mode = in.Byte();
  if (!version || !mode) return bad("truncated stream header");
  if (*version != kStreamVersion && *version != compact::kStreamVersion3) {
    return bad("unknown stream version " + std::to_string(*version));
  }
  const bool bf16 = base.dtype == DType::kBF16;
  if (*mode != (bf16 ? kModeBf16 : kModeRaw)) {
    return bad("mode " + std::to_string(*mode) + " does not fit base dtype " + std::string(DTypeName(base.dtype)));
  }
  const uint64_t n = base.num_elements();
  std::optional<uint64_t> count = in.Varint();
  if (!count) return bad("truncated or malformed count");
  if (*count > n) return bad("count " + std::to_string(*count) + " exceeds the base's " + std::to_string(n) + " elements");
  c.name = base.name;
  c.dtype = base.dtype;
  const size_t esize = DTypeSize(base.dtype);

  if (!bf16) {
    // A gap varint takes at most 10 bytes.
    thread_local std::vector<uint8_t> gap_bytes;  // reused (as compact_decode.cc, TakeParseBuffers)
    if (auto err = compact::GetBlock(in, std::nullopt, *count * 10, gap_bytes)) return bad("gap block: " + *err);
    Reader g(gap_bytes);
    SizeOutput(c.indices, static_cast<size_t>(*count));
    uint64_t next = 0;
    for (uint64_t k = 0; k < *count; ++k) {
      std::optional<uint64_t> gap = g.Varint();
      if (!gap) return bad("gap " + std::to_string(k) + " is truncated or malformed");
      if (next >= n || *gap >= n - next) {  // next + gap >= n, without overflow
        return bad("index at position " + std::to_string(k) + " is out of range (" + std::to_string(n) + " elements)");
      }
      c.indices[k] = next + *gap;
      next = c.indices[k] + 1;
    }
    if (g.remaining() != 0) return bad(std::to_string(g.remaining()) + " trailing bytes in the gap block");
    if (auto err = compact::GetBlock(in, *count * esize, 0, c.values)) return bad("value block: " + *err);
    if (in.remaining() != 0) return bad(std::to_string(in.remaining()) + " trailing bytes after the last block");
    return Status::OK();
  }

  bf.stream = &stream;
  bf.base = &base;
  bf.out = &c;
  bf.seeds = state_hash::SeedsFor(base.name, base.dtype, base.shape);
  // Parsed into bf's own (reused) buffers: resizing them to about the last
  // version's sizes writes little and faults in no fresh pages.
  compact::ParsedBf16 parsed;
  parsed.elements = n;
  parsed.ranks.swap(bf.ranks);
  parsed.diffs.swap(bf.diffs);
  parsed.escapes.swap(bf.escapes);
  const bool defer = pieces != nullptr && *version == compact::kStreamVersion3;
  const size_t first_piece = pieces ? pieces->size() : 0;
  std::optional<std::string> err = *version == kStreamVersion ? ParseBf16StreamV2(in, *count, parsed)
                                   : defer ? compact::ParseBf16StreamV3Gaps(in, *count, tables, parsed, *pieces)
                                           : compact::ParseBf16StreamV3(in, *count, tables, parsed);
  bf.ranks.swap(parsed.ranks);
  bf.diffs.swap(parsed.diffs);
  bf.escapes.swap(parsed.escapes);
  if (err) return bad(*err);
  bf.class_begin = parsed.class_begin;
  bf.past_class = parsed.past_class;
  if (defer) {
    for (size_t j = first_piece; j < pieces->size(); ++j) {
      (*pieces)[j].begin = &bf.class_begin;
      (*pieces)[j].d = bf.diffs.data();
    }
    bf.tail = in.position();
    bf.deferred = true;
    return Status::OK();
  }
  return FinishBf16(label, stream, in, fused, c, bf);
}

// The rest of a deferred read (ReadTensor with pieces), its pieces decoded.
Status FinishDeferred(const std::string& label, const TensorView& stream, bool fused, TensorChanges& c,
                      Bf16Tensor& bf, std::span<const compact::RansPiece> pieces) {
  Reader in(stream.data);
  (void)in.Take(bf.tail);
  if (auto err = compact::ParseBf16StreamV3Rest(in, pieces, bf.diffs, bf.escapes)) {
    return CorruptTensor(label, stream.name, *err);
  }
  return FinishBf16(label, stream, in, fused, c, bf);
}

}  // namespace

// Tensors go in groups of about this many changes (8 rANS pieces).
constexpr uint64_t kReadGroup = 8 * compact::kV3Piece;

void ReadTensors(const std::string& label, const std::vector<const TensorView*>& streams,
                 const std::vector<const TensorView*>& bases, std::span<const uint64_t> counts,
                 const compact::V3Tables* tables, bool fused, int threads, std::span<TensorChanges> changes,
                 std::span<Bf16Tensor> read, std::vector<Status>& errors) {
  std::vector<size_t> group_start;
  uint64_t in_group = kReadGroup;
  for (size_t i = 0; i < streams.size(); ++i) {
    if (in_group >= kReadGroup) {
      group_start.push_back(i);
      in_group = 0;
    }
    in_group += counts[i];
  }
  group_start.push_back(streams.size());
  ParallelFor(group_start.size() - 1, threads, [&](size_t g) {
    thread_local std::vector<compact::RansPiece> pieces;
    thread_local std::vector<size_t> first;
    pieces.clear();
    first.clear();
    const size_t from = group_start[g], to = group_start[g + 1];
    for (size_t i = from; i < to; ++i) {
      first.push_back(pieces.size());
      errors[i] = ReadTensor(label, *streams[i], *bases[i], tables, fused, changes[i], read[i], &pieces);
    }
    first.push_back(pieces.size());
    if (!pieces.empty()) compact::DecodeRansPieces(pieces, *tables);
    for (size_t i = from; i < to; ++i) {
      if (!errors[i].ok() || !read[i].deferred) continue;
      const size_t a = first[i - from], b = first[i - from + 1];
      errors[i] = FinishDeferred(label, *streams[i], fused, changes[i], read[i],
                                 std::span<const compact::RansPiece>(pieces.data() + a, b - a));
    }
  });
}

std::optional<uint64_t> PlausibleBf16Count(const TensorView& stream, const TensorView& base) {
  Reader in(stream.data);
  std::optional<uint8_t> version = in.Byte();
  std::optional<uint8_t> mode = in.Byte();
  std::optional<uint64_t> count = in.Varint();
  if (!version || !mode || !count || base.dtype != DType::kBF16 || *mode != kModeBf16) return std::nullopt;
  if (*version != kStreamVersion && *version != kStreamVersion3) return std::nullopt;
  if (*count > base.num_elements() || *count > 8 * uint64_t{stream.data.size()}) return std::nullopt;
  return count;
}

void ReadCompactStreams(const std::string& label, const std::vector<const TensorView*>& streams,
                        const std::vector<const TensorView*>& bases, const V3Tables* tables, int threads,
                        std::span<TensorChanges> c, std::span<Bf16Tensor> bf, std::vector<Status>& errors) {
  errors.assign(streams.size(), Status::OK());
  std::vector<uint64_t> counts(streams.size());
  for (size_t i = 0; i < streams.size(); ++i) counts[i] = PlausibleBf16Count(*streams[i], *bases[i]).value_or(0);
  ReadTensors(label, streams, bases, counts, tables, /*fused=*/true, threads, c, bf, errors);
}

}  // namespace compact
