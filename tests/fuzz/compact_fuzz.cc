// Fuzz target for the compact decoders. Properties, per input:
//   1. arbitrary bytes never crash SafetensorsFile::Parse + DecodeCompactDelta
//      (against a small fixed base) or DecodeCompressedAnchor;
//   2. a delta that decodes (stream version 2 or 3, container 1 or 2) is
//      valid for the base (ValidateChanges), and re-encodes in both versions
//      and both containers to patches that decode to the same changes;
//   3. an anchor that decodes re-encodes and decodes to the same tensors;
//   4. the fused ApplyCompactDelta on a copy of the base succeeds exactly
//      when the decoder does, then leaves the copy as ApplyChanges would
//      with the same hash change, else leaves it bit-identical to the base;
//      and its undo log restores the base.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "deltasync/blob.h"
#include "deltasync/compact.h"
#include "deltasync/patch.h"
#include "deltasync/safetensors.h"
#include "fuzz/compact_fuzz_base.h"

namespace {

using namespace deltasync;

std::vector<uint8_t> Flatten(const EncodedPatch& e) {
  std::vector<uint8_t> out;
  for (ByteSpan part : e.parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const testing::CompactFuzzBase* base = new testing::CompactFuzzBase();
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
  {
    Result<WeightState> copy = WeightState::FromViews(base->state.views());
    if (!copy.ok()) std::abort();
    CompactUndo undo;
    Result<CompactDelta> fused = ApplyCompactDelta(*file, *copy, base->hash, 2, undo);
    if (fused.ok() != d.ok()) std::abort();
    auto same = [&](const WeightState& a, const WeightState& b) {
      for (size_t i = 0; i < a.tensors().size(); ++i) {
        if (a.tensors()[i].data != b.tensors()[i].data) return false;
      }
      return true;
    };
    if (!fused.ok()) {
      if (!same(*copy, base->state)) std::abort();
    } else {
      Result<WeightState> want = WeightState::FromViews(base->state.views());
      if (!want.ok()) std::abort();
      ApplyChanges(*want, d->changes, 1);
      if (!same(*copy, *want) || !(fused->hash_delta == d->hash_delta)) std::abort();
      undo.Restore(1);
      if (!same(*copy, base->state)) std::abort();
    }
  }
  if (!d.ok()) return 0;
  if (!ValidateChanges(base->state, d->changes).ok()) std::abort();
  // Both stream versions (2 and 3) in both containers re-encode it to the
  // same changes.
  for (int k = 0; k < 4; ++k) {
    const int version = 2 + k % 2, container = 1 + k / 2;
    Result<EncodedPatch> e = EncodeCompactDelta(d->info, base->hash, base->state, d->changes, 1, version, container);
    if (!e.ok()) std::abort();
    Result<SafetensorsFile> f2 = SafetensorsFile::Parse(Blob::FromVector(Flatten(*e)), "re.safetensors");
    if (!f2.ok()) std::abort();
    Result<CompactDelta> d2 = DecodeCompactDelta(*f2, base->state, base->hash, 1);
    if (!d2.ok() || d2->changes.size() != d->changes.size()) std::abort();
    for (size_t i = 0; i < d->changes.size(); ++i) {
      if (d->changes[i].indices != d2->changes[i].indices || d->changes[i].values != d2->changes[i].values) std::abort();
    }
  }
  return 0;
}
