// The compact delta decoder (docs/format.md, "Compact objects"; the encoder
// is compact_delta.cc). A tensor's streams are small (O(changes)) and are
// read whole; its positions are rebuilt from the base in chunks, all
// tensors' chunks in parallel, so one large tensor (the embedding) uses
// every thread:
//  1. per tensor (tensors in parallel): the header, class counts, Rice
//     gaps (turned into ranks: a change's position among the tensor's
//     elements of its class), the diff and escape blocks;
//  2. per chunk (chunks in parallel, handed out in order): the class
//     histogram of the chunk's base elements, added to the running sums
//     the previous chunk of the tensor publishes (a decoupled look-back:
//     a chunk waits only for its predecessor's histogram, never its walk),
//     then the walk of the chunk, starting in each class at the first
//     change whose rank is at least the class elements before the chunk:
//     ClassWalk16 finds the changed elements (from the chunk's base, still
//     in cache after the histogram); their new values follow from the diff
//     bytes.
// Every step is exact, so the result is the same for any thread count and
// chunk size (tests/codec/compact_decode_test.cc).
#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>

#include "bf16/hash_term.h"
#include "bf16/simd_kernels.h"
#include "codec/compact_bf16.h"
#include "codec/compact_rice.h"
#include "codec/compact_streams.h"
#include "codec/compact_v3.h"
#include "codec/patch_metadata.h"
#include "common/parallel.h"
#include "deltasync/compact.h"

