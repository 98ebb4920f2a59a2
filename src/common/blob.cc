#include "deltasync/blob.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "common/mapping_guard.h"
#include "common/pages.h"  // AdviseHugePages, MovePages, GrowMapping

namespace deltasync {
namespace {

struct VectorImpl : Blob::Impl {
  explicit VectorImpl(std::vector<uint8_t> v) : storage(std::move(v)) { bytes = storage; }
  std::vector<uint8_t> storage;
};

// Hands a BlobBuffer's mapping back to its pool, or unmaps it when the pool
// is gone (or there was none).
void Release(const std::weak_ptr<BufferPool>& pool, void* addr, size_t len) {
  if (std::shared_ptr<BufferPool> p = pool.lock()) {
    p->Give({static_cast<uint8_t*>(addr), len});
  } else {
    ::munmap(addr, len);
  }
}

// A mapping of `len` bytes whose first `size` are the Blob's.
struct MmapImpl : Blob::Impl {
  MmapImpl(void* addr, size_t len, size_t size, std::weak_ptr<BufferPool> pool = {})
      : addr(addr), len(len), pool(std::move(pool)) {
    bytes = ByteSpan(static_cast<const uint8_t*>(addr), size);
  }
  ~MmapImpl() override { Release(pool, addr, len); }
  void* addr;
  size_t len;
  std::weak_ptr<BufferPool> pool;
};

// A file's read-only mapping, guarded against SIGBUS (common/mapping_guard.h).
struct FileMapImpl : Blob::Impl {
  FileMapImpl(void* addr, size_t len) : addr(addr), len(len), slot(GuardMapping(addr, len)) {
    bytes = ByteSpan(static_cast<const uint8_t*>(addr), len);
  }
  ~FileMapImpl() override {
    UnguardMapping(slot);
    ::munmap(addr, len);
  }
  bool cut() const override { return MappingCut(slot); }
  void* addr;
  size_t len;
  int slot;
};

constexpr size_t kPage = 4096;
constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUp(size_t n, size_t unit) { return (n + unit - 1) / unit * unit; }

// A fresh read-write anonymous mapping of `bytes` (a multiple of the page
// size); from 2 MiB on, 2 MiB-aligned and advised for huge pages. nullptr
// when out of memory.
uint8_t* MapFresh(size_t bytes) {
  if (bytes < kHugePage) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  void* raw = ::mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(start, kHugePage);
  if (aligned > start) ::munmap(raw, aligned - start);
  const uintptr_t tail = start + bytes + kHugePage - (aligned + bytes);
  if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  AdviseHugePages(reinterpret_cast<void*>(aligned), bytes);
  return reinterpret_cast<uint8_t*>(aligned);
}

std::string ErrnoText(int err) { return std::strerror(err); }

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { if (fd_ >= 0) ::close(fd_); }
  int get() const { return fd_; }
 private:
  int fd_;
};

}  // namespace

Blob Blob::FromVector(std::vector<uint8_t> bytes) {
  return Blob(std::make_shared<VectorImpl>(std::move(bytes)));
}

Blob Blob::FromBuffer(BlobBuffer&& buffer) {
  BlobBuffer taken = std::move(buffer);
  if (taken.size_ == 0) return FromVector({});
  // Room past the bytes (a reservation larger than the download) goes back,
  // unless the whole mapping is to return to a pool.
  const size_t keep = RoundUp(taken.size_, kPage);
  if (keep < taken.capacity_ && taken.pool_.expired()) {
    ::munmap(taken.data_ + keep, taken.capacity_ - keep);
    taken.capacity_ = keep;
  }
  Blob blob(std::make_shared<MmapImpl>(taken.data_, taken.capacity_, taken.size_, std::move(taken.pool_)));
  taken.data_ = nullptr;
  taken.size_ = taken.capacity_ = 0;
  return blob;
}

