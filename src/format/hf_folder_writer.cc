// Writing a Hugging Face model folder (hf_folder.h): shards laid out as the
// index side file says (or re-sharded, or one file), a regenerated index, the
// side files; built in a hidden sibling directory and renamed into place.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "deltasync/hf_folder.h"
#include "deltasync/temp_file.h"

namespace deltasync {
namespace {

using Json = nlohmann::ordered_json;

std::string ErrnoText(int err) { return std::strerror(err); }

struct Shard {
  std::string file;
  std::vector<TensorView> tensors;
};

// tensors: sorted by name (a WeightState's order) or any order; shards keep it.
Result<std::vector<Shard>> PlanShards(std::span<const TensorView> tensors, std::span<const SideFile> side_files,
                                      uint64_t max_shard_bytes, bool* write_index) {
  std::vector<Shard> shards;
  const SideFile* index = nullptr;
  for (const SideFile& f : side_files) {
    if (f.name == kHfIndexFile) index = &f;
  }
  if (max_shard_bytes > 0) {
    uint64_t current = 0;
    for (const TensorView& t : tensors) {
      if (shards.empty() || (current > 0 && current + t.data.size() > max_shard_bytes)) {
        shards.emplace_back();
        current = 0;
      }
      shards.back().tensors.push_back(t);
      current += t.data.size();
    }
    if (shards.size() <= 1) {
      if (shards.empty()) shards.emplace_back();
      shards[0].file = kHfSingleFile;
      *write_index = false;
      return shards;
    }
    char name[64];
    for (size_t i = 0; i < shards.size(); ++i) {
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      shards[i].file = name;
    }
    *write_index = true;
    return shards;
  }
  if (index == nullptr) {
    shards.push_back(Shard{std::string(kHfSingleFile), {tensors.begin(), tensors.end()}});
    *write_index = false;
    return shards;
  }
  // The layout of the version's own index.
  std::map<std::string, std::string> place;
  try {
    Json doc = Json::parse(index->bytes.bytes().begin(), index->bytes.bytes().end());
    if (!doc.is_object() || !doc.contains("weight_map") || !doc["weight_map"].is_object()) {
      return Status::Corruption(std::string(kHfIndexFile) + " (side file): no \"weight_map\" object");
    }
    for (auto& [tensor, file] : doc["weight_map"].items()) {
      if (!file.is_string()) {
        return Status::Corruption(std::string(kHfIndexFile) + " (side file): weight_map[\"" + tensor +
                                  "\"] is not a file name");
      }
      std::string name = file.get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name.find('\\') != std::string::npos ||
          name == "." || name == ".." || !name.ends_with(".safetensors")) {
        return Status::Corruption(std::string(kHfIndexFile) + " (side file): weight_map[\"" + tensor + "\"] is \"" +
                                  name + "\", not a .safetensors file name");
      }
      place.emplace(tensor, std::move(name));
    }
  } catch (const std::exception& e) {
    return Status::Corruption(std::string(kHfIndexFile) + " (side file): not valid JSON: " + e.what());
  }
  std::map<std::string, size_t> by_file;
  for (const TensorView& t : tensors) {
    auto it = place.find(t.name);
    if (it == place.end()) {
      return Status::FailedPrecondition("the version's " + std::string(kHfIndexFile) + " does not place tensor '" +
                                        t.name + "'; pass --max-shard-size to shard the folder afresh");
    }
    auto [f, added] = by_file.emplace(it->second, shards.size());
    if (added) shards.push_back(Shard{it->second, {}});
    shards[f->second].tensors.push_back(t);
  }
  if (place.size() != tensors.size()) {
    std::set<std::string_view> held;
    for (const TensorView& t : tensors) held.insert(t.name);
    for (const auto& [tensor, file] : place) {
      if (!held.count(tensor)) {
        return Status::FailedPrecondition("the version's " + std::string(kHfIndexFile) + " places tensor '" + tensor +
                                          "' in " + file + ", but the version has no such tensor");
      }
    }
  }
  std::sort(shards.begin(), shards.end(), [](const Shard& a, const Shard& b) { return a.file < b.file; });
  *write_index = true;
  return shards;
}

std::string IndexJson(const std::vector<Shard>& shards) {
  uint64_t total = 0;
  std::map<std::string, std::string> weight_map;  // sorted, as transformers writes it
  for (const Shard& s : shards) {
    for (const TensorView& t : s.tensors) {
      total += t.data.size();
      weight_map.emplace(t.name, s.file);
    }
  }
  Json doc;
  doc["metadata"] = {{"total_size", total}};
  Json map = Json::object();
  for (const auto& [tensor, file] : weight_map) map[tensor] = file;
  doc["weight_map"] = std::move(map);
  return doc.dump(2) + "\n";
}

Status WriteFile(const std::string& path, ByteSpan bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IOError(path + ": cannot create: " + ErrnoText(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      return Status::IOError(path + ": write failed: " + ErrnoText(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) return Status::IOError(path + ": fsync failed: " + ErrnoText(errno));
  return Status::OK();
}

Status SyncDir(const std::string& dir) {
  if (int err = SyncDirectory(dir)) return Status::IOError(dir + ": fsync of the directory failed: " + ErrnoText(err));
  return Status::OK();
}

// What is at `dir` now.
enum class Existing { kNone, kEmptyDir, kNonEmptyDir, kOther };

Result<Existing> Inspect(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return Existing::kNone;
    return Status::IOError(dir + ": " + ErrnoText(errno));
  }
  if (!S_ISDIR(st.st_mode)) return Existing::kOther;
  std::error_code ec;
  bool empty = std::filesystem::is_empty(dir, ec);
  if (ec) return Status::IOError(dir + ": " + ec.message());
  return empty ? Existing::kEmptyDir : Existing::kNonEmptyDir;
}

Status Refuse(const std::string& dir, Existing existing) {
  if (existing == Existing::kOther) {
    return Status::FailedPrecondition(dir + " exists and is not a directory; remove it or choose another folder");
  }
  return Status::FailedPrecondition(dir + " exists and is not empty; pass --force to replace it");
}

}  // namespace

Status CheckHfFolderTarget(const std::string& dir, bool replace) {
  DS_ASSIGN_OR_RETURN(Existing existing, Inspect(dir));
  if (existing == Existing::kOther || (existing == Existing::kNonEmptyDir && !replace)) return Refuse(dir, existing);
  return Status::OK();
}

Status WriteHfFolder(const std::string& dir_in, std::span<const TensorView> tensors,
                     std::span<const SideFile> side_files, const HfWriteOptions& options) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.ends_with('/')) dir.pop_back();
  std::set<std::string> names;
  for (const SideFile& f : side_files) {
    DS_RETURN_IF_ERROR(ValidateSideFileName(f.name));
    if (!names.insert(f.name).second) return Status::InvalidArgument("side file " + f.name + " is given twice");
  }
  bool write_index = false;
  DS_ASSIGN_OR_RETURN(std::vector<Shard> shards, PlanShards(tensors, side_files, options.max_shard_bytes, &write_index));
  for (const Shard& s : shards) {
    if (names.count(s.file)) return Status::InvalidArgument("side file " + s.file + " has the name of a shard");
  }
  DS_RETURN_IF_ERROR(CheckHfFolderTarget(dir, options.replace));

