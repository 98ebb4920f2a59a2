#include "deltasync/blob.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace deltasync {
namespace {

struct VectorImpl : Blob::Impl {
  explicit VectorImpl(std::vector<uint8_t> v) : storage(std::move(v)) { bytes = storage; }
  std::vector<uint8_t> storage;
};

struct MmapImpl : Blob::Impl {
  MmapImpl(void* addr, size_t len) : addr(addr), len(len) {
    bytes = ByteSpan(static_cast<const uint8_t*>(addr), len);
  }
  ~MmapImpl() override { munmap(addr, len); }
  void* addr;
  size_t len;
};

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
  return Blob(std::make_shared<MmapImpl>(addr, len));
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

}  // namespace deltasync
