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

Status OtherPublisherConflict(Store& store, uint64_t stored_newest, uint64_t own_newest, uint64_t version) {
  auto name = [](uint64_t v) { return v > 0 ? "version " + std::to_string(v) : std::string("no version"); };
  return Status::Conflict("another publisher wrote " + store.Describe() + "/" + std::string(kManifestKey) +
                          " since this one read it (it now lists " + name(stored_newest) +
                          ", this publisher's newest is " + name(own_newest) + "); version " + std::to_string(version) +
                          " was not published and nothing of it was uploaded, so the objects of that publisher's "
                          "versions stay intact. Two publishers on one bucket: stop the other one (a trainer's "
                          "zombie), then open the publisher again to continue from the bucket's newest version");
}

Status CheckNoOtherCommit(Store& store, const std::string& writer_id, const Manifest& current,
                          const std::optional<std::string>& token, uint64_t version) {
  const std::string v = "version " + std::to_string(version);
  const std::string where = store.Describe() + "/" + std::string(kManifestKey);
  // The token first (a HEAD on S3); the manifest itself only when it moved.
  Result<std::string> moved = store.Token(kManifestKey);
  if (moved.ok() && token && *moved == *token) return Status::OK();
  Result<Store::Versioned> now =
      moved.ok() ? store.GetVersioned(kManifestKey) : Result<Store::Versioned>(moved.status());
  if (!now.ok()) {
    if (now.status().code() != ErrorCode::kNotFound) {
      return now.status().WithContext("re-reading " + where + " before uploading " + v);
    }
    if (!token) return Status::OK();  // still a new bucket
    return Status::Conflict(where + " is gone since this publisher read it (the bucket was deleted or replaced); " +
                            v + " was not published and nothing of it was uploaded: open the publisher again");
  }
  if (token && now->token == *token) return Status::OK();
  DS_ASSIGN_OR_RETURN(Manifest stored, Manifest::Parse(now->blob.bytes(), where));
  const VersionEntry* ours = current.Latest();
  const VersionEntry* theirs = stored.Latest();
  if (ours == nullptr && theirs == nullptr) return Status::OK();
  if (ours != nullptr && theirs != nullptr && ours->version == theirs->version &&
      ours->state_hash == theirs->state_hash) {
    return Status::OK();  // pruned by gc; CommitManifest rebases onto it
  }
  // This writer's own commit of `version` landed although its write reported
  // a failure: a retry of it, which CommitManifest accepts only with the
  // same state hash.
  if (theirs != nullptr && theirs->version == version && stored.writer && stored.writer->id == writer_id) {
    return Status::OK();
  }
  return OtherPublisherConflict(store, theirs ? theirs->version : 0, ours ? ours->version : 0, version);
}

}  // namespace deltasync
