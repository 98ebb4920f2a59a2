// The compact delta encoding (docs/format.md, "Compact objects"): per changed
// tensor one U8 tensor `{name}.cmp` = header, then for bf16 tensors the
// positions as gaps counted within the base elements' exponent class (the
// replica holds the base, so it rebuilds the classes; elements of a class
// change at a similar rate, which makes the gaps cheap), zigzag ULP
// differences and escaped raw values, each stream class by class and
// Huffman-coded (literal-only zstd) in stream version 2; version 3
// (compact_v3.h) codes the same streams with delta-wide rANS tables, and
// this file dispatches on the version byte. Other dtypes: plain gaps and raw
// values.
// Tensors are encoded and decoded in parallel.
// Recognizing and measuring a compact delta: compact_inspect.cc.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "bf16/compact_scan.h"
#include "bf16/simd_kernels.h"
#include "codec/compact_bf16.h"
#include "codec/compact_container.h"
#include "codec/compact_rice.h"
#include "codec/compact_v3.h"
#include "codec/compact_streams.h"
#include "codec/stream_buffers.h"
#include "codec/patch_metadata.h"
#include "common/parallel.h"
#include "deltasync/compact.h"

namespace deltasync {
namespace {

namespace pm = patchmeta;
using compact::PutBlock;
using compact::PutVarint;

using compact::ClassOf;
using compact::DiffByte;
using compact::kClasses;
using compact::kEscape;
using compact::kModeBf16;
using compact::kModeRaw;
using compact::kStreamVersion;

using compact::kStreamSuffix;
constexpr int kZstdLevel = 3;  // raw values of non-bf16 tensors
// Below this many changed elements in total, work stays on one thread.
constexpr uint64_t kParallelMin = uint64_t{1} << 16;
// Below this many changed elements, kCompactStreamAuto also encodes version
// 2 and keeps the smaller file (never worse than version 2).
constexpr uint64_t kSmallDelta = 4096;

uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// ClassOf() of every exponent byte.
constexpr std::array<uint8_t, 256> kClassOfExponent = [] {
  std::array<uint8_t, 256> t{};
  for (int e = 0; e < 256; ++e) t[e] = static_cast<uint8_t>(e <= 112 ? 0 : e >= 127 ? 15 : e - 112);
  return t;
}();

}  // namespace

namespace compact {

void WriteBf16Stream(const Bf16Streams& s, std::vector<uint8_t>& out) {
  uint64_t count = 0;
  for (uint64_t m : s.counts) count += m;
  out.push_back(kStreamVersion);
  out.push_back(kModeBf16);
  PutVarint(out, count);
  compact::BitWriter gap_bits;
  for (int cl = 0; cl < kClasses; ++cl) {
    PutVarint(out, s.counts[cl]);
    if (s.counts[cl] > 0) PutRiceGaps(gap_bits, s.counts[cl], *s.gaps[cl]);
  }
  PutBlock(out, gap_bits.Finish(), compact::kStoredOnly);
  // One Huffman table per class: how far a weight moves depends on its
  // magnitude.
  std::vector<uint8_t> joined;
  auto join = [&](const std::vector<ByteSpan>& parts) -> ByteSpan {
    if (parts.size() == 1) return parts[0];
    joined.clear();
    for (ByteSpan p : parts) joined.insert(joined.end(), p.begin(), p.end());
    return joined;
  };
  for (int cl = 0; cl < kClasses; ++cl) {
    if (s.counts[cl] > 0) PutBlock(out, join(s.diffs[cl]), compact::kLiteralsOnly);
  }
  PutBlock(out, join(s.escapes), compact::kLiteralsOnly);
}

Status CheckTensorChanges(const TensorChanges& c, const TensorView& base) {
  const size_t esize = DTypeSize(c.dtype);
  if (c.dtype != base.dtype) {
    return Status::InvalidArgument("tensor '" + c.name + "': changes are " + std::string(DTypeName(c.dtype)) +
                                   ", base is " + std::string(DTypeName(base.dtype)));
  }
  if (c.values.size() != c.count() * esize) {
    return Status::InvalidArgument("tensor '" + c.name + "': " + std::to_string(c.values.size()) +
                                   " value bytes for " + std::to_string(c.count()) + " values");
  }
  const uint64_t n = base.num_elements();
  uint64_t next = 0;  // idx[k-1] + 1
  for (size_t k = 0; k < c.count(); ++k) {
    const uint64_t i = c.indices[k];
    if (i >= n || i < next) {
      return Status::InvalidArgument("tensor '" + c.name + "': index " + std::to_string(i) + " at position " +
                                     std::to_string(k) + (i >= n ? " is out of range" : " is not ascending"));
    }
    next = i + 1;
  }
  return Status::OK();
}

void CountTensorDiffs(const TensorChanges& c, const TensorView& base, DiffHistogram& h) {
  if (c.dtype != DType::kBF16) return;
  const uint8_t* b = base.data.data();
  for (size_t k = 0; k < c.count(); ++k) {
    const uint16_t o = Load16(b + 2 * c.indices[k]);
    h[ClassOf(o)][DiffByte(o, Load16(c.values.data() + 2 * k))]++;
  }
}

Status EncodeTensorStream(const TensorChanges& c, const TensorView& base, std::vector<uint8_t>& out,
                          const V3Tables* tables) {
  DS_RETURN_IF_ERROR(CheckTensorChanges(c, base));
  const bool bf16 = c.dtype == DType::kBF16;
  if (!bf16) {
    uint64_t next = 0;
    out.push_back(tables ? kStreamVersion3 : kStreamVersion);
    out.push_back(kModeRaw);
    PutVarint(out, c.count());
    std::vector<uint8_t> gaps;
    for (uint64_t i : c.indices) {
      PutVarint(gaps, i - next);
      next = i + 1;
    }
    PutBlock(out, gaps, compact::kLiteralsOnly);
    PutBlock(out, c.values, kZstdLevel);
    return Status::OK();
  }
  // Class-ordered streams: the j-th change of class cl comes gaps[cl][j]
  // unchanged class-cl elements after the previous change of that class.
  std::array<std::vector<uint64_t>, kClasses> gaps_c;
  std::array<std::vector<uint8_t>, kClasses> diffs_c, escapes_c;
  // Unchanged elements are counted per class in four interleaved tables, so
  // that runs of one class do not serialise on one counter; a change of
  // class cl reads and clears its four counters.
  std::array<std::array<uint64_t, kClasses>, 4> skip{};
  const uint8_t* b = base.data.data();
  uint64_t i = 0;
  for (size_t k = 0; k < c.count(); ++k) {
    const uint64_t idx = c.indices[k];
    for (; i + 4 <= idx; i += 4) {
      ++skip[0][kClassOfExponent[Load16(b + 2 * i) >> 7 & 0xFF]];
      ++skip[1][kClassOfExponent[Load16(b + 2 * i + 2) >> 7 & 0xFF]];
      ++skip[2][kClassOfExponent[Load16(b + 2 * i + 4) >> 7 & 0xFF]];
      ++skip[3][kClassOfExponent[Load16(b + 2 * i + 6) >> 7 & 0xFF]];
    }
    for (; i < idx; ++i) ++skip[0][kClassOfExponent[Load16(b + 2 * i) >> 7 & 0xFF]];
    const uint16_t o = Load16(b + 2 * idx);
    const int cl = ClassOf(o);
    gaps_c[cl].push_back(skip[0][cl] + skip[1][cl] + skip[2][cl] + skip[3][cl]);
    skip[0][cl] = skip[1][cl] = skip[2][cl] = skip[3][cl] = 0;
    const uint16_t v = Load16(c.values.data() + 2 * k);
    const uint8_t d = DiffByte(o, v);
    diffs_c[cl].push_back(d);
    if (d == kEscape) escapes_c[cl].insert(escapes_c[cl].end(), c.values.data() + 2 * k, c.values.data() + 2 * k + 2);
    i = idx + 1;
  }
  compact::Bf16Streams streams;
  std::vector<VectorGaps> sources;
  sources.reserve(kClasses);
  for (int cl = 0; cl < kClasses; ++cl) {
    streams.counts[cl] = diffs_c[cl].size();
    streams.gaps[cl] = &sources.emplace_back(gaps_c[cl]);
    streams.diffs[cl].push_back(diffs_c[cl]);
    streams.escapes.push_back(escapes_c[cl]);
  }
  if (tables) {
    WriteBf16StreamV3(streams, *tables, out);
  } else {
    WriteBf16Stream(streams, out);
  }
  return Status::OK();
}

}  // namespace compact

namespace {

Status CheckContainer(int container) {
  if (container == kCompactContainerAuto || container == 1 || container == 2) return Status::OK();
  return Status::InvalidArgument("compact container " + std::to_string(container) + " is not 1, 2 or auto (0)");
}

// Each of `names` (sorted, each in `base_names`) as its index in
// `base_names` (sorted): container 2's tensor indices.
std::vector<uint64_t> BaseIndices(std::span<const std::string> names, std::span<const std::string_view> base_names) {
  std::vector<uint64_t> out;
  out.reserve(names.size());
  for (const std::string& n : names) {
    out.push_back(static_cast<uint64_t>(std::lower_bound(base_names.begin(), base_names.end(), n) - base_names.begin()));
  }
  return out;
}

Metadata BuildMetadata(const PatchInfo& info, const StateHash& base_hash, uint64_t params, uint64_t changed,
                       uint64_t total) {
  Metadata m;
  m.emplace(pm::kFormat, pm::kFormatValue);
  m.emplace(pm::kVersion, pm::kVersionValue);
  m.emplace(pm::kSparse, pm::kTrue);
  m.emplace(pm::kModelVersion, std::to_string(info.model_version));
  m.emplace(pm::kNumChangedParams, std::to_string(params));
  m.emplace(pm::kTotalChangedElements, std::to_string(changed));
  m.emplace(pm::kTotalElements, std::to_string(total));
  m.emplace(pm::kSparsity, pm::PythonFloatRepr(pm::Sparsity(changed, total)));
  m.emplace(pm::kEncoding, kCompactEncodingName);
  m.emplace(pm::kBaseVersion, std::to_string(*info.base_version));
  m.emplace(kBaseStateHashKey, base_hash.Hex());
  return m;
}

}  // namespace

Result<EncodedPatch> EncodeCompactDelta(const PatchInfo& info, const StateHash& base_hash, const WeightState& base,
                                        std::span<const TensorChanges> changes, int threads, int stream_version,
                                        int container) {
  const std::vector<TensorView> views = base.views();
  return EncodeCompactDelta(info, base_hash, std::span<const TensorView>(views), changes, threads, stream_version,
                            container);
}

Result<EncodedPatch> EncodeCompactDelta(const PatchInfo& info, const StateHash& base_hash,
                                        std::span<const TensorView> base, std::span<const TensorChanges> changes,
                                        int threads, int stream_version, int container) {
  if (!info.base_version) return Status::InvalidArgument("a compact delta needs info.base_version");
  if (stream_version != kCompactStreamAuto && stream_version != 2 && stream_version != 3) {
    return Status::InvalidArgument("compact stream version " + std::to_string(stream_version) + " is not 2 or 3");
  }
  DS_RETURN_IF_ERROR(CheckContainer(container));
  const bool automatic = stream_version == kCompactStreamAuto;
  if (automatic) stream_version = 3;
  if (*info.base_version >= info.model_version) {
    return Status::InvalidArgument("base version " + std::to_string(*info.base_version) +
                                   " is not older than model_version " + std::to_string(info.model_version));
  }
  std::unordered_map<std::string_view, const TensorView*> by_name;
  uint64_t total_elements = 0;
  for (const TensorView& t : base) {
    by_name.emplace(t.name, &t);
    total_elements += t.num_elements();
  }
  std::vector<const TensorChanges*> order;
  std::vector<const TensorView*> bases;
  for (const TensorChanges& c : changes) order.push_back(&c);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->name < b->name; });
  uint64_t changed = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i > 0 && order[i]->name == order[i - 1]->name) {
      return Status::InvalidArgument("tensor '" + order[i]->name + "' appears twice in the changes");
    }
    auto found = by_name.find(order[i]->name);
    const TensorView* t = found == by_name.end() ? nullptr : found->second;
    if (!t) return Status::InvalidArgument("tensor '" + order[i]->name + "' is not in the base state");
    bases.push_back(t);
    changed += order[i]->count();
  }
  std::vector<std::vector<uint8_t>> streams(order.size());
  std::vector<Status> errors(order.size());
  const int workers = changed >= kParallelMin ? threads : 1;
  std::optional<compact::V3Tables> tables;
  if (stream_version == 3) {
    // The delta's diff tables first: every tensor's histogram, summed.
    std::vector<compact::DiffHistogram> hist(order.size());
    ParallelFor(order.size(), workers, [&](size_t i) {
      hist[i] = {};
      errors[i] = compact::CheckTensorChanges(*order[i], *bases[i]);
      if (errors[i].ok()) compact::CountTensorDiffs(*order[i], *bases[i], hist[i]);
    });
    for (const Status& s : errors) DS_RETURN_IF_ERROR(s);
    compact::DiffHistogram sum{};
    for (const compact::DiffHistogram& h : hist) {
      for (int cl = 0; cl < kClasses; ++cl) {
        for (int d = 0; d < 256; ++d) sum[cl][d] += h[cl][d];
      }
    }
    tables = compact::V3Tables::Build(sum);
  }
  const compact::V3Tables* t = tables ? &*tables : nullptr;
  ParallelFor(order.size(), workers,
              [&](size_t i) { errors[i] = compact::EncodeTensorStream(*order[i], *bases[i], streams[i], t); });
  for (const Status& s : errors) DS_RETURN_IF_ERROR(s);
  std::vector<std::string> names;
  for (const TensorChanges* c : order) names.push_back(c->name);
  std::vector<std::string_view> base_names;
  for (const TensorView& v : base) base_names.push_back(v.name);
  std::sort(base_names.begin(), base_names.end());
  DS_ASSIGN_OR_RETURN(EncodedPatch out,
                      compact::AssembleCompactDelta(info, base_hash, total_elements, names,
                                                    BaseIndices(names, base_names), std::move(streams), changed, t,
                                                    container));
  if (automatic && changed < kSmallDelta) {
    // The tables' fixed cost can exceed what they save on a tiny delta.
    DS_ASSIGN_OR_RETURN(EncodedPatch v2, EncodeCompactDelta(info, base_hash, base, changes, 1, 2, container));
    if (v2.size < out.size) return v2;
  }
  return out;
}

