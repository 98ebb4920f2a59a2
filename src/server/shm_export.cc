// --shm writer. The region is sized once, from the first state (a bucket's
// tensor set never changes after its first version), and then every update
// goes through one seqlock write section:
//
//   seq = s + 1 (odd); release fence; write; seq = s + 2 (even, release)
//
// A reader copies between two reads of seq and keeps the copy only when both
// are the same even value (docs/shm.md), so it never keeps a torn state.
// What changed is found by comparing the new state with the region's own
// copy outside the write section (only this writer modifies the region, so
// reading it needs no lock); the section itself then costs O(changed
// elements), which keeps readers' retries rare.
#include "server/shm_export.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "common/clock.h"
#include "deltasync/shm.h"

namespace deltasync::server {
namespace {

using namespace shm_layout;
static_assert(std::endian::native == std::endian::little, "the --shm layout is little-endian");

size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }


std::string Errno() { return std::strerror(errno); }

// The seqlock write section.
class WriteSection {
 public:
  explicit WriteSection(uint8_t* base) : seq_(*reinterpret_cast<uint64_t*>(base + kOffSeq)) {
    start_ = seq_.load(std::memory_order_relaxed);
    seq_.store(start_ + 1, std::memory_order_relaxed);
    // Orders the odd value before every write of the section.
    std::atomic_thread_fence(std::memory_order_release);
  }
  ~WriteSection() { seq_.store(start_ + 2, std::memory_order_release); }

 private:
  std::atomic_ref<uint64_t> seq_;
  uint64_t start_ = 0;
};

// Appends to `out` the flat indices where `a` and `b` (elements of `width`
// bytes) differ, up to `room` of them; false when there were more.
bool DiffElements(const uint8_t* a, const uint8_t* b, size_t bytes, size_t width, uint64_t room,
                  std::vector<uint64_t>& out) {
  constexpr size_t kBlock = 256;  // memcmp whole blocks; most are equal
  for (size_t block = 0; block < bytes; block += kBlock) {
    size_t n = std::min(kBlock, bytes - block);
    if (std::memcmp(a + block, b + block, n) == 0) continue;
    for (size_t off = block; off < block + n; off += width) {
      if (std::memcmp(a + off, b + off, width) != 0) {
        if (out.size() >= room) return false;
        out.push_back(off / width);
      }
    }
  }
  return true;
}

}  // namespace

Result<std::string> NormalizeShmName(const std::string& name) {
  std::string bare = !name.empty() && name[0] == '/' ? name.substr(1) : name;
  bool ok = !bare.empty() && bare.size() <= 200 && bare != "." && bare != "..";
  for (char c : bare) {
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-');
  }
  if (!ok) {
    return Status::InvalidArgument("--shm '" + name + "': use 1-200 characters from A-Z a-z 0-9 . _ - (an optional leading '/')");
  }
  return "/" + bare;
}

Result<std::unique_ptr<ShmExport>> ShmExport::Create(const std::string& name) {
  DS_ASSIGN_OR_RETURN(std::string normalized, NormalizeShmName(name));
  // An object left by a live daemon of another process is not ours to take.
  int fd = ::shm_open(normalized.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd >= 0) {
    struct stat st {};
    if (::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= kHeaderBytes) {
      void* p = ::mmap(nullptr, kHeaderBytes, PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        const uint8_t* h = static_cast<const uint8_t*>(p);
        pid_t pid = static_cast<pid_t>(ShmGet64(h, kOffWriterPid));
        bool live = std::memcmp(h + kOffMagic, kMagic, 8) == 0 && !(ShmGet32(h, kOffFlags) & kFlagClosed) &&
                    pid > 0 && pid != ::getpid() && (::kill(pid, 0) == 0 || errno == EPERM);
        ::munmap(p, kHeaderBytes);
        if (live) {
          ::close(fd);
          return Status::FailedPrecondition("--shm " + normalized + " is in use by the daemon with process id " +
                                            std::to_string(pid));
        }
      }
    }
    ::close(fd);
  }
  if (::shm_unlink(normalized.c_str()) != 0 && errno != ENOENT) {
    return Status::IOError("--shm " + normalized + ": cannot remove the stale object: " + Errno());
  }
  return std::unique_ptr<ShmExport>(new ShmExport(std::move(normalized)));
}

