// Fuzz target for the compact decoders. Properties, per input:
//   1. arbitrary bytes never crash SafetensorsFile::Parse + DecodeCompactDelta
//      (against a small fixed base) or DecodeCompressedAnchor;
//   2. a delta that decodes is valid for the base (ValidateChanges), and
//      re-encodes to a patch that decodes to the same changes;
//   3. an anchor that decodes re-encodes and decodes to the same tensors.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "deltasync/blob.h"
#include "deltasync/compact.h"
#include "deltasync/safetensors.h"

namespace {

using namespace deltasync;

struct FixedBase {
  std::vector<uint8_t> a, f;
  WeightState state;
  StateHash hash;
  FixedBase() : a(2 * 64), f(4 * 8) {
    for (size_t k = 0; k < 64; ++k) {
      const uint16_t v = static_cast<uint16_t>(0x3C00 + k * 37 + (k % 3 ? 0x8000 : 0) + (k == 5 ? 0x4000 : 0));
      std::memcpy(a.data() + 2 * k, &v, 2);
    }
    for (size_t k = 0; k < f.size(); ++k) f[k] = static_cast<uint8_t>(k * 11);
    std::vector<TensorView> v{{"a", DType::kBF16, {8, 8}, a}, {"f", DType::kF32, {8}, f}};
    state = std::move(WeightState::FromViews(v)).value();
    hash = HashState(state, 1);
  }
};

std::vector<uint8_t> Flatten(const EncodedPatch& e) {
  std::vector<uint8_t> out;
  for (ByteSpan part : e.parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const FixedBase* base = new FixedBase();
  Result<SafetensorsFile> file = SafetensorsFile::Parse(Blob::FromVector({data, data + size}), "fuzz.safetensors");
  if (!file.ok()) return 0;
  if (IsCompressedAnchor(*file)) {
    Result<DecodedAnchor> a = DecodeCompressedAnchor(*file, 1);
    if (!a.ok()) return 0;
    std::vector<TensorView> views = a->views();
    Result<EncodedPatch> e = EncodeCompressedAnchor(a->model_version, views, 1);
    if (!e.ok()) std::abort();
    Result<SafetensorsFile> f2 = SafetensorsFile::Parse(Blob::FromVector(Flatten(*e)), "re.safetensors");
    if (!f2.ok()) std::abort();
    Result<DecodedAnchor> b = DecodeCompressedAnchor(*f2, 1);
    if (!b.ok() || b->tensors.size() != a->tensors.size()) std::abort();
    for (size_t i = 0; i < a->tensors.size(); ++i) {
      if (a->tensors[i].data != b->tensors[i].data || a->tensors[i].shape != b->tensors[i].shape) std::abort();
    }
    return 0;
  }
  Result<CompactDelta> d = DecodeCompactDelta(*file, base->state, base->hash, 1);
  if (!d.ok()) return 0;
  if (!ValidateChanges(base->state, d->changes).ok()) std::abort();
  Result<EncodedPatch> e = EncodeCompactDelta(d->info, base->hash, base->state, d->changes, 1);
  if (!e.ok()) std::abort();
  Result<SafetensorsFile> f2 = SafetensorsFile::Parse(Blob::FromVector(Flatten(*e)), "re.safetensors");
  if (!f2.ok()) std::abort();
  Result<CompactDelta> d2 = DecodeCompactDelta(*f2, base->state, base->hash, 1);
  if (!d2.ok() || d2->changes.size() != d->changes.size()) std::abort();
  for (size_t i = 0; i < d->changes.size(); ++i) {
    if (d->changes[i].indices != d2->changes[i].indices || d->changes[i].values != d2->changes[i].values) std::abort();
  }
  return 0;
}
