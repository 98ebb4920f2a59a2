// Decodes a parsed safetensors file as a TRL sparse_weight_patch (anchor or
// delta), checking every rule of docs/format.md, "Patch objects". Input is untrusted:
// every count, dtype, shape and index is checked before use, and a violation
// is a Status naming the file, the tensor and the rule.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "codec/index_codec.h"
#include "codec/patch_metadata.h"
#include "common/parallel.h"
#include "deltasync/patch.h"

namespace deltasync {
namespace {

namespace pm = patchmeta;

// Below this many index bytes in total, decoding stays on the calling thread.
constexpr uint64_t kParallelMinIndexBytes = uint64_t{1} << 20;

// A metadata value for an error message: printable ASCII, at most 40 chars.
std::string Show(std::string_view v) {
  std::string out;
  for (char c : v.substr(0, 40)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (v.size() > 40) out += "...";
  return "'" + out + "'";
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Builds errors that name the file (and tensor).
class Errors {
 public:
  explicit Errors(const std::string& label) : label_(label) {}
  Status File(const std::string& msg) const { return Status::Corruption(label_ + ": " + msg); }
  Status Tensor(std::string_view tensor, const std::string& msg) const {
    return Status::Corruption(label_ + ": tensor '" + std::string(tensor) + "': " + msg);
  }
  const std::string& label() const { return label_; }

 private:
  const std::string& label_;
};

const std::string* Find(const Metadata& m, std::string_view key) {
  auto it = m.find(std::string(key));
  return it == m.end() ? nullptr : &it->second;
}

Result<std::optional<uint64_t>> OptionalInteger(const Metadata& m, std::string_view key, const Errors& err) {
  const std::string* text = Find(m, key);
  if (!text) return std::optional<uint64_t>();
  std::optional<uint64_t> value = pm::ParseDecimal(*text);
  if (!value) return err.File("__metadata__ '" + std::string(key) + "' is " + Show(*text) + ", not a non-negative integer");
  return value;
}

// What __metadata__ says, checked.
struct Header {
  PatchInfo info;
  std::optional<uint64_t> num_changed_params, total_changed_elements, total_elements;
  bool encoding_given = false;
  const std::string* changed_params = nullptr;  // older deltas' JSON list
  bool v1 = false;  // TRL's v1 writer: no 'format', no 'version' (IsTrlV1)
};

// TRL's v1 writer (the blog's layout) wrote neither 'format' nor 'version';
// its files are recognised by 'sparse' and 'model_version'.
bool IsTrlV1(const Metadata& m) {
  return !Find(m, pm::kFormat) && Find(m, pm::kSparse) && Find(m, pm::kModelVersion);
}

Result<Header> ReadHeader(const Metadata& m, const Errors& err) {
  Header h;
  h.v1 = IsTrlV1(m);
  const std::string* format = Find(m, pm::kFormat);
  if (!format && !h.v1) {
    return err.File("not a sparse_weight_patch: __metadata__ has no 'format' (nor the 'sparse' and 'model_version' "
                    "of TRL's v1 files)");
  }
  const bool old_anchor = format && *format == pm::kOldAnchorFormatValue;
  if (format && *format != pm::kFormatValue && !old_anchor) {
    return err.File("not a sparse_weight_patch: __metadata__ 'format' is " + Show(*format));
  }
  const std::string* version = Find(m, pm::kVersion);
  if (!version && !h.v1) return err.File("__metadata__ has no 'version'");
  if (version && *version != pm::kVersionValue) {
    return Status::Unsupported(err.label() + ": patch format version " + Show(*version) +
                               " is not supported (deltasync reads version 1)");
  }
  // "sparse" is Python's str(bool). The older writer left it out: its anchors
  // say format "anchor_checkpoint", its deltas "sparse_weight_patch".
  const std::string* sparse = Find(m, pm::kSparse);
  if (sparse && *sparse != pm::kTrue && *sparse != pm::kFalse) {
    return err.File("__metadata__ 'sparse' is " + Show(*sparse) + ", expected 'True' or 'False'");
  }
  if (old_anchor && sparse && *sparse == pm::kTrue) {
    return err.File("__metadata__ says format 'anchor_checkpoint' but sparse 'True'");
  }
  h.info.kind = old_anchor || (sparse && *sparse == pm::kFalse) ? PatchKind::kAnchor : PatchKind::kDelta;
  const bool delta = h.info.kind == PatchKind::kDelta;

  DS_ASSIGN_OR_RETURN(std::optional<uint64_t> model_version, OptionalInteger(m, pm::kModelVersion, err));
  if (!model_version) return err.File("__metadata__ has no 'model_version'");
  h.info.model_version = *model_version;
  DS_ASSIGN_OR_RETURN(h.num_changed_params, OptionalInteger(m, pm::kNumChangedParams, err));
  DS_ASSIGN_OR_RETURN(h.total_changed_elements, OptionalInteger(m, pm::kTotalChangedElements, err));
  DS_ASSIGN_OR_RETURN(h.total_elements, OptionalInteger(m, pm::kTotalElements, err));

  if (const std::string* encoding = Find(m, pm::kEncoding)) {
    Result<IndexEncoding> parsed = ParseEncoding(*encoding);
    if (parsed.ok() && *parsed == IndexEncoding::kCompact) {
      // Compact deltas and compressed anchors decode only through compact.h
      // (a compact delta needs its base).
      return Status::Unsupported(err.label() + ": a deltasync compact object (encoding 'compact'); it decodes with "
                                 "its base state (deltasync apply BASE PATCH), not as a TRL patch");
    } else if (parsed.ok()) {
      h.info.encoding = *parsed;
      h.encoding_given = true;
    } else if (parsed.status().code() == ErrorCode::kUnsupported) {
      // TRL stamps its configured encoding on anchors too, where it means
      // nothing: only a delta's indices need nvCOMP.
      if (delta) return parsed.status().WithContext(err.label());
    } else {
      return err.File("__metadata__ 'encoding' is " + Show(*encoding) + ", expected 'raw' or 'gap_delta'");
    }
  }
  if (delta) {
    DS_ASSIGN_OR_RETURN(h.info.base_version, OptionalInteger(m, pm::kBaseVersion, err));
    if (h.info.base_version && *h.info.base_version >= h.info.model_version) {
      return err.File("__metadata__ deltasync_base_version " + std::to_string(*h.info.base_version) +
                      " is not older than model_version " + std::to_string(h.info.model_version));
    }
    h.changed_params = Find(m, pm::kChangedParams);
    if (const std::string* hash = Find(m, pm::kBaseStateHash)) {
      Result<StateHash> parsed = StateHash::FromHex(*hash);
      if (!parsed.ok()) {
        return err.File("__metadata__ '" + std::string(pm::kBaseStateHash) + "' is " + Show(*hash) +
                        ", not 32 hex digits");
      }
      h.info.base_state_hash = *parsed;
    }
  }
  return h;
}

Status CheckAnchorCounts(const Header& h, size_t tensors, uint64_t elements, const Errors& err) {
  auto mismatch = [&](std::string_view key, uint64_t said, uint64_t holds, std::string_view what) {
    return err.File("__metadata__ " + std::string(key) + " is " + std::to_string(said) + " but the anchor holds " +
                    std::to_string(holds) + " " + std::string(what));
  };
  if (h.num_changed_params && *h.num_changed_params != tensors) {
    return mismatch(pm::kNumChangedParams, *h.num_changed_params, tensors, "tensors");
  }
  if (h.total_elements && *h.total_elements != elements) {
    return mismatch(pm::kTotalElements, *h.total_elements, elements, "elements");
  }
  if (h.total_changed_elements && *h.total_changed_elements != elements) {
    return mismatch(pm::kTotalChangedElements, *h.total_changed_elements, elements, "elements");
  }
  return Status::OK();
}

Result<DecodedPatch> DecodeAnchor(Header h, SafetensorsFile file, const Errors& err) {
  DecodedPatch out;
  out.dense = file.tensors();
  std::sort(out.dense.begin(), out.dense.end(), [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  uint64_t elements = 0;
  for (const TensorView& t : out.dense) elements += t.num_elements();  // bounded by the file size
  DS_RETURN_IF_ERROR(CheckAnchorCounts(h, out.dense.size(), elements, err));
  h.info.base_version.reset();
  h.info.total_elements = h.info.total_changed_elements = elements;
  h.info.num_changed_params = out.dense.size();
  out.info = h.info;
  out.file = std::move(file);
  return out;
}

// ---- deltas ---------------------------------------------------------------

// One changed parameter's tensors.
struct Pair {
  const TensorView* idx = nullptr;
  const TensorView* val = nullptr;
  bool old_idx = false;  // "{name}.indices" rather than "{name}.idx"
  bool old_val = false;  // "{name}.values" rather than "{name}.val"
};

using PairMap = std::map<std::string, Pair>;

// Groups a delta's tensors by parameter name (sorted, via std::map).
Result<PairMap> PairTensors(const SafetensorsFile& file, const Errors& err) {
  PairMap pairs;
  const auto& tensors = file.tensors();
  for (const TensorView& t : tensors) {
    if (t.name == pm::kOldEmptyDelta && tensors.size() == 1) continue;  // older writer's "no changes"
    std::string_view suffix;
    for (std::string_view s : {pm::kIdxSuffix, pm::kValSuffix, pm::kOldIdxSuffix, pm::kOldValSuffix}) {
      if (EndsWith(t.name, s)) suffix = s;
    }
    if (suffix.empty()) {
      return err.Tensor(t.name, "a delta holds only '{name}.idx' + '{name}.val' (or '{name}.indices' + "
                                "'{name}.values') tensors");
    }
    const std::string name = t.name.substr(0, t.name.size() - suffix.size());
    Pair& p = pairs[name];
    const bool is_idx = suffix == pm::kIdxSuffix || suffix == pm::kOldIdxSuffix;
    const TensorView*& slot = is_idx ? p.idx : p.val;
    if (slot) {
      return err.Tensor(t.name, "parameter '" + name + "' already has " + (is_idx ? "indices" : "values") +
                                    " in '" + slot->name + "'");
    }
    slot = &t;
    (is_idx ? p.old_idx : p.old_val) = suffix == pm::kOldIdxSuffix || suffix == pm::kOldValSuffix;
  }
  for (const auto& [name, p] : pairs) {
    if (!p.idx) {
      return err.Tensor(p.val->name, "has no index tensor '" + name +
                                         std::string(p.old_val ? pm::kOldIdxSuffix : pm::kIdxSuffix) + "'");
    }
    if (!p.val) {
      return err.Tensor(p.idx->name, "has no value tensor '" + name +
                                         std::string(p.old_idx ? pm::kOldValSuffix : pm::kValSuffix) + "'");
    }
    if (p.old_idx != p.old_val) {
      return err.Tensor(p.idx->name, "pairs with '" + p.val->name + "' of the other layout");
    }
  }
  return pairs;
}

Status IndexError(const indexcodec::DecodeError& e, const TensorView& idx, const std::vector<uint64_t>& decoded,
                  const Errors& err) {
  const std::string at = " at position " + std::to_string(e.position);
  switch (e.kind) {
    case indexcodec::DecodeError::kNone: break;
    case indexcodec::DecodeError::kNegative:
      return err.Tensor(idx.name, "raw index " + std::to_string(e.value) + at + " is negative");
    case indexcodec::DecodeError::kNotAscending:
      return err.Tensor(idx.name, "raw indices are not strictly ascending" + at + " (" + std::to_string(e.value) +
                                      " after " + std::to_string(decoded[e.position - 1]) + ")");
    case indexcodec::DecodeError::kOverflow:
      return err.Tensor(idx.name, "gap_delta indices overflow" + at);
  }
  return Status::OK();
}

Status CheckPairShapes(const Pair& p, const Errors& err) {
  const TensorView& idx = *p.idx;
  const TensorView& val = *p.val;
  for (const TensorView* t : {&idx, &val}) {
    if (t->shape.size() != 1) {
      return err.Tensor(t->name, "shape " + ShapeToString(t->shape) + " is not 1-D");
    }
  }
  if (idx.shape[0] != val.shape[0]) {
    return err.Tensor(idx.name, std::to_string(idx.shape[0]) + " indices but '" + val.name + "' holds " +
                                    std::to_string(val.shape[0]) + " values");
  }
  return Status::OK();
}

Status CheckGapDType(const TensorView& idx, const Errors& err) {
  if (idx.dtype != DType::kU16 && idx.dtype != DType::kU32 && idx.dtype != DType::kU64) {
    return err.Tensor(idx.name, "dtype " + std::string(DTypeName(idx.dtype)) +
                                    " is not a gap_delta index type (U16, U32 or U64)");
  }
  return Status::OK();
}

// A gap_delta pair kept encoded: the same checks as DecodePair, with the
// chunk starts computed instead of every index.
Status EncodedPair(const std::string& name, const Pair& p, const Errors& err, EncodedChanges& out) {
  DS_RETURN_IF_ERROR(CheckPairShapes(p, err));
  const TensorView& idx = *p.idx;
  DS_RETURN_IF_ERROR(CheckGapDType(idx, err));
  const indexcodec::DecodeError e =
      indexcodec::GapChunkStarts(idx.dtype, idx.data, EncodedChanges::kGapChunk, out.chunk_starts, &out.last);
  DS_RETURN_IF_ERROR(IndexError(e, idx, {}, err));
  out.name = name;
  out.dtype = p.val->dtype;
  out.index_dtype = idx.dtype;
  out.gaps = idx.data;
  out.values = p.val->data;
  out.count = idx.shape[0];
  return Status::OK();
}

Status DecodePair(const std::string& name, const Pair& p, IndexEncoding encoding, const Errors& err,
                  TensorChanges& out) {
  const TensorView& idx = *p.idx;
  const TensorView& val = *p.val;
  DS_RETURN_IF_ERROR(CheckPairShapes(p, err));
  // The older layout always holds absolute int32 positions.
  const IndexEncoding kind = p.old_idx ? IndexEncoding::kRaw : encoding;
  indexcodec::DecodeError e;
  if (kind == IndexEncoding::kRaw) {
    if (idx.dtype != DType::kI32 && idx.dtype != DType::kI64) {
      return err.Tensor(idx.name, "dtype " + std::string(DTypeName(idx.dtype)) + " is not a raw index type (I32 or I64)");
    }
    e = indexcodec::DecodeRaw(idx.dtype, idx.data, out.indices);
  } else {
    DS_RETURN_IF_ERROR(CheckGapDType(idx, err));
    e = indexcodec::DecodeGaps(idx.dtype, idx.data, out.indices);
  }
  DS_RETURN_IF_ERROR(IndexError(e, idx, out.indices, err));
  out.name = name;
  out.dtype = val.dtype;
  out.values.assign(val.data.begin(), val.data.end());
  return Status::OK();
}

// The older writer's "changed_params" must list exactly the file's parameters.
Status CheckChangedParams(const std::string& text, const std::vector<const std::string*>& changes, const Errors& err) {
  nlohmann::json list = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (list.is_discarded() || !list.is_array()) {
    return err.File("__metadata__ 'changed_params' is not a JSON list of names");
  }
  std::vector<std::string> names;
  for (const nlohmann::json& v : list) {
    if (!v.is_string()) return err.File("__metadata__ 'changed_params' is not a JSON list of names");
    names.push_back(v.get<std::string>());
  }
  std::sort(names.begin(), names.end());
  bool same = names.size() == changes.size();
  for (size_t i = 0; same && i < names.size(); ++i) same = names[i] == *changes[i];
  if (!same) {
    return err.File("__metadata__ 'changed_params' lists " + std::to_string(names.size()) +
                    " parameters, which are not the " + std::to_string(changes.size()) + " in the file");
  }
  return Status::OK();
}

Result<DecodedPatch> DecodeDelta(Header h, SafetensorsFile file, const Errors& err, const DecodePatchOptions& options) {
  DS_ASSIGN_OR_RETURN(PairMap pairs, PairTensors(file, err));
  std::vector<const std::string*> names;
  std::vector<const Pair*> order;
  uint64_t index_bytes = 0;
  bool old_layout = h.changed_params != nullptr;
  for (const auto& [name, p] : pairs) {
    names.push_back(&name);
    order.push_back(&p);
    index_bytes += p.idx->data.size();
    old_layout |= p.old_idx;
    // A file without 'format' is a patch only in the v1 layout throughout.
    if (h.v1 && !p.old_idx) {
      return err.Tensor(p.idx->name, "a TRL v1 delta (no 'format' in __metadata__) holds only '{name}.indices' + "
                                     "'{name}.values' tensors");
    }
  }
  if (h.v1 && !h.changed_params) {
    return err.File("a TRL v1 delta (no 'format' in __metadata__) must list its parameters in 'changed_params'");
  }
  // TRL's reader assumes gap_delta when "encoding" is absent; the older
  // writer, which never wrote it, used raw int32 positions.
  if (!h.encoding_given) h.info.encoding = old_layout ? IndexEncoding::kRaw : IndexEncoding::kGapDelta;

  DecodedPatch out;
  // Kept encoded only when every pair is gap_delta (the older layout's pairs
  // are raw whatever the metadata says).
  const bool encoded = options.keep_gaps_encoded && h.info.encoding == IndexEncoding::kGapDelta && !old_layout;
  (encoded ? out.encoded.resize(order.size()) : out.changes.resize(order.size()));
  std::vector<Status> errors(order.size());
  ParallelFor(order.size(), index_bytes >= kParallelMinIndexBytes ? 0 : 1, [&](size_t i) {
    errors[i] = encoded ? EncodedPair(*names[i], *order[i], err, out.encoded[i])
                        : DecodePair(*names[i], *order[i], h.info.encoding, err, out.changes[i]);
  });
  for (const Status& s : errors) DS_RETURN_IF_ERROR(s);

  uint64_t changed = 0;
  for (const TensorChanges& c : out.changes) changed += c.count();
  for (const EncodedChanges& c : out.encoded) changed += c.count;
  if (h.num_changed_params && *h.num_changed_params != order.size()) {
    return err.File("__metadata__ num_changed_params is " + std::to_string(*h.num_changed_params) +
                    " but the delta holds " + std::to_string(order.size()) + " parameters");
  }
  if (h.total_changed_elements && *h.total_changed_elements != changed) {
    return err.File("__metadata__ total_changed_elements is " + std::to_string(*h.total_changed_elements) +
                    " but the delta holds " + std::to_string(changed) + " indices");
  }
  if (h.total_elements && *h.total_elements < changed) {
    return err.File("__metadata__ total_elements " + std::to_string(*h.total_elements) + " is less than the " +
                    std::to_string(changed) + " changed elements");
  }
  if (h.changed_params) DS_RETURN_IF_ERROR(CheckChangedParams(*h.changed_params, names, err));
  h.info.total_changed_elements = changed;
  h.info.num_changed_params = order.size();
  // Unknown total: the changed count is the only bound the file gives.
  h.info.total_elements = h.total_elements.value_or(changed);
  out.info = h.info;
  out.file = std::move(file);
  return out;
}

}  // namespace

bool LooksLikeTrlPatch(const Metadata& metadata) {
  const std::string* format = Find(metadata, pm::kFormat);
  if (format) return *format == pm::kFormatValue || *format == pm::kOldAnchorFormatValue;
  return IsTrlV1(metadata);
}

Result<DecodedPatch> DecodePatch(SafetensorsFile file, const DecodePatchOptions& options) {
  const std::string label = file.label();
  const Errors err(label);
  DS_ASSIGN_OR_RETURN(Header header, ReadHeader(file.metadata(), err));
  if (header.info.kind == PatchKind::kAnchor) return DecodeAnchor(std::move(header), std::move(file), err);
  return DecodeDelta(std::move(header), std::move(file), err, options);
}

}  // namespace deltasync
