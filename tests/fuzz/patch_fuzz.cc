// Fuzz target for the patch decoder. Properties, per input:
//   1. arbitrary bytes never crash SafetensorsFile::Parse + DecodePatch;
//   2. a patch that decodes re-encodes (EncodeAnchor / EncodeDelta), and
//      encoding it twice gives identical bytes;
//   3. the re-encoded bytes decode to the same patch;
//   4. decoding with keep_gaps_encoded fails exactly when (and as) the plain
//      decode does, and its encoded changes decode to the same changes.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "deltasync/blob.h"
#include "deltasync/patch.h"
#include "deltasync/safetensors.h"

namespace {

using namespace deltasync;

Result<EncodedPatch> Reencode(const DecodedPatch& p) {
  if (p.info.kind == PatchKind::kAnchor) return EncodeAnchor(p.info.model_version, p.dense);
  return EncodeDelta(p.info, p.changes);
}

std::vector<uint8_t> Flatten(const EncodedPatch& e) {
  std::vector<uint8_t> out;
  for (ByteSpan part : e.parts) out.insert(out.end(), part.begin(), part.end());
  if (out.size() != e.size) std::abort();
  return out;
}

bool SameInfo(const PatchInfo& a, const PatchInfo& b) {
  // An anchor's "encoding" is informational and not carried over.
  const bool encoding_matters = a.kind == PatchKind::kDelta;
  return a.kind == b.kind && a.model_version == b.model_version && a.base_version == b.base_version &&
         a.total_elements == b.total_elements && a.total_changed_elements == b.total_changed_elements &&
         a.num_changed_params == b.num_changed_params && (!encoding_matters || a.encoding == b.encoding);
}

bool SamePatch(const DecodedPatch& a, const DecodedPatch& b) {
  if (!SameInfo(a.info, b.info) || a.dense.size() != b.dense.size() || a.changes.size() != b.changes.size()) {
    return false;
  }
  for (size_t i = 0; i < a.dense.size(); ++i) {
    const TensorView& x = a.dense[i];
    const TensorView& y = b.dense[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape ||
        !std::equal(x.data.begin(), x.data.end(), y.data.begin(), y.data.end())) {
      return false;
    }
  }
  for (size_t i = 0; i < a.changes.size(); ++i) {
    const TensorChanges& x = a.changes[i];
    const TensorChanges& y = b.changes[i];
    if (x.name != y.name || x.dtype != y.dtype || x.indices != y.indices || x.values != y.values) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Result<SafetensorsFile> file = SafetensorsFile::Parse(Blob::FromVector({data, data + size}), "fuzz.safetensors");
  if (!file.ok()) return 0;
  Result<SafetensorsFile> copy = SafetensorsFile::Parse(Blob::FromVector({data, data + size}), "fuzz.safetensors");
  if (!copy.ok()) std::abort();
  Result<DecodedPatch> first = DecodePatch(std::move(*file));
  Result<DecodedPatch> kept = DecodePatch(std::move(*copy), DecodePatchOptions{.keep_gaps_encoded = true});
  if (first.ok() != kept.ok()) std::abort();
  if (!first.ok()) {
    if (first.status().message() != kept.status().message()) std::abort();
    return 0;
  }
  if (!kept->encoded.empty()) {
    DecodedPatch decoded;
    decoded.info = kept->info;
    decoded.changes = DecodeGapChanges(kept->encoded);
    if (!SamePatch(*first, decoded)) std::abort();
  } else if (!SamePatch(*first, *kept)) {
    std::abort();
  }

  Result<EncodedPatch> encoded = Reencode(*first);
  Result<EncodedPatch> again = Reencode(*first);
  if (!encoded.ok() || !again.ok()) std::abort();  // whatever decodes must re-encode
  std::vector<uint8_t> bytes = Flatten(*encoded);
  if (bytes != Flatten(*again)) std::abort();  // deterministic

  Result<SafetensorsFile> file2 = SafetensorsFile::Parse(Blob::FromVector(bytes), "fuzz-reencoded.safetensors");
  if (!file2.ok()) std::abort();
  Result<DecodedPatch> second = DecodePatch(std::move(*file2));
  if (!second.ok() || !SamePatch(*first, *second)) std::abort();
  return 0;
}
