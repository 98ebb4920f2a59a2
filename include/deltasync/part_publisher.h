// Publishing one version from several processes (docs/format.md, "Parts"):
// every rank of a sharded trainer runs a PartPublisher on its own blocks
// (detect, encode and upload its part, return a small PartReceipt), and one
// rank's PartCommitter checks that the receipts cover the model exactly once
// and commits the version by rewriting the manifest (compare-and-swap). The
// outcome goes back to every rank (PartPublisher::Finish): a part whose
// version was not committed rolls its state back, so the next version
// publishes correctly. No rank holds more than its own blocks' bf16 state.
//
// Parted publishing writes compact objects only and keeps no anchor state:
// cumulative deltas and adaptive anchors are refused (they would need a
// second copy of every block, 2 more bytes per local parameter).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "deltasync/hf_folder.h"
#include "deltasync/manifest.h"
#include "deltasync/parts.h"
#include "deltasync/publisher.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/store.h"
#include "deltasync/weight_state.h"

namespace deltasync {

class Notifier;  // src/sync/notifier.h
namespace bf16 {
class CompactScan;
}

// What a part publisher reports to the committer (a few hundred bytes).
struct PartReceipt {
  struct Object {
    PatchKind kind = PatchKind::kDelta;
    std::string key;
    uint64_t size = 0;
    std::string xxh3_128;
    uint64_t base_version = 0;  // deltas
    friend bool operator==(const Object&, const Object&) = default;
  };
  uint64_t version = 0;
  uint32_t part = 0;
  uint32_t parts = 0;
  std::string layout;         // the layout's digest
  uint64_t base_version = 0;  // the version the part was published on (0: none, the first version)
  StateHash state_hash;       // the part's hash after the version
  uint64_t changed_elements = 0;
  std::vector<Object> objects;
  // Non-empty: the part failed (the message); the version must not be committed.
  std::string error;

  // Compact JSON, and back (kCorruption for anything malformed).
  std::string Serialize() const;
  static Result<PartReceipt> Parse(std::string_view text);
  friend bool operator==(const PartReceipt&, const PartReceipt&) = default;
};

// The dtype a part publishes a source tensor as (what the layout must say):
// BF16 for F32 and BF16 sources (F32 for names ending in one of
// options.keep_fp32_suffixes), other dtypes as they are.
DType PublishedDType(std::string_view name, DType source, const PublisherOptions& options);

class PartPublisher {
 public:
  ~PartPublisher();

  // Part `part` of `layout` on `store`. When the bucket holds versions, the
  // part's blocks of the newest one are rebuilt from it (verified, as a
  // replica does; the layout may differ from the one the bucket was
  // published with, e.g. another world size) and the next version is a
  // delta. The rebuild reads only the part objects that overlap the part's
  // blocks and holds at most those parts' blocks meanwhile (an unparted
  // version: the whole model); docs/format.md, "Restarting with another layout".
  // Errors: an invalid layout or part (kInvalidArgument); settings parted
  // publishing does not support: an encoding other than compact, cumulative
  // deltas, adaptive anchors (kFailedPrecondition); a layout whose tensors
  // differ from the bucket's; store failures.
  static Result<std::unique_ptr<PartPublisher>> Open(std::shared_ptr<Store> store, PartLayout layout, uint32_t part,
                                                     PublisherOptions options = {});
  // Every part of `layout`, for one process that publishes them all (a model
  // folder published one part per weight file, folder_parts.h): as Open for
  // each part, but the bucket's newest state is rebuilt only once (on
  // options.threads), and the parts, which publish side by side, share the
  // threads (each gets options.threads / P, at least 1).
  static Result<std::vector<std::unique_ptr<PartPublisher>>> OpenAll(std::shared_ptr<Store> store, PartLayout layout,
                                                                     PublisherOptions options = {});