namespace deltasync {
namespace {

namespace pm = patchmeta;
using compact::ClassOf;
using compact::DiffByte;
using compact::kClasses;
using compact::kEscape;
using compact::kModeBf16;
using compact::kModeRaw;
using compact::kRiceBlock;
using compact::kStreamVersion;
using compact::Reader;

constexpr std::string_view kSuffix = ".cmp";
// Below this many stream bytes (or base elements to walk) in total, work
// stays on one thread.
constexpr uint64_t kParallelMin = uint64_t{1} << 16;
constexpr uint64_t kParallelWalkMin = uint64_t{1} << 20;
constexpr uint64_t kNone = ~uint64_t{0};

uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

Status Corrupt(const std::string& label, std::string_view tensor, const std::string& msg) {
  return Status::Corruption(label + ": tensor '" + std::string(tensor) + "': " + msg);
}

// One bf16 tensor's streams, read (step 1), class by class.
struct Bf16Tensor {
  const TensorView* stream = nullptr;
  const WeightState::Tensor* base = nullptr;
  TensorChanges* out = nullptr;
  std::array<uint64_t, kClasses + 1> class_begin{};  // class cl: changes [begin[cl], begin[cl+1])
  std::vector<uint64_t> ranks;    // per change, ascending within its class
  std::vector<uint8_t> diffs;
  std::vector<uint64_t> escaped;  // the changes (class order) that are escapes
  std::vector<uint8_t> escapes;   // their raw values, u16 little-endian each
  state_hash::TensorSeeds seeds{};
};

// Where the walk of a chunk starts, per class: rem class elements to skip
// before change g, whose escape (if it is one) is escapes[e].
struct WalkStart {
  std::array<uint64_t, kClasses> rem{}, g{}, e{};
  uint64_t out = 0;  // the chunk's first change in element order
};

struct Chunk {
  size_t tensor = 0;
  uint64_t begin = 0, end = 0;  // elements
  bool last = false;            // the tensor's last chunk
};

// The walk start of a chunk preceded by before[c] class-c elements.
WalkStart StartAt(const Bf16Tensor& t, const std::array<uint64_t, kClasses>& before) {
  WalkStart s;
  for (int cl = 0; cl < kClasses; ++cl) {
    const uint64_t* b = t.ranks.data() + t.class_begin[cl];
    const uint64_t* e = t.ranks.data() + t.class_begin[cl + 1];
    const uint64_t* j = std::lower_bound(b, e, before[cl]);
    s.g[cl] = static_cast<uint64_t>(j - t.ranks.data());
    s.rem[cl] = j < e ? *j - before[cl] : kNone;
    s.e[cl] = static_cast<uint64_t>(std::lower_bound(t.escaped.begin(), t.escaped.end(), s.g[cl]) - t.escaped.begin());
    s.out += static_cast<uint64_t>(j - b);
  }
  return s;
}

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
  std::vector<uint8_t> gap_bytes;
  out.gaps.resize(count);
  // A Rice-coded gap takes at most 31 + 7 + 64 bits, each block 6 more.
  const uint64_t max_bytes = (count * 102 + (count / kRiceBlock + kClasses) * 6) / 8 + 1;
  if (auto err = compact::GetBlock(in, std::nullopt, max_bytes, gap_bytes)) return "gap block: " + *err;
  compact::BitReader bits(gap_bytes);
  for (int cl = 0; cl < kClasses; ++cl) {
    if (auto err = compact::GetRiceGaps(bits, class_begin[cl + 1] - class_begin[cl], out.gaps.data() + class_begin[cl])) {
      return "class " + std::to_string(cl) + ": " + *err;
    }
  }
  if (!bits.AtPaddedEnd()) return "trailing bits in the gap block";
  std::vector<uint8_t>& diffs = out.diffs;
  std::vector<uint8_t> class_diffs;
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

// Step 1. Raw-mode tensors are decoded completely; bf16 ones into `bf`
// (c's indices and values sized).
Status ReadTensor(const std::string& label, const TensorView& stream, const WeightState::Tensor& base,
                  const compact::V3Tables* tables, TensorChanges& c, Bf16Tensor& bf) {
  auto bad = [&](const std::string& msg) { return Corrupt(label, stream.name, msg); };
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
    std::vector<uint8_t> gap_bytes;
    if (auto err = compact::GetBlock(in, std::nullopt, *count * 10, gap_bytes)) return bad("gap block: " + *err);
    Reader g(gap_bytes);
    c.indices.resize(*count);
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
  compact::ParsedBf16 parsed;
  std::optional<std::string> err = *version == kStreamVersion ? ParseBf16StreamV2(in, *count, parsed)
                                                              : compact::ParseBf16StreamV3(in, *count, tables, parsed);
  if (err) return bad(*err);
  bf.class_begin = parsed.class_begin;
  bf.ranks = std::move(parsed.gaps);
  bf.diffs = std::move(parsed.diffs);
  bf.escapes = std::move(parsed.escapes);
  for (int cl = 0; cl < kClasses; ++cl) {
    uint64_t* r = bf.ranks.data() + bf.class_begin[cl];
    const uint64_t m = bf.class_begin[cl + 1] - bf.class_begin[cl];
    // Ranks: r_0 = gap_0, r_j = r_{j-1} + 1 + gap_j, all below n (the
    // class has at most n elements), without overflow.
    for (uint64_t k = 0; k < m; ++k) {
      const uint64_t gap = r[k];
      const uint64_t rank = k == 0 ? 0 : r[k - 1] + 1;
      if (gap >= n || rank >= n - gap) {
        return bad("gaps run past the elements of exponent class " + std::to_string(cl));
      }
      r[k] = rank + gap;
    }
  }
  for (uint64_t j = 0; j < *count; ++j) {
    if (bf.diffs[j] == kEscape) bf.escaped.push_back(j);
  }
  if (bf.escapes.size() != 2 * bf.escaped.size()) return bad("escape block does not match the escaped changes");
  if (in.remaining() != 0) return bad(std::to_string(in.remaining()) + " trailing bytes after the last block");
  c.indices.resize(*count);
  c.values.resize(2 * *count);
  return Status::OK();
}

// Step 2 for one chunk: the class masks of its blocks, published running
// class counts, then the walk from the start those counts give.
// ready[k] / upto[k]: chunk k's published counts (up to its end).
class ChunkWalker {
 public:
  ChunkWalker(const std::string& label, const std::vector<Bf16Tensor*>& tensors, const std::vector<Chunk>& chunks)
      : label_(label), tensors_(tensors), chunks_(chunks), ready_(new std::atomic<uint32_t>[chunks.size()]),
        upto_(chunks.size()), hash_(chunks.size(), {0, 0}) {
    for (size_t k = 0; k < chunks.size(); ++k) ready_[k].store(0, std::memory_order_relaxed);
  }

  // The hash change of all chunks' changes (after every Walk).
  StateHash HashDelta() const {
    StateHash sum;
    for (const std::array<uint64_t, 2>& h : hash_) sum += StateHash{h[0], h[1]};
    return sum;
  }

