// SafetensorsFile over a file: opening (mapped, stamped), checking that it did
// not change under the read, and finding a tensor. Parsing is in
// safetensors_reader.cc.
#include "deltasync/safetensors.h"

namespace deltasync {

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  // Stamped before it is mapped: a file replaced in between reads as changed.
  Result<FileStamp> stamp = StampFile(path);
  DS_ASSIGN_OR_RETURN(Blob blob, Blob::MapFile(path));
  if (!stamp.ok()) return stamp.status();
  Result<SafetensorsFile> file = Parse(blob, path);
  if (file.ok()) {
    file->stamp_ = std::move(*stamp);
    return file;
  }
  // A header that reads as broken because the file changed under the parse.
  SafetensorsFile read;
  read.blob_ = std::move(blob);
  read.label_ = path;
  read.stamp_ = std::move(*stamp);
  Status changed = read.CheckUnchanged();
  return changed.ok() ? file : Result<SafetensorsFile>(changed);
}

Status SafetensorsFile::CheckUnchanged() const {
  std::string how = stamp_ ? FileChangeSince(*stamp_) : "";
  if (how.empty() && blob_.cut()) how = kCutWhileRead;
  if (how.empty()) return Status::OK();
  return Status::FailedPrecondition(label_ + " changed while it was read (" + how +
                                    "); what was read from it could mix two saves of it: read a checkpoint " +
                                    "once it is completely written (save each one to a new file, or wait for " +
                                    "the save to finish)");
}

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  // Linear: tensors_ is in offset order and the class has no room for an
  // index; files hold at most a few thousand tensors.
  for (const TensorView& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace deltasync