ShmExport::~ShmExport() {
  if (!base_) return;
  {
    WriteSection section(base_);
    ShmPut32(base_, kOffFlags, ShmGet32(base_, kOffFlags) | kFlagClosed);
  }
  ::munmap(base_, size_);
  ::shm_unlink(name_.c_str());
}

Status ShmExport::CreateRegion(const WeightState& state) {
  const auto& tensors = state.tensors();
  size_t names_offset = kHeaderBytes + tensors.size() * kTableEntryBytes;
  size_t names_bytes = 0;
  for (const auto& t : tensors) {
    if (t.shape.size() > kMaxDims) {
      return Status::Unsupported("--shm: tensor '" + t.name + "' has " + std::to_string(t.shape.size()) +
                                 " dimensions; the region's table holds at most 8");
    }
    names_bytes += t.name.size() + 1;  // NUL-terminated, for C readers
  }
  size_t cursor = AlignUp(names_offset + names_bytes, 4096);
  const size_t data_offset = cursor;
  slots_.clear();
  for (size_t i = 0; i < tensors.size(); ++i) {
    cursor = AlignUp(cursor, 64);
    slots_.push_back(Slot{tensors[i].name, kHeaderBytes + i * kTableEntryBytes, cursor, tensors[i].data.size(),
                          DTypeSize(tensors[i].dtype)});
    cursor += tensors[i].data.size();
  }
  const size_t data_bytes = cursor - data_offset;
  changes_offset_ = AlignUp(cursor, 64);
  // Room for one changed element in eight (RL steps change a few percent);
  // beyond that an update is announced as "everything may have changed".
  changes_capacity_ = state.total_elements() / 8 + 4096;
  size_ = AlignUp(changes_offset_ + changes_capacity_ * 8, 4096);

  int fd = ::shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return Status::IOError("--shm " + name_ + ": cannot create: " + Errno());
  auto fail = [&](const std::string& what) {
    std::string message = "--shm " + name_ + ": " + what + ": " + Errno();
    ::close(fd);
    ::shm_unlink(name_.c_str());
    return Status::IOError(message);
  };
  if (::ftruncate(fd, static_cast<off_t>(size_)) != 0) return fail("cannot size to " + std::to_string(size_) + " bytes");
  // Reserve the pages now: a full /dev/shm is an error here instead of a
  // SIGBUS on some later write.
  if (int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size_)); rc != 0) {
    errno = rc;
    return fail("cannot reserve " + std::to_string(size_) + " bytes (is /dev/shm full?)");
  }
  void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("cannot map");
  ::close(fd);
  base_ = static_cast<uint8_t*>(p);

  // Everything but the magic; the magic goes last (see Export), so a reader
  // that opens the object early finds "not ready" instead of half a header.
  ShmPut32(base_, kOffLayoutVersion, kLayoutVersion);
  ShmPut32(base_, kOffHeaderBytes, kHeaderBytes);
  ShmPut64(base_, kOffRegionBytes, size_);
  ShmPut64(base_, kOffTensorCount, tensors.size());
  ShmPut64(base_, kOffTableOffset, kHeaderBytes);
  ShmPut64(base_, kOffTableEntryBytes, kTableEntryBytes);
  ShmPut64(base_, kOffNamesOffset, names_offset);
  ShmPut64(base_, kOffDataOffset, data_offset);
  ShmPut64(base_, kOffDataBytes, data_bytes);
  ShmPut64(base_, kOffChangesOffset, changes_offset_);
  ShmPut64(base_, kOffChangesCapacity, changes_capacity_);
  ShmPut64(base_, kOffWriterPid, static_cast<uint64_t>(::getpid()));
  size_t name_cursor = names_offset;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& t = tensors[i];
    uint8_t* e = base_ + slots_[i].entry_offset;
    ShmPut64(e, kEntNameOffset, name_cursor);
    ShmPut32(e, kEntNameBytes, static_cast<uint32_t>(t.name.size()));
    ShmPut32(e, kEntNdim, static_cast<uint32_t>(t.shape.size()));
    std::string_view dtype = DTypeName(t.dtype);
    std::memcpy(e + kEntDtype, dtype.data(), std::min<size_t>(dtype.size(), 8));
    ShmPut64(e, kEntDataOffset, slots_[i].data_offset);
    ShmPut64(e, kEntDataBytes, slots_[i].data_bytes);
    ShmPut64(e, kEntChangesOffset, changes_offset_);
    for (size_t d = 0; d < t.shape.size(); ++d) ShmPut64(e, kEntShape + 8 * d, t.shape[d]);
    std::memcpy(base_ + name_cursor, t.name.data(), t.name.size());
    name_cursor += t.name.size() + 1;
  }
  return Status::OK();
}

