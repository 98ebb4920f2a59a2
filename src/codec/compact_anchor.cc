// Compressed anchors (docs/format.md, "Compact objects"): per parameter
// one U8 tensor `{name}.zan` = header (dtype, shape, chunk size), then per
// chunk of up to kChunk elements either (bf16) an exponent-plane block and
// the raw sign+mantissa plane, or (other dtypes) one block of raw bytes.
// Decoding first walks every stream's chunk table (cheap), then decodes all
// chunks of all tensors in parallel.
#include <algorithm>
#include <array>
#include <cstring>

#include "bf16/simd_kernels.h"
#include "codec/compact_streams.h"
#include "codec/patch_metadata.h"
#include "common/pages.h"
#include "common/parallel.h"
#include "deltasync/compact.h"
#include "deltasync/safetensors.h"
#include "deltasync/uninit_vector.h"

namespace deltasync {
namespace {

namespace pm = patchmeta;
using compact::BlockRef;
using compact::PutBlock;
using compact::PutVarint;
using compact::Reader;

constexpr std::string_view kSuffix = ".zan";
constexpr std::string_view kAnchorFormat = "deltasync_compressed_anchor";
constexpr uint8_t kStreamVersion = 1;
constexpr uint64_t kChunk = uint64_t{1} << 20;
constexpr uint64_t kMaxChunk = uint64_t{1} << 24;
constexpr int kExponentLevel = compact::kLiteralsOnly;  // zstd's Huffman, no matches
constexpr int kRawLevel = 3;

struct Task {
  size_t tensor;
  size_t chunk;
};

// One chunk's bytes into `out` (empty): a bf16 chunk's exponent plane as a
// block, then its sign+mantissa plane raw (split by
// kernels::SplitBf16Planes into per-thread buffers, reused chunk after
// chunk: fresh ones would fault their pages in every chunk); other dtypes'
// bytes as one block. Reserved whole ahead (a block takes at most its
// bytes + 21), so it never grows by a copy.
void EncodeChunk(const TensorView& t, uint64_t begin, uint64_t end, std::vector<uint8_t>& out) {
  const size_t es = DTypeSize(t.dtype);
  const size_t n = static_cast<size_t>(end - begin);
  if (t.dtype != DType::kBF16) {
    out.reserve(n * es + 32);
    PutBlock(out, t.data.subspan(begin * es, n * es), kRawLevel);
    return;
  }
  thread_local UninitVector<uint8_t> exps, sms;
  if (exps.size() < n) {
    exps.resize(n);
    sms.resize(n);
  }
  kernels::SplitBf16Planes(t.data.data() + 2 * begin, exps.data(), sms.data(), n);
  out.reserve(2 * n + 32);
  PutBlock(out, ByteSpan(exps.data(), n), kExponentLevel);
  out.insert(out.end(), sms.begin(), sms.begin() + static_cast<std::ptrdiff_t>(n));
}

}  // namespace

std::vector<TensorView> DecodedAnchor::views() const {
  std::vector<TensorView> out;
  for (const WeightState::Tensor& t : tensors) out.push_back(t.view());
  return out;
}

bool IsCompressedAnchor(const SafetensorsFile& file) {
  auto it = file.metadata().find(std::string(pm::kFormat));
  return it != file.metadata().end() && it->second == kAnchorFormat;
}

Result<EncodedPatch> EncodeCompressedAnchor(uint64_t model_version, std::span<const TensorView> tensors,
                                            int threads) {
  std::vector<const TensorView*> order;
  for (const TensorView& t : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->name < b->name; });
  uint64_t total = 0;
  std::vector<Task> tasks;
  std::vector<size_t> first_task(order.size() + 1, 0);
  for (size_t i = 0; i < order.size(); ++i) {
    const TensorView& t = *order[i];
    if (i > 0 && t.name == order[i - 1]->name) return Status::InvalidArgument("tensor '" + t.name + "' appears twice");
    std::optional<uint64_t> n = CheckedElementCount(t.shape);
    if (!n || *n * DTypeSize(t.dtype) != t.data.size()) {
      return Status::InvalidArgument("tensor '" + t.name + "': " + std::to_string(t.data.size()) + " bytes for shape " +
                                     ShapeToString(t.shape));
    }
    total += *n;
    first_task[i] = tasks.size();
    for (uint64_t c = 0; c * kChunk < *n; ++c) tasks.push_back({i, c});
  }
  first_task[order.size()] = tasks.size();
  std::vector<std::vector<uint8_t>> chunks(tasks.size());
  ParallelFor(tasks.size(), threads, [&](size_t k) {
    const TensorView& t = *order[tasks[k].tensor];
    const uint64_t b = tasks[k].chunk * kChunk;
    EncodeChunk(t, b, std::min(t.num_elements(), b + kChunk), chunks[k]);
  });

