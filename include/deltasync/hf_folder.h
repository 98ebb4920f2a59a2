// Hugging Face model folders: what `save_pretrained` writes and
// `from_pretrained` / vLLM load. Reading one to publish it (every weight file
// mapped, zero-copy, plus its small side files), and writing one from a
// state, atomically (docs/format.md, "Model folders").
//
// A folder's weights are `model.safetensors`, or the shards named by
// `model.safetensors.index.json` (its weight_map), or, with neither, every
// `*.safetensors` file in it. Its side files are the small non-weight files
// on the allow-list (IsSideFileName): config, generation config, tokenizer,
// chat template, remote code. Nothing else is read; weights in other formats
// (*.bin, *.pt, ...) and optimizer state never travel.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "deltasync/blob.h"
#include "deltasync/file_stamp.h"
#include "deltasync/safetensors.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"

namespace deltasync {

inline constexpr std::string_view kHfIndexFile = "model.safetensors.index.json";
inline constexpr std::string_view kHfSingleFile = "model.safetensors";
// A side file larger than this is refused (a tokenizer.json is a few MB).
inline constexpr uint64_t kMaxSideFileBytes = uint64_t{64} << 20;

// A small non-weight file of a model folder, by its plain file name.
struct SideFile {
  std::string name;
  Blob bytes;
};

// Whether a folder's file `name` travels as a side file: config.json,
// generation_config.json, tokenizer.json, tokenizer_config.json,
// special_tokens_map.json, added_tokens.json, vocab.json, vocab.txt,
// merges.txt, chat_template.json, preprocessor_config.json,
// processor_config.json, model.safetensors.index.json, and any *.jinja
// (chat templates), *.model (sentencepiece), *.tiktoken, *.py (remote code).
bool IsSideFileName(std::string_view name);

// OK when `name` may name a side file in a bucket and in a folder: a plain
// file name (1-255 bytes, no '/', '\\', NUL or control characters, not "."
// or ".."), not a weight file (*.safetensors, *.bin, *.pt, *.pth, *.ckpt,
// *.gguf). kInvalidArgument naming it otherwise.
Status ValidateSideFileName(std::string_view name);

// What a weight file (or the index) was when ReadHfFolder read it.
using HfFileStamp = FileStamp;

// A model folder, read for publishing.
struct HfFolder {
  std::string dir;
  std::vector<SafetensorsFile> shards;  // mapped, in file-name order
  // Every tensor of every shard: views into `shards` (valid while they live).
  std::vector<TensorView> tensors;
  std::vector<SideFile> side_files;     // sorted by name; the index among them
  std::vector<std::string> left_out;    // other entries, not carried (sorted)
  std::vector<HfFileStamp> stamps;      // the index, every shard and side file, each taken before it was read
};

// Reads the folder `dir`. With an index, its weight_map is checked against
// the shards: every listed tensor is in the named file, every tensor of a
// listed file is listed for that file, no tensor is in two files, and no
// *.safetensors file of the folder goes unlisted. kInvalidArgument (a folder
// that is not a model folder) or kCorruption (a broken index or shard)
// naming the file and the rule; kIOError for the file system.
Result<HfFolder> ReadHfFolder(const std::string& dir);

// OK when every weight file, side file and the index are still the files
// ReadHfFolder read (same inode, size and times) and no weight file was cut short while
// it was mapped (Blob::cut). kFailedPrecondition naming the first one
// replaced, rewritten, cut or removed since: a folder saved into while it is
// read would publish a version that mixes two checkpoints, so a publisher
// asks this after reading every tensor and before it commits. (A save that
// was already half done when the read began, every file written before the
// read, is not seen: a folder must be complete before it is published.)
Status CheckHfFolderUnchanged(const HfFolder& folder);

// For a checkpoint given as one FILE: kInvalidArgument, saying to pass the
// folder, when `path` is a sharded checkpoint's index (*.index.json) or one
// of the shards its folder's model.safetensors.index.json names. OK otherwise.
Status CheckCheckpointFile(const std::string& path);

// The __metadata__ of a plain checkpoint file as deltasync writes it:
// {"format": "pt"} (what transformers writes and checks) and "model_version"
// (what `deltasync apply` reads back).
Metadata CheckpointMetadata(uint64_t model_version);

struct HfWriteOptions {
  uint64_t model_version = 0;  // the "model_version" metadata of every shard
  // 0: the sharding of the side file model.safetensors.index.json when there
  // is one, else one model.safetensors. N: re-shard as transformers does
  // (tensors in name order, a new shard when the next would pass N bytes;
  // model-00001-of-0000K.safetensors, or one model.safetensors when K = 1).
  uint64_t max_shard_bytes = 0;
  // Replace an existing non-empty directory (swapped in atomically with
  // renameat2(RENAME_EXCHANGE), the old one then removed).
  bool replace = false;
};

// Writes a complete model folder at `dir`: the tensors as safetensors shards
// with CheckpointMetadata, a regenerated model.safetensors.index.json when
// there is more than one shard (or the side files held an index), and every
// other side file. Built in a hidden sibling directory, then renamed into
// place: a reader sees no folder or the whole folder. An existing empty
// directory is replaced; a non-empty one only with `replace`
// (kFailedPrecondition otherwise, naming --force). On error `dir` is
// untouched and the sibling removed.
Status WriteHfFolder(const std::string& dir, std::span<const TensorView> tensors,
                     std::span<const SideFile> side_files, const HfWriteOptions& options);

// WriteHfFolder's check of `dir` alone, to fail before a long download: OK
// when it is absent or an empty directory, or a directory and `replace`.
Status CheckHfFolderTarget(const std::string& dir, bool replace);

}  // namespace deltasync