bool ShmExport::SameLayout(const WeightState& state) const {
  const auto& tensors = state.tensors();
  if (tensors.size() != slots_.size()) return false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name != slots_[i].name || tensors[i].data.size() != slots_[i].data_bytes ||
        DTypeSize(tensors[i].dtype) != slots_[i].width) {
      return false;
    }
  }
  return true;
}

Status ShmExport::Export(uint64_t version, const StateHash& hash, const WeightState& state,
                         const FileSet& /*files: the region holds weights only*/) {
  if (!base_) {
    DS_RETURN_IF_ERROR(CreateRegion(state));
    WriteVersion(version, hash, state, /*first=*/true);
    std::atomic_thread_fence(std::memory_order_release);
    std::memcpy(base_ + kOffMagic, kMagic, sizeof kMagic);
    return Status::OK();
  }
  if (!SameLayout(state)) {
    return Status::FailedPrecondition(Describe() + ": the tensor set changed since the region was created "
                                      "(restart the daemon to recreate it)");
  }
  WriteVersion(version, hash, state, /*first=*/false);
  return Status::OK();
}

void ShmExport::WriteVersion(uint64_t version, const StateHash& hash, const WeightState& state, bool first) {
  const auto& tensors = state.tensors();
  // Outside the write section: what differs from the region's copy.
  std::vector<std::vector<uint64_t>> changed(slots_.size());
  bool complete = !first;
  uint64_t listed = 0;
  for (size_t i = 0; i < slots_.size() && complete; ++i) {
    complete = DiffElements(tensors[i].data.data(), base_ + slots_[i].data_offset, slots_[i].data_bytes,
                            slots_[i].width, changes_capacity_ - listed, changed[i]);
    listed += changed[i].size();
  }

  WriteSection section(base_);
  uint64_t cursor = changes_offset_;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    uint8_t* entry = base_ + s.entry_offset;
    if (complete) {
      for (uint64_t idx : changed[i]) {
        std::memcpy(base_ + s.data_offset + idx * s.width, tensors[i].data.data() + idx * s.width, s.width);
      }
      if (!changed[i].empty()) std::memcpy(base_ + cursor, changed[i].data(), changed[i].size() * 8);
      ShmPut64(entry, kEntChangesOffset, cursor);
      ShmPut64(entry, kEntChangesCount, changed[i].size());
      cursor += changed[i].size() * 8;
    } else {
      if (s.data_bytes) std::memcpy(base_ + s.data_offset, tensors[i].data.data(), s.data_bytes);
      ShmPut64(entry, kEntChangesOffset, changes_offset_);
      ShmPut64(entry, kEntChangesCount, 0);
    }
  }
  ShmPut64(base_, kOffVersion, version);
  ShmPut64(base_, kOffStateHashHi, hash.hi);
  ShmPut64(base_, kOffStateHashLo, hash.lo);
  ShmPut64(base_, kOffBaseVersion, first ? 0 : version_);
  ShmPut32(base_, kOffChangesComplete, complete ? 1 : 0);
  ShmPut64(base_, kOffChangedElements, complete ? listed : 0);
  ShmPut64(base_, kOffUpdatedUnixMs, UnixMillis());
  version_ = version;
}

}  // namespace deltasync::server
