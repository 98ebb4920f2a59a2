// CommitManifest (manifest_writer.h): compare-and-swap of manifest.json.
#include "sync/manifest_writer.h"

#include <unistd.h>

#include <cstdio>
#include <random>
#include <set>

namespace deltasync {
namespace {

// The side file objects that `next`'s new (last) version lists and no
// version before it does: uploaded by this publish, so nothing else keeps
// them. gc deletes the objects that only the versions it prunes list, after
// its own manifest write; one such object may be one this publish has just
// uploaded again (a file set back to an older content). Checked right
// before each manifest write, so that a version never lists an object gc
// has already deleted (gc rereads the manifest before deleting side files,
// retention.cc, so it keeps one listed by then).
Status CheckNewSideFiles(Store& store, const Manifest& next) {
  const VersionEntry& added = next.versions.back();
  if (!added.files) return Status::OK();
  std::set<std::string> listed;
  for (size_t i = 0; i + 1 < next.versions.size(); ++i) {
    if (!next.versions[i].files) continue;
    for (const auto& [name, f] : *next.versions[i].files) listed.insert(f.key);
  }
  for (const auto& [name, f] : *added.files) {
    if (listed.count(f.key)) continue;
    Result<uint64_t> size = store.Size(f.key);
    if (size.ok() && *size == f.size) continue;
    const std::string what = "side file " + name + " (" + f.key + ") of version " + std::to_string(added.version);
    if (size.ok()) {
      return Status::Integrity(what + " is " + std::to_string(*size) + " bytes in " + store.Describe() +
                               " just before the commit, not " + std::to_string(f.size) + "; nothing was committed");
    }
    if (size.status().code() == ErrorCode::kNotFound) {
      return Status::NotFound(what + " is gone from " + store.Describe() +
                              " just before the commit (a gc pruning the versions that listed it before?); nothing "
                              "was committed: publish again, which uploads it again");
    }
    return size.status().WithContext("checking " + what + " before the commit");
  }
  return Status::OK();
}

}  // namespace

std::string NewWriterId() {
  char host[64] = "host";
  ::gethostname(host, sizeof host - 1);
  std::random_device rd;
  char id[160];
  std::snprintf(id, sizeof id, "%s-%d-%08x%08x", host, static_cast<int>(::getpid()), rd(), rd());
  std::string out = id;
  for (char& c : out) {
    if (c < 0x21 || c > 0x7E) c = '_';
  }
  return out;
}

Status CommitManifest(Store& store, const std::string& writer_id, Manifest& current_manifest,
                      std::optional<std::string>& token_io, Manifest next) {
  uint64_t seq = current_manifest.writer && current_manifest.writer->id == writer_id ? current_manifest.writer->seq : 0;
  next.writer = WriterStamp{writer_id, seq + 1};
  // A few rounds: another writer that only pruned old versions (gc) moves
  // the token without publishing; this commit then rebases onto its list.
  // `expected` moves with it; `current_manifest` and `token_io` only on
  // success, together (a failed round leaves the caller's list and token as
  // they were: its retry rebases again instead of writing its older list
  // over the pruned one).
  std::optional<std::string> expected = token_io;
  for (int round = 0;; ++round) {
    DS_RETURN_IF_ERROR(CheckNewSideFiles(store, next));
    std::string json = next.ToJson();
    ByteSpan bytes(reinterpret_cast<const uint8_t*>(json.data()), json.size());
    Result<std::string> token =
        store.PutIfUnchanged(kManifestKey, std::span<const ByteSpan>(&bytes, 1), expected);
    if (token.ok()) {
      token_io = *token;
      current_manifest = std::move(next);
      return Status::OK();
    }
    if (token.status().code() != ErrorCode::kConflict) return token.status();
    Result<Store::Versioned> now = store.GetVersioned(kManifestKey);
    Result<Manifest> current = now.ok() ? Manifest::Parse(now->blob.bytes()) : Result<Manifest>(now.status());
    if (current.ok() && current->Latest() && next.Latest()) {
      // A retried conditional write whose first attempt landed also ends in
      // a conflict: if the manifest now is exactly this writer's commit, it
      // is ours, not another publisher's.
      // The manifest as stored, which may be an earlier round's rebased list.
      if (current->writer == next.writer && current->Latest()->version == next.Latest()->version &&
          current->Latest()->state_hash == next.Latest()->state_hash) {
        token_io = now->token;
        current_manifest = std::move(*current);
        return Status::OK();
      }
      // Pruned (gc), not published to: its newest version is still ours.
      const VersionEntry* ours = current_manifest.Latest();
      if (round < 3 && ours && current->Latest()->version == ours->version &&
          current->Latest()->state_hash == ours->state_hash) {
        VersionEntry added = next.versions.back();
        next.versions = current->versions;
        next.layouts.insert(current->layouts.begin(), current->layouts.end());
        next.versions.push_back(std::move(added));
        expected = now->token;
        continue;
      }
    }
    return Status::Conflict("another publisher wrote " + std::string(kManifestKey) +
                            " since this one read it; refusing to overwrite its history (" +
                            token.status().message() + ")");
  }
}

}  // namespace deltasync