  // Per tensor its stream header, then its chunks' buffers as they are: the
  // file's parts, in order (no copy of the chunks into one stream each).
  EncodedPatch out;
  out.owned.reserve(1 + order.size() + tasks.size());
  out.owned.emplace_back();  // the safetensors header, below
  std::vector<std::string> names(order.size());
  std::vector<std::array<uint64_t, 1>> sizes(order.size());
  std::vector<TensorLayout> layouts;
  for (size_t i = 0; i < order.size(); ++i) {
    const TensorView& t = *order[i];
    std::vector<uint8_t>& s = out.owned.emplace_back();
    s.push_back(kStreamVersion);
    const std::string_view dtype = DTypeName(t.dtype);
    s.push_back(static_cast<uint8_t>(dtype.size()));
    s.insert(s.end(), dtype.begin(), dtype.end());
    PutVarint(s, t.shape.size());
    for (uint64_t d : t.shape) PutVarint(s, d);
    PutVarint(s, kChunk);
    uint64_t bytes = s.size();
    for (size_t k = first_task[i]; k < first_task[i + 1]; ++k) {
      bytes += chunks[k].size();
      out.owned.push_back(std::move(chunks[k]));
    }
    names[i] = t.name + std::string(kSuffix);
    sizes[i] = {bytes};
    layouts.push_back({names[i], DType::kU8, sizes[i], bytes});
  }
  Metadata m;
  m.emplace(pm::kFormat, kAnchorFormat);
  m.emplace(pm::kVersion, pm::kVersionValue);
  m.emplace(pm::kSparse, pm::kFalse);
  m.emplace(pm::kModelVersion, std::to_string(model_version));
  m.emplace(pm::kTotalElements, std::to_string(total));
  DS_ASSIGN_OR_RETURN(out.owned[0], EncodeSafetensorsHeader(m, std::span<const TensorLayout>(layouts)));
  for (const std::vector<uint8_t>& part : out.owned) {
    out.parts.push_back(part);
    out.size += part.size();
  }
  return out;
}

