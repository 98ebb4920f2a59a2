// Encodes anchors and deltas in TRL's sparse_weight_patch layout
// (docs/format.md, "Patch objects"). Runs on the trainer's hot path: tensors' indices
// are encoded (index_codec.h) in parallel across tensors. Anchor tensors are
// referenced, not copied; a delta owns its bytes (patch.h: only anchors point
// into the caller's memory), which costs one copy of the sparse values.
#include <algorithm>
#include <limits>

#include "codec/delta_header.h"
#include "codec/index_codec.h"
#include "codec/patch_metadata.h"
#include "common/parallel.h"
#include "deltasync/patch.h"

namespace deltasync {
namespace {

// Below this many indices in total, encoding stays on the calling thread.
constexpr uint64_t kParallelMinIndices = uint64_t{1} << 18;

Metadata BuildMetadata(bool sparse, uint64_t model_version, uint64_t num_params, uint64_t changed,
                       uint64_t total, IndexEncoding encoding) {
  using namespace patchmeta;
  Metadata m;
  m.emplace(kFormat, kFormatValue);
  m.emplace(kVersion, kVersionValue);
  m.emplace(kSparse, sparse ? kTrue : kFalse);
  m.emplace(kModelVersion, std::to_string(model_version));
  m.emplace(kNumChangedParams, std::to_string(num_params));
  m.emplace(kTotalChangedElements, std::to_string(changed));
  m.emplace(kTotalElements, std::to_string(total));
  m.emplace(kSparsity, PythonFloatRepr(Sparsity(changed, total)));
  m.emplace(kEncoding, EncodingName(encoding));
  return m;
}

Status NotAscending(const TensorChanges& c, size_t k) {
  return Status::InvalidArgument("tensor '" + c.name + "': indices are not strictly ascending at position " +
                                 std::to_string(k) + " (" + std::to_string(c.indices[k]) + " after " +
                                 std::to_string(c.indices[k - 1]) + ")");
}

// Encodes one tensor's indices into `bytes`, returning the index dtype.
Result<DType> EncodeIndices(const TensorChanges& c, IndexEncoding encoding, std::vector<uint8_t>& bytes) {
  if (c.values.size() != c.count() * DTypeSize(c.dtype)) {
    return Status::InvalidArgument("tensor '" + c.name + "': " + std::to_string(c.values.size()) +
                                   " value bytes for " + std::to_string(c.count()) + " " +
                                   std::string(DTypeName(c.dtype)) + " values");
  }
  if (encoding == IndexEncoding::kRaw && !c.indices.empty() &&
      c.indices.back() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Status::InvalidArgument("tensor '" + c.name + "': index " + std::to_string(c.indices.back()) +
                                   " does not fit a raw (I64) index");
  }
  std::optional<DType> dtype = encoding == IndexEncoding::kRaw ? indexcodec::EncodeRaw(c.indices, bytes)
                                                               : indexcodec::EncodeGaps(c.indices, bytes);
  if (!dtype) return NotAscending(c, indexcodec::FirstNotAscending(c.indices));
  return *dtype;
}

void AppendPart(EncodedPatch& out, ByteSpan part) {
  if (part.empty()) return;
  out.parts.push_back(part);
  out.size += part.size();
}

}  // namespace

namespace codec {

Status CheckDeltaInfo(const PatchInfo& info, uint64_t changed) {
  if (changed > info.total_elements) {
    return Status::InvalidArgument("total_elements " + std::to_string(info.total_elements) + " is less than the " +
                                   std::to_string(changed) + " changed elements");
  }
  if (info.encoding == IndexEncoding::kCompact) {
    return Status::InvalidArgument("EncodeDelta writes TRL encodings (gap_delta, raw); compact deltas come from "
                                   "EncodeCompactDelta");
  }
  if (info.base_version && *info.base_version >= info.model_version) {
    return Status::InvalidArgument("base version " + std::to_string(*info.base_version) +
                                   " is not older than model_version " + std::to_string(info.model_version));
  }
  return Status::OK();
}

Result<std::vector<uint8_t>> EncodeDeltaHeader(const PatchInfo& info, uint64_t num_params, uint64_t changed,
                                               std::span<const TensorLayout> tensors) {
  Metadata metadata = BuildMetadata(true, info.model_version, num_params, changed, info.total_elements, info.encoding);
  if (info.base_version) metadata.emplace(patchmeta::kBaseVersion, std::to_string(*info.base_version));
  if (info.base_state_hash) metadata.emplace(patchmeta::kBaseStateHash, info.base_state_hash->Hex());
  return EncodeSafetensorsHeader(metadata, tensors);
}

}  // namespace codec

Result<EncodedPatch> EncodeAnchor(uint64_t model_version, std::span<const TensorView> tensors) {
  std::vector<TensorView> sorted(tensors.begin(), tensors.end());
  std::sort(sorted.begin(), sorted.end(), [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  uint64_t total = 0;
  for (const TensorView& t : sorted) total += t.num_elements();  // < 2^64: the bytes exist
  // An anchor lists every parameter as changed, like TRL's; its encoding is
  // meaningless and gets TRL's default.
  Metadata metadata = BuildMetadata(false, model_version, sorted.size(), total, total, IndexEncoding::kGapDelta);
  DS_ASSIGN_OR_RETURN(std::vector<uint8_t> header, EncodeSafetensorsHeader(metadata, sorted));

  EncodedPatch out;
  out.owned.push_back(std::move(header));
  AppendPart(out, out.owned[0]);
  for (const TensorView& t : sorted) AppendPart(out, t.data);
  return out;
}

Result<EncodedPatch> EncodeDelta(const PatchInfo& info, std::span<const TensorChanges> changes) {
  EncodedPatch out;
  DS_RETURN_IF_ERROR(EncodeDelta(info, changes, out));
  return out;
}

Status EncodeDelta(const PatchInfo& info, std::span<const TensorChanges> changes, EncodedPatch& out) {
  out.parts.clear();
  out.size = 0;
  std::vector<const TensorChanges*> order;
  order.reserve(changes.size());
  for (const TensorChanges& c : changes) order.push_back(&c);
  std::sort(order.begin(), order.end(), [](const TensorChanges* a, const TensorChanges* b) { return a->name < b->name; });
  uint64_t changed = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (i > 0 && order[i]->name == order[i - 1]->name) {
      return Status::InvalidArgument("tensor '" + order[i]->name + "' appears twice in the changes");
    }
    changed += order[i]->count();
  }
  DS_RETURN_IF_ERROR(codec::CheckDeltaInfo(info, changed));

  // owned[0] is the header; owned[1 + 2i] and owned[2 + 2i] the index and
  // value bytes of order[i]. Buffers `out` held before are written over in
  // place (their pages already mapped); the rest start empty.
  out.owned.resize(1 + 2 * order.size());
  std::vector<DType> index_dtypes(order.size());
  std::vector<Status> errors(order.size());
  ParallelFor(order.size(), changed >= kParallelMinIndices ? 0 : 1, [&](size_t i) {
    Result<DType> dtype = EncodeIndices(*order[i], info.encoding, out.owned[1 + 2 * i]);
    if (dtype.ok()) {
      index_dtypes[i] = *dtype;
      out.owned[2 + 2 * i] = order[i]->values;
    } else {
      errors[i] = dtype.status();
    }
  });
  for (const Status& s : errors) {
    if (!s.ok()) out.owned.clear();
    DS_RETURN_IF_ERROR(s);
  }

  std::vector<TensorView> views;
  views.reserve(2 * order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    const TensorChanges& c = *order[i];
    const std::vector<uint64_t> shape{c.count()};
    views.push_back({c.name + std::string(patchmeta::kIdxSuffix), index_dtypes[i], shape, out.owned[1 + 2 * i]});
    views.push_back({c.name + std::string(patchmeta::kValSuffix), c.dtype, shape, out.owned[2 + 2 * i]});
  }
  std::vector<TensorLayout> layouts;
  layouts.reserve(views.size());
  for (const TensorView& v : views) layouts.push_back({v.name, v.dtype, v.shape, v.data.size()});
  Result<std::vector<uint8_t>> header = codec::EncodeDeltaHeader(info, order.size(), changed, layouts);
  if (!header.ok()) {
    out.owned.clear();
    return header.status();
  }
  out.owned[0] = std::move(*header);

  AppendPart(out, out.owned[0]);
  for (const TensorView& v : views) AppendPart(out, v.data);
  return Status::OK();
}

}  // namespace deltasync
