// Reading a Hugging Face model folder for publishing (hf_folder.h): the
// weight files (mapped, zero-copy), the index's weight_map checked against
// them, and the allow-listed side files.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "deltasync/hf_folder.h"

namespace deltasync {
namespace {

using Json = nlohmann::json;

bool EndsWith(std::string_view s, std::string_view suffix) { return s.ends_with(suffix); }

constexpr std::array<std::string_view, 12> kSideFileNames = {
    "config.json",       "generation_config.json", "tokenizer.json",     "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "vocab.json",       "vocab.txt",
    "merges.txt",        "chat_template.json",     "preprocessor_config.json", "processor_config.json"};
constexpr std::array<std::string_view, 4> kSideFileSuffixes = {".jinja", ".model", ".tiktoken", ".py"};
constexpr std::array<std::string_view, 6> kWeightSuffixes = {".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf"};

std::string ErrnoText(int err) { return std::strerror(err); }

std::string Join(const std::string& dir, std::string_view name) {
  return dir.ends_with('/') ? dir + std::string(name) : dir + "/" + std::string(name);
}

// The directory holding `path` ("." for a bare name).
std::string DirOf(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// name -> is a regular file (symlinks followed: a hub cache's snapshot
// folders are links to blobs). Sorted.
Result<std::map<std::string, bool>> ListDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Status::IOError(dir + ": cannot open the folder: " + ErrnoText(errno));
  std::map<std::string, bool> out;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    bool regular = ::stat(Join(dir, name).c_str(), &st) == 0 && S_ISREG(st.st_mode);
    out.emplace(std::move(name), regular);
  }
  ::closedir(d);
  return out;
}

// The index's weight_map: tensor name -> file name.
Result<std::map<std::string, std::string>> ReadWeightMap(const std::string& path, ByteSpan bytes) {
  try {
    Json doc = Json::parse(bytes.begin(), bytes.end());
    if (!doc.is_object() || !doc.contains("weight_map") || !doc["weight_map"].is_object()) {
      return Status::Corruption(path + ": not a safetensors index: no \"weight_map\" object");
    }
    std::map<std::string, std::string> map;
    for (auto& [tensor, file] : doc["weight_map"].items()) {
      if (!file.is_string()) {
        return Status::Corruption(path + ": weight_map[\"" + tensor + "\"] is not a file name");
      }
      std::string name = file.get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
          !EndsWith(name, ".safetensors")) {
        return Status::Corruption(path + ": weight_map[\"" + tensor + "\"] is \"" + name +
                                  "\", not a .safetensors file of this folder");
      }
      map.emplace(tensor, std::move(name));
    }
    return map;
  } catch (const std::exception& e) {
    return Status::Corruption(path + ": not valid JSON: " + e.what());
  }
}

Result<SideFile> ReadSideFile(const std::string& dir, const std::string& name) {
  const std::string path = Join(dir, name);
  struct stat st;
  // Checked before reading, so a huge file is not read to be refused.
  const uint64_t size = ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  DS_ASSIGN_OR_RETURN(Blob bytes, size > kMaxSideFileBytes ? Result<Blob>(Blob()) : Blob::ReadFile(path));
  if (size > kMaxSideFileBytes || bytes.size() > kMaxSideFileBytes) {
    return Status::InvalidArgument(path + " is " + std::to_string(std::max<uint64_t>(size, bytes.size())) + " bytes, over the " +
                                   std::to_string(kMaxSideFileBytes >> 20) +
                                   " MiB limit for a side file (config, tokenizer); remove it from the folder");
  }
  return SideFile{name, std::move(bytes)};
}

}  // namespace

bool IsSideFileName(std::string_view name) {
  if (std::find(kSideFileNames.begin(), kSideFileNames.end(), name) != kSideFileNames.end()) return true;
  if (name == kHfIndexFile) return true;
  for (std::string_view suffix : kSideFileSuffixes) {
    if (name.size() > suffix.size() && EndsWith(name, suffix)) return true;
  }
  return false;
}