Result<DecodedAnchor> DecodeCompressedAnchor(const SafetensorsFile& file, int threads) {
  const std::string& label = file.label();
  auto bad = [&](std::string_view tensor, const std::string& msg) {
    return Status::Corruption(label + ": tensor '" + std::string(tensor) + "': " + msg);
  };
  const Metadata& m = file.metadata();
  auto it = m.find(std::string(pm::kFormat));
  if (it == m.end() || it->second != kAnchorFormat) {
    return Status::Corruption(label + ": __metadata__ 'format' is not '" + std::string(kAnchorFormat) + "'");
  }
  it = m.find(std::string(pm::kModelVersion));
  std::optional<uint64_t> version = it == m.end() ? std::nullopt : pm::ParseDecimal(it->second);
  if (!version) return Status::Corruption(label + ": __metadata__ 'model_version' is missing or not an integer");
  it = m.find(std::string(pm::kTotalElements));
  std::optional<uint64_t> total = it == m.end() ? std::nullopt : pm::ParseDecimal(it->second);
  if (!total) return Status::Corruption(label + ": __metadata__ 'total_elements' is missing or not an integer");

  // In the order of the tensors' names (the suffix off), as the encoder
  // wrote them and DecodedAnchor promises: the streams' own names sort
  // otherwise where one tensor's name is another's prefix ("m.zan" after
  // "m.b.zan" and "m-c.zan"), and a parted anchor's tensors are checked
  // against its layout's blocks in name order (sync/replay.cc).
  auto stem = [](std::string_view name) {
    return name.ends_with(kSuffix) ? name.substr(0, name.size() - kSuffix.size()) : name;
  };
  std::vector<const TensorView*> streams;
  for (const TensorView& t : file.tensors()) streams.push_back(&t);
  std::sort(streams.begin(), streams.end(), [&](auto* a, auto* b) {
    const std::string_view x = stem(a->name), y = stem(b->name);
    return x != y ? x < y : a->name < b->name;
  });

  DecodedAnchor out;
  out.model_version = *version;
  out.tensors.resize(streams.size());
  struct Chunk {
    size_t tensor;
    uint64_t begin, end;
    BlockRef block;  // bf16: the exponent plane; else the bytes
    ByteSpan sign_mantissa;
  };
  std::vector<Chunk> chunks;
  uint64_t sum = 0;
  for (size_t i = 0; i < streams.size(); ++i) {
    const TensorView& s = *streams[i];
    const std::string& name = s.name;
    if (name.size() <= kSuffix.size() || name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) {
      return bad(name, "name does not end in '.zan'");
    }
    if (s.dtype != DType::kU8 || s.shape.size() != 1) return bad(name, "not a 1-D U8 tensor");
    Reader in(s.data);
    std::optional<uint8_t> v = in.Byte();
    if (!v || *v != kStreamVersion) return bad(name, "missing or unknown stream version");
    std::optional<uint8_t> dlen = in.Byte();
    std::optional<ByteSpan> dname = dlen ? in.Take(*dlen) : std::nullopt;
    std::optional<DType> dtype =
        dname ? ParseDType(std::string_view(reinterpret_cast<const char*>(dname->data()), dname->size())) : std::nullopt;
    if (!dtype) return bad(name, "missing or unknown dtype");
    std::optional<uint64_t> ndim = in.Varint();
    if (!ndim || *ndim > 64) return bad(name, "missing or implausible rank");
    WeightState::Tensor& t = out.tensors[i];
    t.name = name.substr(0, name.size() - kSuffix.size());
    t.dtype = *dtype;
    for (uint64_t d = 0; d < *ndim; ++d) {
      std::optional<uint64_t> dim = in.Varint();
      if (!dim) return bad(name, "truncated shape");
      t.shape.push_back(*dim);
    }
    const size_t es = DTypeSize(*dtype);
    std::optional<uint64_t> n = CheckedElementCount(t.shape);
    if (!n || *n > (uint64_t{1} << 60) / es) return bad(name, "shape " + ShapeToString(t.shape) + " overflows");
    std::optional<uint64_t> chunk = in.Varint();
    if (!chunk || *chunk == 0 || *chunk > kMaxChunk) return bad(name, "missing or invalid chunk size");
    // Bound the allocation by the stream: a bf16 chunk holds its raw
    // sign+mantissa plane (n bytes), other chunks >= 1 byte of block header
    // per chunk and zstd cannot expand more than ~2^17x; refuse anything the
    // stream could not hold.
    const uint64_t n_chunks = (*n + *chunk - 1) / *chunk;
    if (n_chunks > in.remaining() || (*dtype == DType::kBF16 && *n > in.remaining())) {
      return bad(name, std::to_string(*n) + " elements cannot fit in " + std::to_string(in.remaining()) + " bytes");
    }
    for (uint64_t c = 0; c < n_chunks; ++c) {
      Chunk ch{i, c * *chunk, std::min(*n, (c + 1) * *chunk), {}, {}};
      const uint64_t len = ch.end - ch.begin;
      if (auto err = compact::PeekBlock(in, len * (*dtype == DType::kBF16 ? 1 : es), ch.block)) {
        return bad(name, "chunk " + std::to_string(c) + ": " + *err);
      }
      if (*dtype == DType::kBF16) {
        std::optional<ByteSpan> sm = in.Take(len);
        if (!sm) return bad(name, "chunk " + std::to_string(c) + ": sign+mantissa plane truncated");
        ch.sign_mantissa = *sm;
      }
      chunks.push_back(ch);
    }
    if (in.remaining() != 0) return bad(name, std::to_string(in.remaining()) + " trailing bytes");
    sum += *n;
    if (i > 0 && t.name == out.tensors[i - 1].name) return bad(name, "duplicate tensor");
  }
  if (sum != *total) {
    return Status::Corruption(label + ": total_elements " + std::to_string(*total) + " but the tensors hold " +
                              std::to_string(sum));
  }
  // Fresh memory, faulted in on the threads (ResizeFresh), then every byte
  // written below (a chunk's decode or its planes' join).
  std::vector<std::vector<uint8_t>*> data;
  std::vector<size_t> sizes;
  for (WeightState::Tensor& t : out.tensors) {
    data.push_back(&t.data);
    sizes.push_back(static_cast<size_t>(*CheckedElementCount(t.shape) * DTypeSize(t.dtype)));
  }
  ResizeFresh(data, sizes, threads);

  std::vector<std::optional<std::string>> errors(chunks.size());
  ParallelFor(chunks.size(), threads, [&](size_t k) {
    const Chunk& ch = chunks[k];
    WeightState::Tensor& t = out.tensors[ch.tensor];
    const uint64_t len = ch.end - ch.begin;
    if (t.dtype != DType::kBF16) {
      errors[k] = compact::DecodeBlock(ch.block, t.data.data() + ch.begin * DTypeSize(t.dtype));
      return;
    }
    // Decode the exponent plane into the upper half of the output range,
    // then interleave forward (each write lands at or before its reads).
    uint8_t* dst = t.data.data() + 2 * ch.begin;
    uint8_t* exps = dst + len;
    errors[k] = compact::DecodeBlock(ch.block, exps);
    if (errors[k]) return;
    kernels::JoinBf16Planes(exps, ch.sign_mantissa.data(), dst, static_cast<size_t>(len));
  });
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (errors[k]) return bad(streams[chunks[k].tensor]->name, "chunk at element " + std::to_string(chunks[k].begin) + ": " + *errors[k]);
  }
  return out;
}

}  // namespace deltasync
