// Fuzz target for the safetensors reader. Properties:
//  1. Parse never crashes, hangs or reads out of bounds on arbitrary bytes.
//  2. Whatever Parse accepts, the writer accepts too, and reading the
//     written bytes gives back the same tensors and metadata.
//  3. The writer is deterministic, and stable: writing the re-read file gives
//     the same bytes again.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "deltasync/safetensors.h"
#include "fuzz/fuzz_check.h"

namespace {

using deltasync::Blob;
using deltasync::SafetensorsFile;
using deltasync::TensorView;

using deltasync::fuzz::Check;

bool SameTensors(const std::vector<TensorView>& a, const std::vector<TensorView>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].dtype != b[i].dtype || a[i].shape != b[i].shape ||
        !std::equal(a[i].data.begin(), a[i].data.end(), b[i].data.begin(), b[i].data.end())) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = SafetensorsFile::Parse(Blob::FromVector(std::vector<uint8_t>(data, data + size)), "fuzz");
  if (!file.ok()) return 0;

  auto bytes = deltasync::SerializeSafetensors(file->metadata(), file->tensors());
  Check(bytes.ok(), "writer refuses a file the reader accepted");
  auto again = deltasync::SerializeSafetensors(file->metadata(), file->tensors());
  Check(again.ok() && *again == *bytes, "writer is not deterministic");

  auto reread = SafetensorsFile::Parse(Blob::FromVector(*bytes), "fuzz-reserialized");
  Check(reread.ok(), "reader refuses what the writer wrote");
  Check(reread->metadata() == file->metadata(), "metadata changed in a round trip");
  // The input's tensors are contiguous from offset 0, so laying them out back
  // to back in file order reproduces their offsets and hence their order.
  Check(SameTensors(reread->tensors(), file->tensors()), "tensors changed in a round trip");

  auto third = deltasync::SerializeSafetensors(reread->metadata(), reread->tensors());
  Check(third.ok() && *third == *bytes, "re-serializing the round trip changed the bytes");
  return 0;
}