  Status Walk(size_t k) {
    const Chunk& c = chunks_[k];
    const Bf16Tensor& t = *tensors_[c.tensor];
    uint32_t classes = 0;  // the classes with changes
    for (int cl = 0; cl < kClasses; ++cl) classes |= uint32_t{t.class_begin[cl + 1] > t.class_begin[cl]} << cl;
    const size_t active = static_cast<size_t>(__builtin_popcount(classes));
    const size_t blocks = static_cast<size_t>((c.end - c.begin + kBlock - 1) / kBlock);
    // Per thread, reused: fresh memory would cost page faults every chunk.
    thread_local std::vector<uint64_t> masks;
    thread_local std::vector<uint32_t> before;
    masks.resize(std::max(masks.size(), blocks * active * kWords));
    before.resize(std::max(before.size(), blocks * active * (kWords + 1)));
    const uint16_t* data = reinterpret_cast<const uint16_t*>(t.base->data.data());
    std::array<uint64_t, kClasses> counts{};
    for (size_t b = 0; b < blocks; ++b) {
      const uint64_t at = c.begin + b * kBlock;
      uint64_t* m = masks.data() + b * active * kWords;
      uint32_t* p = before.data() + b * active * (kWords + 1);
      kernels::ClassMasks16(data + at, static_cast<size_t>(std::min<uint64_t>(kBlock, c.end - at)), classes, m, p);
      for (int cl = 0, s = 0; cl < kClasses; ++cl) {
        if (classes >> cl & 1) counts[cl] += p[(kWords + 1) * s++ + kWords];
      }
    }
    std::array<uint64_t, kClasses> start_at{};
    if (c.begin > 0) {
      // Chunk k - 1 was handed out before this one and publishes before
      // its walk, so this wait is short and cannot deadlock.
      while (ready_[k - 1].load(std::memory_order_acquire) == 0) ready_[k - 1].wait(0, std::memory_order_acquire);
      start_at = upto_[k - 1];
    }
    std::array<uint64_t, kClasses> end_at = start_at;
    for (int cl = 0; cl < kClasses; ++cl) end_at[cl] += counts[cl];
    if (!c.last) {
      upto_[k] = end_at;
      ready_[k].store(1, std::memory_order_release);
      ready_[k].notify_all();
    }
    const WalkStart start = StartAt(t, start_at);
    const WalkStart next = c.last ? WalkStart{} : StartAt(t, end_at);
    return Place(t, c, blocks, active, classes, masks.data(), before.data(), start, c.last ? nullptr : &next,
                 hash_[k].data());
  }

 private:
  static constexpr uint64_t kBlock = 1024;  // ClassMasks16's block
  static constexpr size_t kWords = kBlock / 64;

  // The walk of a chunk from `start` over its blocks' class masks, then
  // the values; `next` is where the next chunk of the tensor starts
  // (nullptr for its last chunk).
  Status Place(const Bf16Tensor& t, const Chunk& chunk, size_t blocks, size_t active, uint32_t classes,
               const uint64_t* masks, const uint32_t* before, const WalkStart& start, const WalkStart* next,
               uint64_t hash[2]) {
    const uint16_t* data = reinterpret_cast<const uint16_t*>(t.base->data.data());
    kernels::ClassWalkCursor cur;
    std::array<uint64_t, kClasses> end;
    for (int cl = 0; cl < kClasses; ++cl) {
      cur.rem[cl] = start.rem[cl];
      cur.g[cl] = start.g[cl];
      cur.e[cl] = start.e[cl];
      end[cl] = t.class_begin[cl + 1];
    }
    const kernels::ClassWalkStreams streams{t.ranks.data(), end.data(), t.diffs.data(), t.escapes.data()};
    uint64_t* indices = t.out->indices.data();
    uint8_t* values = t.out->values.data();
    uint64_t hit_words[kWords];
    uint16_t block_values[kBlock];
    uint64_t h_index[kBlock], h_new[kBlock], h_old[kBlock];
    uint64_t k = start.out;
    const uint64_t k_end = next ? next->out : t.out->indices.size();
    for (size_t blk = 0; blk < blocks && k < k_end; ++blk) {
      const uint64_t at = chunk.begin + blk * kBlock;
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kBlock, chunk.end - at));
      const size_t wrong = kernels::ClassSelect16(masks + blk * active * kWords, before + blk * active * (kWords + 1),
                                                  classes, data + at, len, streams, cur, hit_words, block_values);
      if (wrong < len) {
        return Corrupt(label_, t.stream->name, "element " + std::to_string(at + wrong) + ": non-canonical change code");
      }
      size_t h = 0;
      for (size_t w = 0; w < kWords; ++w) {
        for (uint64_t hits = hit_words[w]; hits != 0; hits &= hits - 1) {
          const size_t i = 64 * w + static_cast<size_t>(__builtin_ctzll(hits));
          indices[k] = at + i;
          std::memcpy(values + 2 * k, &block_values[i], 2);
          ++k;
          h_index[h] = at + i;
          h_new[h] = block_values[i];
          h_old[h] = data[at + i];
          ++h;
        }
      }
      kernels::HashTermDiffs(h_index, h_new, h_old, h, t.seeds.element_seed, hash);
    }
    for (int cl = 0; cl < kClasses; ++cl) {
      const uint64_t want = next ? next->g[cl] : end[cl];
      if (cur.g[cl] != want) {
        if (next) {
          return Status::Internal(label_ + ": tensor '" + t.stream->name + "': the walk of elements " +
                                  std::to_string(chunk.begin) + ".." + std::to_string(chunk.end) +
                                  " disagrees with the class counts (decoder bug)");
        }
        return Corrupt(label_, t.stream->name, "gaps run past the elements of exponent class " + std::to_string(cl));
      }
    }
    return Status::OK();
  }

