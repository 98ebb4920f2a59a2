#include "deltasync/file_stamp.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace deltasync {

Result<FileStamp> StampFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::IOError(path + ": " + std::strerror(errno));
  return FileStamp{path,
                   static_cast<uint64_t>(st.st_dev),
                   static_cast<uint64_t>(st.st_ino),
                   static_cast<uint64_t>(st.st_size),
                   int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec,
                   int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec};
}

std::string FileChangeSince(const FileStamp& was) {
  Result<FileStamp> now = StampFile(was.path);
  if (!now.ok()) return "it is gone: " + now.status().message();
  if (now->device != was.device || now->inode != was.inode) return "another file now has its name";
  if (now->size != was.size) {
    return "its size went from " + std::to_string(was.size) + " to " + std::to_string(now->size) + " bytes";
  }
  if (*now != was) return "it was written to";
  return "";
}

}  // namespace deltasync
