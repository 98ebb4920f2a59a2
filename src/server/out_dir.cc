// --out: every held version on disk. Nothing is ever visible half-written:
// a folder is built in a hidden sibling and renamed into place
// (WriteHfFolder), a file goes through LocalStore (temporary name, fsync,
// rename), and the latest link and latest.json are switched by rename only
// after the version is complete, so an engine that follows DIR/latest or
// reads latest.json never finds a partial version, even after the daemon is
// killed mid-write.
#include "server/out_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "deltasync/manifest.h"
#include "deltasync/patch.h"
#include "deltasync/side_files.h"
#include "deltasync/temp_file.h"

namespace deltasync::server {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kPrefix = "step_";
constexpr std::string_view kSuffix = ".safetensors";
constexpr std::string_view kLatestKey = "latest.json";
constexpr std::string_view kLatestLink = "latest";

// The version in "step_000012" + `suffix`; nullopt for any other name, so
// that entries the daemon did not write are never deleted.
std::optional<uint64_t> VersionOf(std::string_view name, std::string_view suffix) {
  if (name.size() <= kPrefix.size() + suffix.size() || !name.starts_with(kPrefix) || !name.ends_with(suffix)) {
    return std::nullopt;
  }
  std::string_view digits = name.substr(kPrefix.size(), name.size() - kPrefix.size() - suffix.size());
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return v;
}

std::string ErrnoText(int err) { return std::strerror(err); }

Status SyncDir(const std::string& dir) {
  if (int err = SyncDirectory(dir)) return Status::IOError(dir + ": fsync of the directory failed: " + ErrnoText(err));
  return Status::OK();
}

// OK when DIR/latest is absent or a symlink (the daemon's own).
Status CheckLatestLink(const std::string& dir) {
  const std::string link = dir + "/" + std::string(kLatestLink);
  struct stat st;
  if (::lstat(link.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::OK();
    return Status::IOError(link + ": " + ErrnoText(errno));
  }
  if (S_ISLNK(st.st_mode)) return Status::OK();
  return Status::FailedPrecondition(link + " exists and is not a symlink; the daemon keeps " + link +
                                    " as a link to the newest version's folder: move it away, or pass "
                                    "--out-layout file");
}

// Leftovers of a daemon killed mid-write whose process is gone (on this
// host): temporary files and links (TempPathFor: "step_000012.safetensors",
// "latest.json", the "latest" link), a folder being built (WriteHfFolder) or
// pruned, all named ".tmp-HOST-PID-HEX-NAME" (or ".tmp\NAME.PID.HEX" by
// older releases), and older releases' folder siblings
// (".step_000012.tmp-PID-RAND"). Only names the daemon writes are looked at.
void RemoveStaleLeftovers(const std::string& dir) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::optional<TempNameInfo> info = ParseTempName(name);
    if (info) {
      if (!info->base.starts_with(kPrefix) && !info->base.starts_with(kLatestLink)) continue;
    } else if (name.starts_with(".") && name.substr(1).starts_with(kPrefix) &&
               name.find(".tmp-") != std::string::npos) {
      std::string_view rest = std::string_view(name).substr(name.find(".tmp-") + 5);
      std::string_view digits = rest.substr(0, rest.find('-'));
      long pid = 0;
      auto [end, perr] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
      if (perr != std::errc() || end != digits.data() + digits.size() || pid <= 0 || !e.is_directory(ec)) continue;
      info = TempNameInfo{.host = "", .pid = pid, .base = "", .legacy = true};
    } else {
      continue;
    }
    if (TempNameIsFromThisHost(*info) && !TempWriterRunsHere(*info)) fs::remove_all(e.path(), ec);
  }
}

// An exclusive flock on DIR itself: one daemon per --out DIR.
Result<int> LockOutDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::IOError("--out " + dir + ": cannot open: " + ErrnoText(errno));
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) {
      return Status::FailedPrecondition(
          "--out " + dir + " is in use by another running daemon (it holds the directory's lock): two daemons on " +
          "one --out replace each other's folders, and one behind points latest at an older version; give each " +
          "daemon its own --out directory");
    }
    return Status::IOError("--out " + dir + ": cannot lock: " + ErrnoText(err));
  }
  return fd;
}

}  // namespace

