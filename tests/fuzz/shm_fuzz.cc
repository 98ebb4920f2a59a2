// Fuzz target for the --shm region reader (src/server/shm_reader.cc): the
// region belongs to another process, which may have written anything there.
// Properties, per input:
//   1. a region holding arbitrary bytes never crashes, hangs or reads outside
//      the mapping in ShmReader::Open / Read;
//   2. a region that opens gives tensors whose data sizes are exactly their
//      shapes' element counts times the dtype size, all within the region,
//      and change lists within the region;
//   3. a region the real writer (ShmExport) wrote from tensors cut out of the
//      input reads back as those tensors, with the version and state hash.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "deltasync/shm.h"
#include "deltasync/state_hash.h"
#include "deltasync/weight_state.h"
#include "fuzz/fuzz_check.h"
#include "server/shm_export.h"

namespace {

using namespace deltasync;

using deltasync::fuzz::Check;

const std::string& Name() {
  static const std::string name = "/deltasync-fuzz-" + std::to_string(::getpid());
  return name;
}

// The region a foreign writer left: exactly the input's bytes.
bool WriteRegion(const uint8_t* data, size_t size) {
  int fd = ::shm_open(Name().c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return false;
  bool ok = ::ftruncate(fd, static_cast<off_t>(size)) == 0;
  for (size_t done = 0; ok && done < size;) {
    ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    ok = n > 0;
    done += ok ? static_cast<size_t>(n) : 0;
  }
  ::close(fd);
  return ok;
}

void ReadForeign(const uint8_t* data, size_t size) {
  Check(WriteRegion(data, size), "cannot create the region");
  Result<std::unique_ptr<ShmReader>> reader = ShmReader::Open(Name());
  ::shm_unlink(Name().c_str());
  if (!reader.ok()) return;
  Result<ShmSnapshot> snap = (*reader)->Read(0);
  if (!snap.ok()) return;
  for (const ShmTensor& t : snap->tensors) {
    std::optional<uint64_t> elements = CheckedElementCount(t.shape);
    Check(elements && *elements * DTypeSize(t.dtype) == t.data.size(), "a tensor's bytes disagree with its shape");
    Check(t.data.size() <= size && t.name.size() <= size && t.changed.size() <= size / 8,
          "a tensor is larger than the region");
  }
}

// Tensors cut out of the input: a BF16 vector of its first half, an F32
// vector of what is left in whole elements, named by its first bytes.
void WriteAndReadBack(const uint8_t* data, size_t size) {
  const size_t half = size / 2 / 2 * 2;
  std::vector<uint8_t> a(data, data + half), b(data + half, data + half + (size - half) / 4 * 4);
  std::vector<TensorView> views;
  views.push_back({"a", DType::kBF16, {a.size() / 2}, a});
  views.push_back({"b.weight", DType::kF32, {b.size() / 4}, b});
  Result<WeightState> state = WeightState::FromViews(views);
  Check(state.ok(), "the writer's state cannot be built");
  const StateHash hash = HashState(*state, 1);
  Result<std::unique_ptr<server::ShmExport>> writer = server::ShmExport::Create(Name());
  Check(writer.ok(), "cannot create the writer");
  const uint64_t version = size + 1;
  Check((*writer)->Export(version, hash, *state, {}).ok(), "the writer failed");
  Result<std::unique_ptr<ShmReader>> reader = ShmReader::Open(Name());
  Check(reader.ok(), "the writer's region does not open");
  Result<ShmSnapshot> snap = (*reader)->Read(1);
  Check(snap.ok() && snap->version == version && snap->state_hash == hash, "the writer's version is misread");
  Check(snap->tensors.size() == state->tensors().size(), "the writer's tensors are misread");
  for (size_t i = 0; i < snap->tensors.size(); ++i) {
    const WeightState::Tensor& want = state->tensors()[i];
    const ShmTensor& got = snap->tensors[i];
    Check(got.name == want.name && got.dtype == want.dtype && got.shape == want.shape &&
              std::equal(got.data.begin(), got.data.end(), want.data.begin(), want.data.end()),
          "a tensor of the writer's region reads back different");
  }
  writer->reset();  // unlinks the name
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ReadForeign(data, size);
  WriteAndReadBack(data, size);
  return 0;
}