Result<Blob> Blob::MapFile(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    int err = errno;
    if (err == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::IOError(path + ": cannot open: " + ErrnoText(err));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::IOError(path + ": stat failed: " + ErrnoText(errno));
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(path + ": not a regular file");
  size_t len = static_cast<size_t>(st.st_size);
  if (len == 0) return FromVector({});
  void* addr = ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (addr == MAP_FAILED) return Status::IOError(path + ": mmap failed: " + ErrnoText(errno));
  return Blob(std::make_shared<FileMapImpl>(addr, len));
}

Result<Blob> Blob::ReadFile(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    int err = errno;
    if (err == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::IOError(path + ": cannot open: " + ErrnoText(err));
  }
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IOError(path + ": read failed: " + ErrnoText(errno));
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  return FromVector(std::move(out));
}

BlobBuffer::BlobBuffer(BlobBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      capacity_(std::exchange(other.capacity_, 0)),
      pool_(std::move(other.pool_)) {}

BlobBuffer& BlobBuffer::operator=(BlobBuffer&& other) noexcept {
  if (this != &other) {
    BlobBuffer old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
    pool_ = std::move(other.pool_);
  }
  return *this;
}

BlobBuffer::~BlobBuffer() {
  if (data_ != nullptr) Release(pool_, data_, capacity_);
}

// Growth moves the old pages into the new mapping (mremap: page tables move,
// bytes are not copied). From 2 MiB on, the new mapping is a fresh 2 MiB-
// aligned one (huge pages need the alignment) and the old pages are moved
// onto its start.
bool BlobBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_) return true;
  if (bytes > SIZE_MAX - kHugePage) return false;
  size_t grown = bytes >= kHugePage ? RoundUp(bytes, kHugePage) : RoundUp(bytes, kPage);
  uint8_t* p = nullptr;
  std::shared_ptr<BufferPool> pool = grown >= kHugePage ? pool_.lock() : nullptr;
  BufferPool::Mapping reused = pool ? pool->Take(grown) : BufferPool::Mapping{};
  if (reused.data != nullptr) {
    // Pages already faulted in. The old bytes move onto its start; the
    // pages they displace move out first and go back to the pool (they are
    // faulted in too: the next small buffer takes them).
    p = reused.data;
    if (data_ != nullptr) {
      // mremap to the same size does not move: the displaced pages are
      // moved onto a reserved range instead. Where pages are copied, not
      // moved (a ThreadSanitizer build, common/pages.h), their bytes are
      // copied into a fresh range, and the old bytes then over them.
      void* out = ::mmap(nullptr, capacity_, kPagesMoveByMremap ? PROT_NONE : PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (out != MAP_FAILED && !kPagesMoveByMremap) {
        std::memcpy(out, p, capacity_);
      } else if (out != MAP_FAILED &&
                 ::mremap(p, capacity_, capacity_, MREMAP_MAYMOVE | MREMAP_FIXED, out) == MAP_FAILED) {
        ::munmap(out, capacity_);
        out = MAP_FAILED;
      }
      if (out != MAP_FAILED) pool->Give({static_cast<uint8_t*>(out), capacity_});
      if (!MovePages(data_, capacity_, p)) {
        if (out != MAP_FAILED) {
          // The hole at p's start stays unmapped: give back only the rest.
          pool->Give({p + capacity_, reused.bytes - capacity_});
        } else {
          pool->Give(reused);
        }
        return false;
      }
    }
    grown = reused.bytes;
  } else if (data_ == nullptr || grown >= kHugePage) {
    p = MapFresh(grown);
    if (p == nullptr) return false;
    if (data_ != nullptr && !MovePages(data_, capacity_, p)) {
      ::munmap(p, grown);
      return false;
    }
  } else {
    void* moved = GrowMapping(data_, capacity_, grown);
    if (moved == nullptr) return false;
    p = static_cast<uint8_t*>(moved);
  }
  data_ = p;
  capacity_ = grown;
  return true;
}

bool BlobBuffer::Resize(size_t bytes) {
  if (!Reserve(bytes)) return false;
  size_ = bytes;
  return true;
}

bool BlobBuffer::Append(ByteSpan bytes) {
  if (bytes.empty()) return true;
  if (bytes.size() > capacity_ - size_ &&
      !Reserve(std::max({size_ + bytes.size(), capacity_ * 2, size_t{64} << 10}))) {
    return false;
  }
  std::memcpy(data_ + size_, bytes.data(), bytes.size());
  size_ += bytes.size();
  return true;
}

}  // namespace deltasync