OutDirSink::~OutDirSink() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

std::string OutDirSink::FileName(uint64_t version) {
  // The bucket's own naming (anchors/step_000012.safetensors) without the folder.
  std::string key = AnchorKey(version);
  return key.substr(key.rfind('/') + 1);
}

std::string OutDirSink::FolderName(uint64_t version) {
  std::string file = FileName(version);
  return file.substr(0, file.size() - kSuffix.size());
}

Result<std::unique_ptr<OutDirSink>> OutDirSink::Open(const std::string& dir, int keep, OutLayout layout,
                                                     std::shared_ptr<Store> bucket) {
  if (keep < 1) return Status::InvalidArgument("--keep must be at least 1, got " + std::to_string(keep));
  // Its file names are the bucket's anchor names, and it prunes them.
  DS_RETURN_IF_ERROR(CheckOutsideBucket(bucket.get(), dir, "--out"));
  Result<std::unique_ptr<LocalStore>> store = LocalStore::Open(dir, /*create=*/true);
  if (!store.ok()) return store.status().WithContext("--out " + dir);
  DS_ASSIGN_OR_RETURN(int lock_fd, LockOutDir(dir));
  std::unique_ptr<OutDirSink> sink(new OutDirSink(std::shared_ptr<LocalStore>(std::move(*store)), dir, keep, layout,
                                                  std::move(bucket), lock_fd));
  if (layout == OutLayout::kFolder) DS_RETURN_IF_ERROR(CheckLatestLink(dir).WithContext("--out " + dir));
  RemoveStaleLeftovers(dir);
  return sink;
}

Status OutDirSink::Export(uint64_t version, const StateHash& hash, const WeightState& state, const FileSet& files) {
  Result<Written> written =
      layout_ == OutLayout::kFolder ? WriteFolder(version, state, files) : WriteFile(version, state);
  if (!written.ok()) return written.status().WithContext(Describe());

  // The link, then latest.json: both only once the version is complete.
  if (layout_ == OutLayout::kFolder) DS_RETURN_IF_ERROR(PointLatestAt(written->dir).WithContext(Describe()));
  nlohmann::json latest = {{"version", version},
                           {"file", written->file},
                           {"state_hash", hash.Hex()},
                           {"size", written->size}};
  if (layout_ == OutLayout::kFolder) latest["dir"] = written->dir;
  std::string text = latest.dump() + "\n";
  DS_RETURN_IF_ERROR(store_
                         ->Put(kLatestKey, ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()))
                         .WithContext(Describe()));
  return Prune(version);
}

Result<OutDirSink::Written> OutDirSink::WriteFile(uint64_t version, const WeightState& state) {
  std::vector<TensorView> views = state.views();
  // A plain checkpoint (format "pt", which transformers requires), not a patch.
  DS_ASSIGN_OR_RETURN(std::vector<uint8_t> header, EncodeSafetensorsHeader(CheckpointMetadata(version), views));
  std::vector<ByteSpan> parts{ByteSpan(header)};
  uint64_t size = header.size();
  for (const TensorView& t : views) {
    parts.push_back(t.data);
    size += t.data.size();
  }
  const std::string file = FileName(version);
  DS_RETURN_IF_ERROR(store_->Put(file, parts));
  return Written{"", file, size};
}

Result<OutDirSink::Written> OutDirSink::WriteFolder(uint64_t version, const WeightState& state,
                                                    const FileSet& files) {
  DS_ASSIGN_OR_RETURN(std::vector<SideFile> side_files, SideFilesOf(version, files));
  const std::string name = FolderName(version);
  const std::string path = dir_ + "/" + name;
  std::vector<TensorView> views = state.views();
  // replace: a folder of this version left by an earlier run is swapped out
  // whole (same version, same bytes), never seen half-written.
  HfWriteOptions options{.model_version = version, .max_shard_bytes = 0, .replace = true};
  DS_RETURN_IF_ERROR(WriteHfFolder(path, views, side_files, options));

  Written written{name, name + "/" + std::string(kHfSingleFile), 0};
  std::error_code ec;
  if (fs::exists(path + "/" + std::string(kHfIndexFile), ec)) written.file = name + "/" + std::string(kHfIndexFile);
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    if (e.path().extension() == kSuffix) written.size += e.file_size(ec);
  }
  if (ec) return Status::IOError(path + ": " + ec.message());
  return written;
}