  // Publishes this part of `version`: `blocks` are its blocks (one per block
  // of the part, named by the full tensor's name, of the block's shape; bf16
  // or fp32, rounded as Publisher rounds), compared with the part's state in
  // one fused pass, encoded (a compact delta from the latest version, and a
  // compressed anchor when the cadence says so), and uploaded. The state
  // advances provisionally: Finish() says whether the version was committed.
  // On error nothing is pending and the state is unchanged.
  Result<PartReceipt> Publish(uint64_t version, std::span<const TensorView> blocks);
  // The committer's outcome for the pending version: kept when committed,
  // rolled back (undo log) otherwise. No-op without a pending version.
  // `manifest_token` (optional): the token of the manifest the committer
  // wrote (PartCommitter::manifest_token()). With it the next Publish's
  // check for another job's commit is a HEAD of the manifest (Store::Token)
  // instead of a GET and parse of all of it on every rank; without it, or
  // when the manifest moved since (gc, another job), the whole manifest is
  // read as before.
  void Finish(bool committed, std::optional<std::string> manifest_token = std::nullopt);

  uint64_t latest_version() const { return latest_; }
  const PartLayout& layout() const { return layout_; }
  uint32_t part() const { return part_; }
  // The part's blocks as published at latest_version() (plus the pending
  // version's changes between Publish and Finish).
  const WeightState& state() const { return state_; }
  const StateHash& part_hash() const { return hash_; }

 private:
  PartPublisher() = default;
  DetectOptions Detection() const;
  Status CheckBlocks(std::span<const TensorView> blocks) const;
  // A receipt naming this part of `version` (version, part, parts, layout).
  PartReceipt NewReceipt(uint64_t version) const;
  Result<PartReceipt> PublishDelta(uint64_t version, std::span<const TensorView> blocks, bool anchor);

  std::shared_ptr<Store> store_;
  PublisherOptions options_;
  BucketSettings settings_;
  PartLayout layout_;
  std::string digest_;
  uint32_t part_ = 0;
  WeightState state_;
  StateHash hash_;
  uint64_t latest_ = 0;
  // The committed manifest's token when it lists latest_ as its newest
  // version (Finish's), else nullopt.
  std::optional<std::string> manifest_token_;
  uint64_t last_anchor_ = 0;
  std::unique_ptr<bf16::CompactScan> scan_;
  bool framed_ = false;  // every block one run: the scan computes the full tensors' hash terms
  struct Pending {
    uint64_t version = 0;
    bool anchor = false;
    StateHash hash;
    std::optional<WeightState> first;  // the first version's state
    std::function<void()> rollback;    // puts state_ back
  };
  std::optional<Pending> pending_;
};

class PartCommitter {
 public:
  // Commits versions of `layout` to `store` (settings as for PartPublisher).
  static Result<std::unique_ptr<PartCommitter>> Open(std::shared_ptr<Store> store, PartLayout layout,
                                                     PublisherOptions options = {});

  // Checks the receipts (one per part of the layout, none failed, all for
  // `version` on this layout and on the newest committed version, objects as
  // the anchor cadence requires) and commits the version with a
  // compare-and-swap of the manifest. On any error nothing is committed.
  // stats.state_hash is the version's hash (the layout's descriptor terms
  // plus the parts' hashes). With `files` (a model folder's side files,
  // hf_folder.h), they are uploaded before the manifest and listed for the
  // version when the set changed, as Publisher::Publish does.
  Result<PublishStats> Commit(uint64_t version, std::span<const PartReceipt> receipts,
                              std::optional<std::span<const SideFile>> files = std::nullopt);

  uint64_t latest_version() const;
  const Manifest& manifest() const { return manifest_; }
  // The token of the manifest as this committer last read or wrote it (for
  // PartPublisher::Finish); nullopt before a bucket's first commit.
  const std::optional<std::string>& manifest_token() const { return token_; }

 private:
  PartCommitter() = default;

  std::shared_ptr<Store> store_;
  PublisherOptions options_;
  BucketSettings settings_;
  PartLayout layout_;
  std::string digest_;
  Manifest manifest_;
  std::optional<std::string> token_;
  std::string writer_id_;
  uint64_t last_anchor_ = 0;
  std::shared_ptr<Notifier> notifier_;  // created on the first commit with notify_urls
};

}  // namespace deltasync
