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

#include "bf16/simd_kernels.h"
#include "codec/compact_bf16.h"
#include "codec/compact_rice.h"
#include "codec/compact_streams.h"
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

// Step 1. Raw-mode tensors are decoded completely; bf16 ones into `bf`
// (c's indices and values sized).
Status ReadTensor(const std::string& label, const TensorView& stream, const WeightState::Tensor& base,
                  TensorChanges& c, Bf16Tensor& bf) {
  auto bad = [&](const std::string& msg) { return Corrupt(label, stream.name, msg); };
  Reader in(stream.data);
  std::optional<uint8_t> version = in.Byte();
  std::optional<uint8_t> mode = in.Byte();
  if (!version || !mode) return bad("truncated stream header");
  if (*version != kStreamVersion) return bad("unknown stream version " + std::to_string(*version));
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
  std::array<uint64_t, kClasses + 1>& class_begin = bf.class_begin;
  for (int cl = 0; cl < kClasses; ++cl) {
    std::optional<uint64_t> m = in.Varint();
    if (!m || *m > *count - class_begin[cl]) return bad("class counts are malformed or exceed the count");
    class_begin[cl + 1] = class_begin[cl] + *m;
  }
  if (class_begin[kClasses] != *count) return bad("class counts do not sum to the count");
  // A Rice-coded gap takes at most 31 + 7 + 64 bits, each block 6 more.
  const uint64_t max_bytes = (*count * 102 + (*count / kRiceBlock + kClasses) * 6) / 8 + 1;
  std::vector<uint8_t> gap_bytes;
  if (auto err = compact::GetBlock(in, std::nullopt, max_bytes, gap_bytes)) return bad("gap block: " + *err);
  compact::BitReader bits(gap_bytes);
  bf.ranks.resize(*count);
  for (int cl = 0; cl < kClasses; ++cl) {
    uint64_t* r = bf.ranks.data() + class_begin[cl];
    const uint64_t m = class_begin[cl + 1] - class_begin[cl];
    if (auto err = compact::GetRiceGaps(bits, m, r)) return bad("class " + std::to_string(cl) + ": " + *err);
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
  if (!bits.AtPaddedEnd()) return bad("trailing bits in the gap block");
  std::vector<uint8_t> class_diffs;
  bf.diffs.reserve(*count);
  for (int cl = 0; cl < kClasses; ++cl) {
    const uint64_t m = class_begin[cl + 1] - class_begin[cl];
    if (m == 0) continue;
    if (auto err = compact::GetBlock(in, m, 0, class_diffs)) {
      return bad("diff block of class " + std::to_string(cl) + ": " + *err);
    }
    bf.diffs.insert(bf.diffs.end(), class_diffs.begin(), class_diffs.end());
  }
  for (uint64_t j = 0; j < *count; ++j) {
    if (bf.diffs[j] == kEscape) bf.escaped.push_back(j);
  }
  if (auto err = compact::GetBlock(in, 2 * bf.escaped.size(), 0, bf.escapes)) return bad("escape block: " + *err);
  if (in.remaining() != 0) return bad(std::to_string(in.remaining()) + " trailing bytes after the last block");
  c.indices.resize(*count);
  c.values.resize(2 * *count);
  return Status::OK();
}

// Step 2's walk of one chunk from `start`; `next` is where the next chunk
// of the tensor starts (nullptr for its last chunk).
Status WalkChunk(const std::string& label, const Bf16Tensor& t, const Chunk& chunk, const WalkStart& start,
                 const WalkStart* next) {
  auto bad = [&](const std::string& msg) { return Corrupt(label, t.stream->name, msg); };
  const uint8_t* b = t.base->data.data();
  std::array<uint64_t, kClasses> rem = start.rem, g = start.g, p = start.g, e = start.e;
  std::array<uint64_t, kClasses> end;
  for (int cl = 0; cl < kClasses; ++cl) end[cl] = t.class_begin[cl + 1];
  uint64_t* indices = t.out->indices.data();
  uint8_t* values = t.out->values.data();
  const uint8_t* diffs = t.diffs.data();
  const uint8_t* escapes = t.escapes.data();
  constexpr size_t kWalkBlock = 1024;
  uint64_t hit_words[kWalkBlock / 64];
  uint64_t k = start.out;
  const uint64_t k_end = next ? next->out : t.out->indices.size();
  for (uint64_t at = chunk.begin; at < chunk.end && k < k_end; at += kWalkBlock) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(kWalkBlock, chunk.end - at));
    kernels::ClassWalk16(reinterpret_cast<const uint16_t*>(b) + at, len, rem.data(), g.data(), t.ranks.data(),
                         end.data(), hit_words);
    for (size_t w = 0; w < (len + 63) / 64; ++w) {
      for (uint64_t hits = hit_words[w]; hits != 0; hits &= hits - 1) {
        const uint64_t i = at + 64 * w + static_cast<uint64_t>(__builtin_ctzll(hits));
        const uint16_t o = Load16(b + 2 * i);
        const int cl = ClassOf(o);
        const uint64_t jd = p[cl]++;
        const uint8_t d = diffs[jd];
        uint16_t v;
        if (d == kEscape) {
          v = Load16(escapes + 2 * e[cl]++);  // e[cl] < escaped.size(): diffs[jd] is one
        } else {
          v = static_cast<uint16_t>(o + compact::UnZigZag(d));
        }
        if (DiffByte(o, v) != d) {  // canonical: an escape exactly when needed
          return bad("element " + std::to_string(i) + ": non-canonical change code " + std::to_string(d));
        }
        indices[k] = i;
        std::memcpy(values + 2 * k, &v, 2);
        ++k;
      }
    }
  }
  for (int cl = 0; cl < kClasses; ++cl) {
    const uint64_t want = next ? next->g[cl] : end[cl];
    if (p[cl] != want) {
      if (next) {
        return Status::Internal(label + ": tensor '" + t.stream->name + "': the walk of elements " +
                                std::to_string(chunk.begin) + ".." + std::to_string(chunk.end) +
                                " disagrees with the class counts (decoder bug)");
      }
      return bad("gaps run past the elements of exponent class " + std::to_string(cl));
    }
  }
  return Status::OK();
}

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
  ParallelFor(streams.size(), stream_bytes >= kParallelMin ? threads : 1,
              [&](size_t i) { errors[i] = ReadTensor(label, *streams[i], *bases[i], out.changes[i], read[i]); });
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
  // Chunk k publishes (ready[k]) the class elements up to its end for
  // chunk k + 1 of the same tensor.
  std::unique_ptr<std::atomic<uint32_t>[]> ready(new std::atomic<uint32_t>[chunks.size()]);
  std::vector<std::array<uint64_t, kClasses>> upto(chunks.size());
  for (size_t k = 0; k < chunks.size(); ++k) ready[k].store(0, std::memory_order_relaxed);
  errors.assign(chunks.size(), Status::OK());
  ParallelFor(chunks.size(), walk_elements >= kParallelWalkMin ? threads : 1, [&](size_t k) {
    const Chunk& c = chunks[k];
    const Bf16Tensor& t = *walked[c.tensor];
    const uint16_t* data = reinterpret_cast<const uint16_t*>(t.base->data.data());
    std::array<uint64_t, kClasses> before{}, after{};
    if (!c.last) kernels::ClassCounts16(data + c.begin, static_cast<size_t>(c.end - c.begin), after.data());
    if (c.begin > 0) {
      // Chunk k - 1 was handed out before this one and publishes before
      // its walk, so this wait is short and cannot deadlock.
      while (ready[k - 1].load(std::memory_order_acquire) == 0) ready[k - 1].wait(0, std::memory_order_acquire);
      before = upto[k - 1];
    }
    if (!c.last) {
      for (int cl = 0; cl < kClasses; ++cl) after[cl] += before[cl];
      upto[k] = after;
      ready[k].store(1, std::memory_order_release);
      ready[k].notify_all();
    }
    const WalkStart start = StartAt(t, before);
    const WalkStart next = c.last ? WalkStart{} : StartAt(t, after);
    errors[k] = WalkChunk(label, t, c, start, c.last ? nullptr : &next);
  });
  for (const Status& s : errors) DS_RETURN_IF_ERROR(s);
  return out;
}

}  // namespace compact

Result<CompactDelta> DecodeCompactDelta(const SafetensorsFile& file, const WeightState& base,
                                        const StateHash& base_hash, int threads) {
  return compact::DecodeCompactDeltaChunked(file, base, base_hash, threads, compact::kDecodeChunkElements);
}

}  // namespace deltasync