Result<std::vector<SideFile>> OutDirSink::SideFilesOf(uint64_t version, const FileSet& files) {
  // Side files change rarely: fetch only when the listing differs from the
  // one last fetched (the objects are content-addressed, so an equal listing
  // means equal bytes).
  if (cached_set_ && *cached_set_ == files) return cached_files_;
  if (!bucket_) return Status::Internal("--out has no bucket to fetch side files from");
  DS_ASSIGN_OR_RETURN(std::vector<SideFile> fetched,
                      FetchSideFiles(*bucket_, files, "version " + std::to_string(version)));
  cached_set_ = files;
  cached_files_ = fetched;
  return fetched;
}

Status OutDirSink::PointLatestAt(const std::string& target) {
  DS_RETURN_IF_ERROR(CheckLatestLink(dir_));
  const std::string link = dir_ + "/" + std::string(kLatestLink);
  // Relative, so the folder can be moved or mounted elsewhere.
  const std::string tmp = TempPathFor(link);
  if (::symlink(target.c_str(), tmp.c_str()) != 0) {
    return Status::IOError(tmp + ": cannot create a symlink: " + ErrnoText(errno));
  }
  if (::rename(tmp.c_str(), link.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Status::IOError(link + ": cannot switch the link to " + target + ": " + ErrnoText(err));
  }
  return SyncDir(dir_);
}

Status OutDirSink::Prune(uint64_t newest) {
  // Candidates: the layout's own kind only (folders, or files).
  std::vector<std::pair<uint64_t, std::string>> entries;
  if (layout_ == OutLayout::kFile) {
    DS_ASSIGN_OR_RETURN(std::vector<std::string> keys, store_->List(kPrefix));
    for (const std::string& key : keys) {
      std::optional<uint64_t> v = VersionOf(key, kSuffix);
      // A file from a newer version than the one held (left by an earlier run
      // on another bucket) is stale too; the held one always stays.
      if (v && *v != newest) entries.emplace_back(*v > newest ? 0 : *v, key);
    }
  } else {
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
      std::optional<uint64_t> v = VersionOf(e.path().filename().string(), "");
      if (!v || *v == newest || e.is_symlink(ec) || !e.is_directory(ec)) continue;
      entries.emplace_back(*v > newest ? 0 : *v, e.path().filename().string());
    }
    if (ec) return Status::IOError(dir_ + ": cannot list: " + ec.message()).WithContext(Describe());
  }
  std::sort(entries.begin(), entries.end(), std::greater<>());
  // The held version counts as one of the `keep`.
  for (size_t i = static_cast<size_t>(keep_ - 1); i < entries.size(); ++i) {
    if (layout_ == OutLayout::kFile) {
      DS_RETURN_IF_ERROR(store_->Delete(entries[i].second).WithContext(Describe()));
      continue;
    }
    // Renamed away first, so the folder disappears at once rather than file
    // by file (a leftover of a kill mid-removal is removed at the next start).
    const std::string path = dir_ + "/" + entries[i].second;
    const std::string doomed = TempPathFor(path);
    if (::rename(path.c_str(), doomed.c_str()) != 0) {
      return Status::IOError(path + ": cannot remove: " + ErrnoText(errno)).WithContext(Describe());
    }
    std::error_code ec;
    fs::remove_all(doomed, ec);
    if (ec) return Status::IOError(doomed + ": cannot remove: " + ec.message()).WithContext(Describe());
  }
  return Status::OK();
}

}  // namespace deltasync::server
