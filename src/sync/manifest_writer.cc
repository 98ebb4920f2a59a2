// CommitManifest (manifest_writer.h): compare-and-swap of manifest.json.
#include "sync/manifest_writer.h"

#include <unistd.h>

#include <cstdio>
#include <random>

namespace deltasync {

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
  for (int round = 0;; ++round) {
    std::string json = next.ToJson();
    ByteSpan bytes(reinterpret_cast<const uint8_t*>(json.data()), json.size());
    Result<std::string> token =
        store.PutIfUnchanged(kManifestKey, std::span<const ByteSpan>(&bytes, 1), token_io);
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
      if (current->writer == next.writer && current->Latest()->version == next.Latest()->version &&
          current->Latest()->state_hash == next.Latest()->state_hash) {
        token_io = now->token;
        current_manifest = std::move(next);
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
        token_io = now->token;
        continue;
      }
    }
    return Status::Conflict("another publisher wrote " + std::string(kManifestKey) +
                            " since this one read it; refusing to overwrite its history (" +
                            token.status().message() + ")");
  }
}

}  // namespace deltasync