  // The hidden sibling: same file system, so the final rename is atomic.
  std::filesystem::path target = std::filesystem::absolute(dir);
  std::filesystem::path parent = target.parent_path();
  std::error_code ec;
  std::filesystem::create_directories(parent, ec);
  if (ec) return Status::IOError(parent.string() + ": cannot create: " + ec.message());
  const std::string tmp = TempPathFor(target.string());
  if (::mkdir(tmp.c_str(), 0755) != 0) return Status::IOError(tmp + ": cannot create: " + ErrnoText(errno));
  auto cleanup = [&](const std::string& path) { std::filesystem::remove_all(path, ec); };

  Status written = [&]() -> Status {
    for (const Shard& s : shards) {
      DS_RETURN_IF_ERROR(WriteSafetensorsFile(tmp + "/" + s.file, CheckpointMetadata(options.model_version), s.tensors));
    }
    if (write_index) {
      std::string text = IndexJson(shards);
      DS_RETURN_IF_ERROR(WriteFile(tmp + "/" + std::string(kHfIndexFile),
                                   ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size())));
    }
    for (const SideFile& f : side_files) {
      if (f.name == kHfIndexFile) continue;  // regenerated above from the layout written
      DS_RETURN_IF_ERROR(WriteFile(tmp + "/" + f.name, f.bytes.bytes()));
    }
    return SyncDir(tmp);
  }();
  if (!written.ok()) {
    cleanup(tmp);
    return written.WithContext("writing the model folder " + dir);
  }

  // Looked at again: it may have changed while the folder was written.
  Result<Existing> now = Inspect(dir);
  if (!now.ok() || *now == Existing::kOther || (*now == Existing::kNonEmptyDir && !options.replace)) {
    cleanup(tmp);
    return now.ok() ? Refuse(dir, *now) : now.status();
  }
  const std::string target_path = target.string();
  if (*now == Existing::kNonEmptyDir) {
    // Swap both names in one step; the old folder then sits at `tmp`.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target_path.c_str(), RENAME_EXCHANGE) != 0) {
      int err = errno;
      cleanup(tmp);
      return Status::IOError(dir + ": cannot swap in the new folder (renameat2 RENAME_EXCHANGE): " + ErrnoText(err));
    }
    cleanup(tmp);
  } else if (::rename(tmp.c_str(), target_path.c_str()) != 0) {
    // rename() replaces an empty directory; anything else appeared meanwhile.
    int err = errno;
    cleanup(tmp);
    return Status::IOError(dir + ": cannot move the new folder into place: " + ErrnoText(err));
  }
  return SyncDir(parent.string());
}

}  // namespace deltasync
