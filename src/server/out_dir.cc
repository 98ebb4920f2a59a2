// --out: the state as a TRL anchor file per version. LocalStore gives the
// atomic write (temporary name that List never shows, fsync, rename, fsync of
// the directory), so an engine that lists the directory or reads latest.json
// never finds a partial file, even after the daemon is killed mid-write.
#include "server/out_dir.h"

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>

#include "deltasync/hf_folder.h"
#include "deltasync/manifest.h"
#include "deltasync/patch.h"

namespace deltasync::server {
namespace {

constexpr std::string_view kPrefix = "step_";
constexpr std::string_view kSuffix = ".safetensors";
constexpr std::string_view kLatestKey = "latest.json";

// The version in "step_000012.safetensors"; nullopt for any other name, so
// that files the daemon did not write are never deleted.
std::optional<uint64_t> VersionOf(std::string_view key) {
  if (key.size() <= kPrefix.size() + kSuffix.size() || key.substr(0, kPrefix.size()) != kPrefix ||
      key.substr(key.size() - kSuffix.size()) != kSuffix) {
    return std::nullopt;
  }
  std::string_view digits = key.substr(kPrefix.size(), key.size() - kPrefix.size() - kSuffix.size());
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return v;
}

}  // namespace

std::string OutDirSink::FileName(uint64_t version) {
  // The bucket's own naming (anchors/step_000012.safetensors) without the folder.
  std::string key = AnchorKey(version);
  return key.substr(key.rfind('/') + 1);
}

Result<std::unique_ptr<OutDirSink>> OutDirSink::Open(const std::string& dir, int keep) {
  if (keep < 1) return Status::InvalidArgument("--keep must be at least 1, got " + std::to_string(keep));
  Result<std::unique_ptr<LocalStore>> store = LocalStore::Open(dir, /*create=*/true);
  if (!store.ok()) return store.status().WithContext("--out " + dir);
  return std::unique_ptr<OutDirSink>(new OutDirSink(std::shared_ptr<LocalStore>(std::move(*store)), dir, keep));
}

Status OutDirSink::Export(uint64_t version, const StateHash& hash, const WeightState& state) {
  std::vector<TensorView> views = state.views();
  // A plain checkpoint (format "pt", which transformers requires), not a patch.
  Result<std::vector<uint8_t>> header = EncodeSafetensorsHeader(CheckpointMetadata(version), views);
  if (!header.ok()) return header.status().WithContext(Describe());
  std::vector<ByteSpan> parts{ByteSpan(*header)};
  uint64_t size = header->size();
  for (const TensorView& t : views) {
    parts.push_back(t.data);
    size += t.data.size();
  }
  const std::string file = FileName(version);
  DS_RETURN_IF_ERROR(store_->Put(file, parts).WithContext(Describe()));

  // latest.json last: once it names a file, the file is complete.
  nlohmann::json latest = {{"version", version},
                           {"file", file},
                           {"state_hash", hash.Hex()},
                           {"size", size}};
  std::string text = latest.dump() + "\n";
  DS_RETURN_IF_ERROR(store_
                         ->Put(kLatestKey, ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()))
                         .WithContext(Describe()));
  return Prune(version);
}

Status OutDirSink::Prune(uint64_t newest) {
  DS_ASSIGN_OR_RETURN(std::vector<std::string> keys, store_->List(kPrefix));
  std::vector<std::pair<uint64_t, std::string>> files;
  for (const std::string& key : keys) {
    std::optional<uint64_t> v = VersionOf(key);
    // A file from a newer version than the one held (left by an earlier run
    // on another bucket) is stale too; the held one always stays.
    if (v && *v != newest) files.emplace_back(*v > newest ? 0 : *v, key);
  }
  std::sort(files.begin(), files.end(), std::greater<>());
  // The held file counts as one of the `keep`.
  for (size_t i = static_cast<size_t>(keep_ - 1); i < files.size(); ++i) {
    DS_RETURN_IF_ERROR(store_->Delete(files[i].second).WithContext(Describe()));
  }
  return Status::OK();
}

}  // namespace deltasync::server
