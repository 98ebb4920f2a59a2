// Store: the bucket. Every byte deltasync moves between trainer and replicas
// goes through this interface (a local directory, or S3).
//
// Keys are '/'-separated relative paths: non-empty, no leading '/', no empty,
// "." or ".." segments, no NUL or backslash, at most 1024 bytes. Every Store
// refuses other keys with kInvalidArgument (see ValidateKey).
//
// Thread safety: a Store may be used from several threads at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deltasync/blob.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"

namespace deltasync {

// OK when `key` follows the rules above.
Status ValidateKey(std::string_view key);

class Store {
 public:
  virtual ~Store() = default;

  // Writes the object `key` as the concatenation of `parts` (a scatter-gather
  // list, so a safetensors header and tensor bytes need not be copied into one
  // buffer). Atomic: readers see the old object or the whole new one, never a
  // prefix. Replaces an existing object.
  virtual Status Put(std::string_view key, std::span<const ByteSpan> parts) = 0;
  Status Put(std::string_view key, ByteSpan bytes) { return Put(key, std::span<const ByteSpan>(&bytes, 1)); }

  // The whole object. kNotFound when it does not exist.
  virtual Result<Blob> Get(std::string_view key) = 0;

  // Bytes [offset, offset+length) of the object. kNotFound when the object
  // does not exist; kInvalidArgument when the range exceeds the object.
  virtual Result<Blob> GetRange(std::string_view key, uint64_t offset, uint64_t length) = 0;

  // Size in bytes; kNotFound when the object does not exist.
  virtual Result<uint64_t> Size(std::string_view key) = 0;

  // Keys that start with `prefix`, sorted ascending. Temporary files of
  // in-flight writes are never listed.
  virtual Result<std::vector<std::string>> List(std::string_view prefix) = 0;

  // Removes the object. Deleting a missing object is OK.
  virtual Status Delete(std::string_view key) = 0;

  // Where this store points, for messages: "file:///abs/dir" or "s3://bucket/prefix".
  virtual std::string Describe() const = 0;

  // Compare-and-swap, for the manifest: two publishers on one bucket must not
  // silently overwrite each other's history.
  struct Versioned {
    Blob blob;
    std::string token;  // opaque; changes whenever the object is replaced (an ETag on S3)
  };
  // The object with its current token. kNotFound when it does not exist.
  virtual Result<Versioned> GetVersioned(std::string_view key) = 0;
  // Only the current token (what GetVersioned would give), without the
  // bytes where the store can: S3 answers a HEAD. kNotFound when missing.
  virtual Result<std::string> Token(std::string_view key) {
    DS_ASSIGN_OR_RETURN(Versioned v, GetVersioned(key));
    return std::move(v.token);
  }
  // Writes `key` only if it still has `expected_token` (from GetVersioned),
  // or, when expected_token is nullopt, only if it does not exist yet.
  // kConflict when another writer got there first. Returns the new token.
  virtual Result<std::string> PutIfUnchanged(std::string_view key, std::span<const ByteSpan> parts,
                                             const std::optional<std::string>& expected_token) = 0;
};

// A Store over a local directory. Put writes a temporary file in the same
// directory, fsyncs it, renames it over the key and fsyncs the directory.
// Keys cannot escape the root: a path component that is a symlink is refused.
class LocalStore : public Store {
 public:
  // Opens (and with create=true creates) the directory `root`.
  static Result<std::unique_ptr<LocalStore>> Open(const std::string& root, bool create = true);

  Status Put(std::string_view key, std::span<const ByteSpan> parts) override;
  using Store::Put;
  Result<Blob> Get(std::string_view key) override;
  Result<Blob> GetRange(std::string_view key, uint64_t offset, uint64_t length) override;
  Result<uint64_t> Size(std::string_view key) override;
  Result<std::vector<std::string>> List(std::string_view prefix) override;
  Status Delete(std::string_view key) override;
  std::string Describe() const override;
  Result<Versioned> GetVersioned(std::string_view key) override;
  Result<std::string> PutIfUnchanged(std::string_view key, std::span<const ByteSpan> parts,
                                     const std::optional<std::string>& expected_token) override;

  const std::string& root() const { return root_; }

  // Leftover temporary files (temp_file.h: ".tmp-*", and the older ".tmp\*")
  // anywhere under the root, removed when both hold: the file was last
  // modified at least `older_than` ago, and its writer is not a live process
  // of this host (TempWriterRunsHere; a name from another host is judged by
  // its age only). Only regular files are removed; symlinks and folders are
  // never followed or removed. `dry_run` counts without removing.
  struct TempCleanup {
    uint64_t removed_files = 0;
    uint64_t removed_bytes = 0;
    uint64_t kept_files = 0;  // temporaries too young or whose writer runs
  };
  Result<TempCleanup> RemoveStaleTemporaries(std::chrono::seconds older_than, bool dry_run = false);

 private:
  explicit LocalStore(std::string root) : root_(std::move(root)) {}
  Result<std::string> PathFor(std::string_view key, bool create_parents) const;
  std::string root_;  // absolute, no trailing '/'
  // Held by Put from its directory walk until its temporary file exists (a
  // directory holding it can no longer be removed) and by Delete while it
  // removes the directories it emptied: within one process a Put never
  // loses its directory to a Delete. Other processes' Deletes are met by
  // Put's retries.
  std::mutex tree_;
};

// Opens a bucket URL: a directory path, "file:///abs/dir", or
// "s3://bucket/prefix" (S3Store, configured from AWS_* variables and
// ~/.aws profiles; see docs/s3.md). `create` creates a missing local
// directory; `create_bucket` creates a missing S3 bucket (otherwise a missing
// bucket is a kNotFound error naming it).
Result<std::shared_ptr<Store>> OpenStore(std::string_view url, bool create = true, bool create_bucket = false);

// Refuses `path`, where a command writes its output (`pull -o`, `pull
// --hf-dir`, `serve --out`: a file or a folder, there or not yet), when
// `store` is a local bucket whose directory it is, lies inside or holds
// (symbolic links, "." and ".." resolved as far as the path exists; the
// bucket's directory reached by another path, a bind mount, is found by
// device and inode): writing
// there would replace the bucket's files (its manifest, or its anchors:
// `serve --out` names its files as the bucket names anchors, and prunes
// them). kInvalidArgument naming `flag` and the bucket; OK for other stores
// (and for a null one).
Status CheckOutsideBucket(const Store* store, const std::string& path, const std::string& flag);

}  // namespace deltasync