Status ValidateSideFileName(std::string_view name) {
  auto bad = [&](const std::string& why) {
    std::string shown;
    for (char c : name.substr(0, 80)) shown += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
    return Status::InvalidArgument("side file name \"" + shown + "\": " + why);
  };
  if (name.empty() || name.size() > 255) return bad("must be 1 to 255 bytes");
  if (name == "." || name == "..") return bad("not a file name");
  for (char c : name) {
    if (c == '/' || c == '\\') return bad("must be a plain file name, without '/' or '\\'");
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return bad("has a control character");
  }
  for (std::string_view suffix : kWeightSuffixes) {
    if (EndsWith(name, suffix)) return bad("is a weight file, which never travels as a side file");
  }
  return Status::OK();
}

Result<HfFolder> ReadHfFolder(const std::string& dir_in) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.ends_with('/')) dir.pop_back();
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    DS_RETURN_IF_ERROR(CheckCheckpointFile(dir));
    return Status::InvalidArgument(dir + " is a file, not a model folder; pass the folder that holds it");
  }
  DS_ASSIGN_OR_RETURN(auto entries, ListDir(dir));
  HfFolder folder;
  folder.dir = dir;

  std::vector<std::string> weight_files;  // every regular *.safetensors, sorted
  for (const auto& [name, regular] : entries) {
    if (regular && EndsWith(name, ".safetensors")) weight_files.push_back(name);
  }
  auto index_it = entries.find(std::string(kHfIndexFile));
  const bool indexed = index_it != entries.end() && index_it->second;
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> shard_names;
  const std::string index_path = Join(dir, kHfIndexFile);
  if (indexed) {
    DS_ASSIGN_OR_RETURN(HfFileStamp stamp, StampFile(index_path));
    folder.stamps.push_back(std::move(stamp));
    DS_ASSIGN_OR_RETURN(Blob index, Blob::ReadFile(index_path));
    DS_ASSIGN_OR_RETURN(weight_map, ReadWeightMap(index_path, index.bytes()));
    std::set<std::string> named;
    for (const auto& [tensor, file] : weight_map) named.insert(file);
    for (const std::string& file : named) {
      auto it = entries.find(file);
      if (it == entries.end() || !it->second) {
        return Status::InvalidArgument(index_path + " names " + file + ", which is not a file in " + dir);
      }
    }
    for (const std::string& file : weight_files) {
      if (!named.count(file)) {
        return Status::InvalidArgument(Join(dir, file) + " is a .safetensors file that " +
                                       std::string(kHfIndexFile) +
                                       " does not name; deltasync does not skip weights: remove the file from " +
                                       dir + " or list its tensors in the index's weight_map");
      }
    }
    shard_names.assign(named.begin(), named.end());
  } else {
    shard_names = weight_files;
  }
  if (shard_names.empty()) {
    return Status::InvalidArgument(dir + " is not a model folder: it has no " + std::string(kHfSingleFile) + ", no " +
                                   std::string(kHfIndexFile) + " and no other *.safetensors file");
  }

  std::map<std::string, std::string> holder;  // tensor -> the file holding it
  for (const std::string& name : shard_names) {
    // Stamped before it is opened: a file replaced in between reads as changed.
    DS_ASSIGN_OR_RETURN(HfFileStamp stamp, StampFile(Join(dir, name)));
    folder.stamps.push_back(std::move(stamp));
    DS_ASSIGN_OR_RETURN(SafetensorsFile shard, SafetensorsFile::Open(Join(dir, name)));
    for (const TensorView& t : shard.tensors()) {
      auto [it, inserted] = holder.emplace(t.name, name);
      if (!inserted) {
        return Status::InvalidArgument("tensor '" + t.name + "' is in both " + Join(dir, it->second) + " and " +
                                       Join(dir, name) + "; a model folder holds each tensor once");
      }
      if (indexed) {
        auto listed = weight_map.find(t.name);
        if (listed == weight_map.end()) {
          return Status::InvalidArgument("tensor '" + t.name + "' of " + Join(dir, name) + " is not in " +
                                         index_path + "'s weight_map");
        }
        if (listed->second != name) {
          return Status::InvalidArgument("tensor '" + t.name + "' is in " + Join(dir, name) + " but " + index_path +
                                         " places it in " + listed->second);
        }
      }
    }
    folder.shards.push_back(std::move(shard));
  }
  for (const auto& [tensor, file] : weight_map) {
    if (!holder.count(tensor)) {
      return Status::InvalidArgument(index_path + " places tensor '" + tensor + "' in " + file + ", but " +
                                     Join(dir, file) + " does not hold it");
    }
  }
  size_t count = 0;
  for (const SafetensorsFile& shard : folder.shards) count += shard.tensors().size();
  folder.tensors.reserve(count);
  for (const SafetensorsFile& shard : folder.shards) {
    folder.tensors.insert(folder.tensors.end(), shard.tensors().begin(), shard.tensors().end());
  }

  for (const auto& [name, regular] : entries) {
    if (regular && EndsWith(name, ".safetensors")) continue;  // a shard, read above
    if (regular && IsSideFileName(name) && ValidateSideFileName(name).ok()) {
      // Stamped before it is read, like a shard: a save writing config.json
      // or a tokenizer file meanwhile would publish it torn.
      DS_ASSIGN_OR_RETURN(HfFileStamp stamp, StampFile(Join(dir, name)));
      folder.stamps.push_back(std::move(stamp));
      DS_ASSIGN_OR_RETURN(SideFile file, ReadSideFile(dir, name));
      folder.side_files.push_back(std::move(file));
    } else {
      folder.left_out.push_back(name);
    }
  }
  return folder;
}