Result<EncodedPatch> compact::AssembleCompactDelta(const PatchInfo& info, const StateHash& base_hash,
                                                   uint64_t base_total_elements, std::span<const std::string> names,
                                                   std::span<const uint64_t> indices,
                                                   std::vector<std::vector<uint8_t>> streams, uint64_t changed,
                                                   const V3Tables* tables, int container) {
  if (!info.base_version) return Status::InvalidArgument("a compact delta needs info.base_version");
  DS_RETURN_IF_ERROR(CheckContainer(container));
  Metadata metadata = BuildMetadata(info, base_hash, names.size(), changed, base_total_elements);
  if (tables) metadata.emplace(std::string(kTablesKey), tables->SerializeHex());
  // Container 2: one tensor, the directory then the streams back to back,
  // sent as separate parts (the header only needs the tensor's length, so
  // the streams are never copied into one buffer).
  std::vector<uint8_t> header2, directory;
  uint64_t streams_bytes = 0;
  for (const std::vector<uint8_t>& s : streams) streams_bytes += s.size();
  if (container != 1) {
    directory = WriteContainer2Directory(indices, streams);
    const uint64_t tensor_bytes = directory.size() + streams_bytes;
    const uint64_t shape[1] = {tensor_bytes};
    const TensorLayout one{compact::kContainerTensor, DType::kU8, shape, tensor_bytes};
    Metadata metadata2 = metadata;
    metadata2.emplace(std::string(compact::kContainerKey), std::string(compact::kContainer2Value));
    DS_ASSIGN_OR_RETURN(header2, EncodeSafetensorsHeader(metadata2, std::span<const TensorLayout>(&one, 1)));
  }
  bool use2 = container == 2;
  std::vector<uint8_t> header1;
  if (container != 2) {
    // Container 1's header: a tensor `{P}.cmp` per stream.
    std::vector<std::string> names1;
    names1.reserve(names.size());
    for (const std::string& n : names) names1.push_back(n + std::string(kStreamSuffix));
    std::vector<std::array<uint64_t, 1>> shapes(names.size());
    std::vector<TensorLayout> layouts1;
    layouts1.reserve(names.size());
    for (size_t i = 0; i < names.size(); ++i) {
      shapes[i][0] = streams[i].size();
      layouts1.push_back({names1[i], DType::kU8, shapes[i], streams[i].size()});
    }
    DS_ASSIGN_OR_RETURN(header1, EncodeSafetensorsHeader(metadata, std::span<const TensorLayout>(layouts1)));
    // Auto: container 2 unless container 1 is strictly smaller (a delta of
    // none or one changed tensor: the container key and the directory cost
    // more than the header entries they save).
    use2 = container == kCompactContainerAuto &&
           header1.size() + streams_bytes >= header2.size() + directory.size() + streams_bytes;
  }
  EncodedPatch out;
  out.owned.reserve(2 + streams.size());
  if (use2) {
    out.owned.push_back(std::move(header2));
    out.owned.push_back(std::move(directory));
  } else {
    out.owned.push_back(std::move(header1));
  }
  for (std::vector<uint8_t>& s : streams) out.owned.push_back(std::move(s));
  for (const std::vector<uint8_t>& part : out.owned) {
    if (part.empty()) continue;
    out.parts.push_back(part);
    out.size += part.size();
  }
  return out;
}

