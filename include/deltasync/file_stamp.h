// What a file was when deltasync read it, to tell later whether it changed
// underneath the read (a checkpoint saved into while it is published).
#pragma once

#include <cstdint>
#include <string>

#include "deltasync/status.h"

namespace deltasync {

// The file (device, inode) at `path` and its size and times (ctime changes
// with every write and cannot be set back). Times have the file system's
// granularity: a write in the same clock tick as the stamp may not move
// them, so a file already being written when it was stamped can go unseen.
struct FileStamp {
  std::string path;
  uint64_t device = 0, inode = 0, size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  friend bool operator==(const FileStamp&, const FileStamp&) = default;
};

// stat(path). kIOError naming `path`.
Result<FileStamp> StampFile(const std::string& path);

// How the file at was.path differs now from `was`: empty when it is still
// that file, unchanged; else "it is gone: ...", "another file now has its
// name", "its size went from A to B bytes" or "it was written to".
std::string FileChangeSince(const FileStamp& was);

// The change of a mapped file that was cut short while it was read
// (Blob::cut), in FileChangeSince's words.
inline constexpr const char* kCutWhileRead = "part of it could not be read while it was read (cut short by a writer, or an I/O error of its storage); those bytes read as zeros";

}  // namespace deltasync