Status CheckHfFolderUnchanged(const HfFolder& folder) {
  for (const HfFileStamp& was : folder.stamps) {
    std::string how = FileChangeSince(was);
    for (const SafetensorsFile& shard : folder.shards) {
      if (how.empty() && shard.label() == was.path && shard.blob().cut()) how = kCutWhileRead;
    }
    if (how.empty()) continue;
    return Status::FailedPrecondition(was.path + " changed while the folder was read (" + how +
                                      "); a version read from it could mix two checkpoints: publish the folder " +
                                      "once it is completely written (save each checkpoint to its own folder, or " +
                                      "wait for the save to finish)");
  }
  return Status::OK();
}

Status CheckCheckpointFile(const std::string& path) {
  std::string name = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  if (EndsWith(name, ".index.json")) {
    return Status::InvalidArgument(path + " is the index of a sharded checkpoint, not a weight file; pass the folder " +
                                   DirOf(path) + " to publish every shard it names");
  }
  const std::string index_path = Join(DirOf(path), kHfIndexFile);
  Result<Blob> index = Blob::ReadFile(index_path);
  if (!index.ok()) return Status::OK();  // no index beside it: a checkpoint of its own
  Result<std::map<std::string, std::string>> map = ReadWeightMap(index_path, index->bytes());
  if (!map.ok()) return map.status().WithContext(path + " has a sharded checkpoint's index beside it");
  for (const auto& [tensor, file] : *map) {
    if (file == name) {
      return Status::InvalidArgument(path + " is one shard of the sharded checkpoint in " + DirOf(path) + " (" +
                                     std::string(kHfIndexFile) +
                                     " names it); publishing it alone would publish part of the model: pass the folder " +
                                     DirOf(path));
    }
  }
  return Status::OK();
}

Metadata CheckpointMetadata(uint64_t model_version) {
  return Metadata{{"format", "pt"}, {"model_version", std::to_string(model_version)}};
}

}  // namespace deltasync