Result<EncodedPatch> EncodeScannedCompactDelta(const PatchInfo& info, const StateHash& base_hash,
                                               const WeightState& base, const bf16::CompactScan& scan,
                                               std::span<const TensorChanges> others, int threads,
                                               int stream_version, int container,
                                               compact::StreamBuffers* buffers) {
  if (!info.base_version || *info.base_version >= info.model_version) {
    return Status::InvalidArgument("a compact delta needs a base version older than model_version " +
                                   std::to_string(info.model_version));
  }
  if (stream_version != kCompactStreamAuto && stream_version != 2 && stream_version != 3) {
    return Status::InvalidArgument("compact stream version " + std::to_string(stream_version) + " is not 2 or 3");
  }
  DS_RETURN_IF_ERROR(CheckContainer(container));
  const bool automatic = stream_version == kCompactStreamAuto;
  if (automatic) stream_version = 3;
  // Both lists are in name order (the base's): merge them.
  struct Item {
    const std::string* name;
    size_t scanned;                 // index in scan, or SIZE_MAX
    const TensorChanges* other;     // or this
    uint64_t changed;
  };
  std::vector<Item> items;
  for (size_t i = 0; i < scan.tensors(); ++i) items.push_back({&scan.name(i), i, nullptr, scan.changed(i)});
  for (const TensorChanges& c : others) {
    if (c.count() > 0) items.push_back({&c.name, SIZE_MAX, &c, c.count()});
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return *a.name < *b.name; });
  // Biggest first, so that one large tensor does not finish last alone.
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return items[a].changed > items[b].changed; });
  uint64_t changed = 0;
  for (const Item& it : items) changed += it.changed;
  std::vector<std::vector<uint8_t>> streams(items.size());
  if (buffers) {
    // Largest kept buffer to the tensor with the most changes, and so on.
    for (size_t k = 0; k < order.size(); ++k) streams[order[k]] = buffers->Take();
  }
  std::vector<Status> errors(items.size());
  std::optional<compact::V3Tables> tables;
  if (stream_version == 3) {
    // The scan's diff bytes, per class (non-bf16 tensors have none),
    // counted by the scan as it went.
    compact::DiffHistogram sum{};
    scan.CountAllDiffs(sum);
    tables = compact::V3Tables::Build(sum);
  }
  const compact::V3Tables* tab = tables ? &*tables : nullptr;
  ParallelFor(order.size(), changed >= kParallelMin ? threads : 1, [&](size_t k) {
    const size_t i = order[k];
    if (items[i].other == nullptr) {
      scan.WriteStream(items[i].scanned, streams[i], tab);
      return;
    }
    const WeightState::Tensor* t = base.Find(*items[i].name);
    errors[i] = t ? compact::EncodeTensorStream(*items[i].other, t->view(), streams[i], tab)
                  : Status::InvalidArgument("tensor '" + *items[i].name + "' is not in the base state");
  });
  for (const Status& s : errors) DS_RETURN_IF_ERROR(s);
  std::vector<std::string> names;
  for (const Item& it : items) names.push_back(*it.name);
  std::vector<std::string_view> base_names;  // WeightState keeps its tensors in name order
  for (const WeightState::Tensor& t : base.tensors()) base_names.push_back(t.name);
  DS_ASSIGN_OR_RETURN(EncodedPatch out,
                      compact::AssembleCompactDelta(info, base_hash, base.total_elements(), names,
                                                    BaseIndices(names, base_names), std::move(streams), changed, tab,
                                                    container));
  if (automatic && changed < kSmallDelta) {  // as EncodeCompactDelta
    DS_ASSIGN_OR_RETURN(EncodedPatch v2,
                        EncodeScannedCompactDelta(info, base_hash, base, scan, others, 1, 2, container));
    if (v2.size < out.size) return v2;
  }
  return out;
}

}  // namespace deltasync