  const std::string& label_;
  const std::vector<Bf16Tensor*>& tensors_;
  const std::vector<Chunk>& chunks_;
  std::unique_ptr<std::atomic<uint32_t>[]> ready_;
  std::vector<std::array<uint64_t, kClasses>> upto_;
  std::vector<std::array<uint64_t, 2>> hash_;  // per chunk, the sum of its element-term changes
};

std::string Show(std::string_view v) {
  std::string out;
  for (char ch : v.substr(0, 40)) out += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  return "'" + out + (v.size() > 40 ? "...'" : "'");
}

}  // namespace

namespace compact {

Result<CompactDelta> DecodeCompactDeltaChunked(const SafetensorsFile& file, const WeightState& base,
                                               const StateHash& base_hash, int threads, uint64_t chunk_elements) {
  if (chunk_elements == 0) return Status::InvalidArgument("chunk_elements must be at least 1");
  const std::string& label = file.label();
  auto bad = [&](const std::string& msg) { return Status::Corruption(label + ": " + msg); };
  const Metadata& m = file.metadata();
  auto get = [&](std::string_view key) -> const std::string* {
    auto it = m.find(std::string(key));
    return it == m.end() ? nullptr : &it->second;
  };
  auto expect = [&](std::string_view key, std::string_view want) -> Status {
    const std::string* v = get(key);
    if (!v) return bad("__metadata__ lacks '" + std::string(key) + "'");
    if (*v != want) return bad("__metadata__ '" + std::string(key) + "' is " + Show(*v) + ", expected '" + std::string(want) + "'");
    return Status::OK();
  };
  auto integer = [&](std::string_view key) -> Result<uint64_t> {
    const std::string* v = get(key);
    if (!v) return bad("__metadata__ lacks '" + std::string(key) + "'");
    std::optional<uint64_t> x = pm::ParseDecimal(*v);
    if (!x) return bad("__metadata__ '" + std::string(key) + "' is " + Show(*v) + ", not a non-negative integer");
    return *x;
  };
  DS_RETURN_IF_ERROR(expect(pm::kFormat, pm::kFormatValue));
  DS_RETURN_IF_ERROR(expect(pm::kVersion, pm::kVersionValue));
  DS_RETURN_IF_ERROR(expect(pm::kEncoding, kCompactEncodingName));
  DS_RETURN_IF_ERROR(expect(pm::kSparse, pm::kTrue));
  CompactDelta out;
  out.info.kind = PatchKind::kDelta;
  DS_ASSIGN_OR_RETURN(out.info.model_version, integer(pm::kModelVersion));
  DS_ASSIGN_OR_RETURN(uint64_t base_version, integer(pm::kBaseVersion));
  if (base_version >= out.info.model_version) {
    return bad("base version " + std::to_string(base_version) + " is not older than model_version " +
               std::to_string(out.info.model_version));
  }
  out.info.base_version = base_version;
  const std::string* hash_hex = get(kBaseStateHashKey);
  if (!hash_hex) return bad("__metadata__ lacks '" + std::string(kBaseStateHashKey) + "'");
  Result<StateHash> hash = StateHash::FromHex(*hash_hex);
  if (!hash.ok()) return bad("__metadata__ '" + std::string(kBaseStateHashKey) + "' is " + Show(*hash_hex) + ", not 32 hex digits");
  out.base_hash = *hash;
  if (!(out.base_hash == base_hash)) {
    return Status::FailedPrecondition(label + ": compact delta to version " + std::to_string(out.info.model_version) +
                                      " applies to base version " + std::to_string(base_version) + " with state hash " +
                                      out.base_hash.Hex() + ", but the given base has state hash " + base_hash.Hex());
  }
  DS_ASSIGN_OR_RETURN(out.info.total_elements, integer(pm::kTotalElements));
  DS_ASSIGN_OR_RETURN(out.info.total_changed_elements, integer(pm::kTotalChangedElements));
  DS_ASSIGN_OR_RETURN(out.info.num_changed_params, integer(pm::kNumChangedParams));
  if (out.info.total_elements != base.total_elements()) {
    return bad("total_elements " + std::to_string(out.info.total_elements) + " differs from the base's " +
               std::to_string(base.total_elements()));
  }

  // Tensors, in name order; each `{param}.cmp` of a base tensor, U8, 1-D.
  std::vector<const TensorView*> streams;
  for (const TensorView& t : file.tensors()) streams.push_back(&t);
  std::sort(streams.begin(), streams.end(), [](auto* a, auto* b) { return a->name < b->name; });
  if (streams.size() != out.info.num_changed_params) {
    return bad("num_changed_params " + std::to_string(out.info.num_changed_params) + " but " +
               std::to_string(streams.size()) + " tensors");
  }
  std::vector<const WeightState::Tensor*> bases;
  uint64_t stream_bytes = 0;
  for (const TensorView* s : streams) {
    const std::string& name = s->name;
    if (name.size() <= kSuffix.size() || name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) {
      return Corrupt(label, name, "name does not end in '.cmp'");
    }
    if (s->dtype != DType::kU8 || s->shape.size() != 1) return Corrupt(label, name, "not a 1-D U8 tensor");
    const WeightState::Tensor* t = base.Find(std::string_view(name).substr(0, name.size() - kSuffix.size()));
    if (!t) return Corrupt(label, name, "names a tensor the base does not have");
    bases.push_back(t);
    stream_bytes += s->data.size();
  }

  // Step 1.
  out.changes.resize(streams.size());
  std::vector<Bf16Tensor> read(streams.size());
  std::vector<Status> errors(streams.size());
  std::optional<compact::V3Tables> tables;
  DS_RETURN_IF_ERROR(compact::ParseDeltaTables(file, tables));
  const compact::V3Tables* t = tables ? &*tables : nullptr;
  ParallelFor(streams.size(), stream_bytes >= kParallelMin ? threads : 1,
              [&](size_t i) { errors[i] = ReadTensor(label, *streams[i], *bases[i], t, out.changes[i], read[i]); });
  for (const Status& s : errors) DS_RETURN_IF_ERROR(s);
  uint64_t changed = 0;
  for (const TensorChanges& c : out.changes) changed += c.indices.size();
  if (changed != out.info.total_changed_elements) {
    return bad("total_changed_elements " + std::to_string(out.info.total_changed_elements) + " but the tensors hold " +
               std::to_string(changed));
  }

  // Step 2 over the chunks of the bf16 tensors with changes.
  std::vector<Bf16Tensor*> walked;
  std::vector<Chunk> chunks;
  uint64_t walk_elements = 0;
  for (Bf16Tensor& t : read) {
    if (t.base == nullptr || t.out->indices.empty()) continue;
    const uint64_t n = t.base->num_elements();
    for (uint64_t begin = 0; begin < n; begin += chunk_elements) {
      const uint64_t end = std::min(n, begin + chunk_elements);
      chunks.push_back({walked.size(), begin, end, end == n});
    }
    walked.push_back(&t);
    walk_elements += n;
  }
  ChunkWalker walker(label, walked, chunks);
  errors.assign(chunks.size(), Status::OK());
  ParallelFor(chunks.size(), walk_elements >= kParallelWalkMin ? threads : 1,
              [&](size_t k) { errors[k] = walker.Walk(k); });
  for (const Status& s : errors) DS_RETURN_IF_ERROR(s);
  // Raw-mode tensors (few, small) hash their changes the usual way.
  std::vector<TensorChanges> raw;
  for (size_t i = 0; i < read.size(); ++i) {
    if (read[i].base == nullptr && !out.changes[i].indices.empty()) raw.push_back(out.changes[i]);
  }
  out.hash_delta = walker.HashDelta() + HashChanges(base, raw, threads);
  for (const Status& s : errors) DS_RETURN_IF_ERROR(s);
  return out;
}

}  // namespace compact

Result<CompactDelta> DecodeCompactDelta(const SafetensorsFile& file, const WeightState& base,
                                        const StateHash& base_hash, int threads) {
  return compact::DecodeCompactDeltaChunked(file, base, base_hash, threads, compact::kDecodeChunkElements);
}

}  // namespace deltasync
