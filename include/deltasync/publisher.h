// Publisher: the trainer's side. Turns successive full weight states into an
// anchor every `anchor_interval` versions and deltas between, writes them to
// the bucket, and commits each version by rewriting the manifest last.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <span>

#include "deltasync/changes.h"
#include "deltasync/compact.h"
#include "deltasync/hf_folder.h"
#include "deltasync/manifest.h"
#include "deltasync/patch.h"
#include "deltasync/state_hash.h"
#include "deltasync/status.h"
#include "deltasync/store.h"
#include "deltasync/weight_state.h"

namespace deltasync {

class Notifier;  // src/sync/notifier.h
class Stopwatch;  // src/common/clock.h
namespace compact {
class StreamBuffers;  // src/codec/stream_buffers.h
}
class GapDeltaPublish;  // src/sync/gap_delta_publish.h
namespace bf16 {
class CompactScan;  // src/bf16/compact_scan.h
}

// The largest version a Publisher writes: 2^53-1, the largest integer a
// JSON reader that keeps numbers as doubles (JavaScript, jq) reads exactly.
// Readers accept what docs/format.md allows (below 2^64).
inline constexpr uint64_t kMaxPublishVersion = (uint64_t{1} << 53) - 1;
// A new version more than this past the newest one is refused unless
// PublisherOptions::allow_version_jump (a typo such as 10000000 for 1000000
// would leave no room for the versions after it).
inline constexpr uint64_t kMaxVersionJump = 1000000;

struct PublisherOptions {
  // The bucket's settings (BucketSettings, stored in the manifest). Unset:
  // the bucket's stored value, or the default given here for a new bucket.
  // Set to a value other than the stored one: Open refuses
  // (kFailedPrecondition) unless change_settings, in which case the new
  // value is used and stored with the next version (changed_settings()).
  //
  // An anchor at the first version, and then at every version that reaches
  // or crosses a multiple of N since the last anchor
  // (version / N > last_anchor / N). Without gaps that is TRL's cadence
  // (1, N, 2N, ...); with gaps an anchor is never skipped.
  // At least 1; a very large N leaves anchors to anchor_max_fraction.
  // Default 10.
  std::optional<uint64_t> anchor_interval;
  // kCompact (the default between deltasync peers): compact deltas and
  // compressed anchors under ds/. kGapDelta / kRaw: TRL's sparse_weight_patch
  // deltas and raw anchors under deltas/ and anchors/, readable by TRL.
  std::optional<IndexEncoding> encoding;
  // Every `cumulative_interval`-th version after an anchor also gets a
  // cumulative delta from that anchor (under ds/cumulative/), so a replica
  // catching up downloads one cumulative delta instead of many steps.
  // Default 0 = none.
  std::optional<uint64_t> cumulative_interval;
  // Adaptive anchors: when > 0, a version also becomes an anchor when its
  // cumulative delta from the last anchor would exceed this fraction of that
  // anchor's size (computed every version). Default 0 = off.
  std::optional<double> anchor_max_fraction;
  // Allows the settings above to differ from the bucket's stored ones.
  bool change_settings = false;
  // Also encode each delta as TRL gap_delta, only to report its size in
  // PublishStats::gap_delta_bytes (the demo's side-by-side column).
  bool measure_gap_delta = false;
  bool allow_nonfinite = false;
  // Allows a version more than kMaxVersionJump past the newest one.
  bool allow_version_jump = false;
  int threads = 0;  // 0 = hardware concurrency
  // Stream version of compact deltas (2, 3 or kCompactStreamAuto, the
  // default; replicas read both; tests and benchmarks compare).
  int compact_stream_version = kDefaultCompactStreamVersion;
  // Container of compact deltas (1, 2 or kCompactContainerAuto, the
  // default: 2 unless 1 is smaller; replicas read both).
  int compact_container = kDefaultCompactContainer;
  // F32 tensors whose names end with one of these are published as F32
  // (bitwise) rather than rounded to bf16: inference engines keep MoE
  // router score-correction biases in fp32.
  std::vector<std::string> keep_fp32_suffixes = {"e_score_correction_bias"};
  // Replica daemons (`deltasync serve`) to wake after each commit: base URLs
  // such as "http://10.0.0.7:8470". Each gets POST /notify {"version": V},
  // with "Authorization: Bearer <notify_token>" when the token is non-empty.
  // Fire and forget: Publish never waits for them or fails because of them
  // (a failure is logged to stderr once per URL; replicas still poll).
  std::vector<std::string> notify_urls;
  std::string notify_token;

  // When set, called with (done, total) bytes around each object of a
  // transfer: the download that rebuilds the published state in Open(), and
  // the uploads of each Publish(). A front end can show progress (the
  // library draws nothing; the CLI's `publish` draws it on a terminal).
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct PublishStats {
  uint64_t version = 0;
  bool wrote_anchor = false;
  bool wrote_delta = false;
  uint64_t total_elements = 0;
  // Elements that differ from the previous version (all of them for the
  // first); nullopt when `recovered`.
  std::optional<uint64_t> changed_elements = 0;
  // Published by a degraded publisher (Publisher::degraded()): an anchor
  // only, no delta, and its difference from the previous version unknown.
  bool recovered = false;
  uint64_t delta_bytes = 0;   // size of the delta object (0 when none)
  uint64_t anchor_bytes = 0;  // size of the anchor object (0 when none)
  uint64_t cumulative_bytes = 0;  // size of the cumulative delta (0 when none)
  uint64_t gap_delta_bytes = 0;   // with measure_gap_delta: the TRL gap_delta size
  uint64_t full_bytes = 0;    // bytes of the bf16 state
  double detect_encode_ms = 0;
  double upload_ms = 0;       // objects + manifest
  StateHash state_hash;
};

class Publisher {
 public:
  ~Publisher();

  // Opens the bucket. When it already holds versions, the publisher first
  // rebuilds the newest published state from it (verified like a replica
  // does, routing around damaged objects), so a new process continues where
  // the last one stopped.
  // When that state cannot be rebuilt because objects of the bucket are
  // damaged or missing (kIntegrity, kCorruption, kNotFound of an object) and
  // no route avoids them, Open still succeeds, degraded (degraded()): it
  // knows the manifest but holds no state, so the next version must come
  // with the complete weights (Publish), which it commits as a recovered,
  // anchor-only version. A store failure (kIOError: an outage, a timeout)
  // still fails Open.
  static Result<std::unique_ptr<Publisher>> Open(std::shared_ptr<Store> store,
                                                 PublisherOptions options = {});

  // Publishes `tensors` as `version` and returns once the manifest lists it.
  // With kCompact a delta is found, coded, hashed and applied in one pass
  // over the tensors (bf16/compact_scan.h), whose buffers (about 7 bytes per
  // changed element and a bit per element) are kept for the next version.
  // tensors: bf16 or fp32 (rounded to bf16, round-to-nearest-even), other
  // dtypes carried as they are. After the first version the tensor set,
  // shapes and dtypes must not change.
  // Errors: version <= latest published, above kMaxPublishVersion, or more
  // than kMaxVersionJump past it without allow_version_jump
  // (kInvalidArgument), NaN/Inf,
  // mismatched tensors, store failures. On error nothing is committed and the
  // publisher's state is unchanged (objects already uploaded are overwritten
  // by the next attempt).
  // files: the version's side files (config, tokenizer: hf_folder.h), the
  // full set; uploaded and listed in the manifest when the set differs from
  // the previous version's. nullopt: the previous version's set, unchanged
  // (as for PublishChanges).
  // unchanged: when set, asked after every tensor was read and before any of
  // the weights is uploaded; an error from it fails the publish (nothing
  // committed). For tensors mapped from files that a writer may change
  // underneath: SafetensorsFile::CheckUnchanged.
  Result<PublishStats> Publish(uint64_t version, std::span<const TensorView> tensors,
                               std::optional<std::span<const SideFile>> files = std::nullopt,
                               const std::function<Status()>& unchanged = {});
  // A model folder (ReadHfFolder): its tensors, and its side files as the
  // version's full set. After its tensors are read and before the version's
  // weights are uploaded, the folder must still hold the files read
  // (CheckHfFolderUnchanged): a save into it while it was read would publish
  // a mix of two checkpoints (kFailedPrecondition, nothing committed).
  Result<PublishStats> PublishFolder(uint64_t version, const HfFolder& folder);

  // The published form of `tensors` (fp32 rounded to bf16 as Publish rounds
  // it, other dtypes copied), owned by the result: Publish(version,
  // snapshot.views()) later publishes exactly what `tensors` hold now, while
  // the caller goes on changing them (a training loop that publishes in the
  // background). Reads only the options: may run concurrently with Publish.
  // Errors: NaN/Inf (unless allowed), duplicate names (kInvalidArgument).
  Result<WeightState> Snapshot(std::span<const TensorView> tensors) const;

  // Publishes `version` as state() with `changes` applied: for trainers that
  // find the changed elements themselves (on a GPU, so that only the changed
  // elements cross PCIe). Each entry names a tensor of state() and carries
  // its dtype as published (state().Find(name)->dtype: bf16 for fp32/bf16
  // sources), flat indices strictly ascending and below its element count,
  // and values count x dtype bytes. Entries that set an element to the value
  // it already holds are allowed (and counted as changed).
  // Errors: as Publish; kFailedPrecondition before the first version (which
  // must come through Publish: there is no base yet); kInvalidArgument for
  // changes that do not fit state(), and for NaN/Inf bf16 values unless
  // allow_nonfinite; kFailedPrecondition when degraded() (no state to apply
  // them to: publish the full weights once). On error nothing changes.
  Result<PublishStats> PublishChanges(uint64_t version, std::span<const TensorChanges> changes);

  // The newest committed version, 0 when none.
  uint64_t latest_version() const;
  // The settings this publisher publishes with (options resolved against the
  // bucket's stored settings).
  const BucketSettings& settings() const { return settings_; }
  // With change_settings: each stored setting this publisher changes, as
  // "encoding compact -> gap_delta"; empty when none.
  const std::vector<std::string>& changed_settings() const { return changed_settings_; }
  // The published bf16 state at latest_version(); empty when degraded().
  const WeightState& state() const { return state_; }
  // True when Open could not rebuild the newest version (see Open): the
  // next Publish() commits a recovered, anchor-only version.
  bool degraded() const { return !degraded_reason_.empty(); }
  // When degraded(): one line naming the version, the objects that block it
  // and what the next version does; empty otherwise.
  const std::string& degraded_reason() const { return degraded_reason_; }
  const Manifest& manifest() const { return manifest_; }
  // Frees the buffers kept from the last delta for the next one: a compact
  // delta's streams (bounded to about 4x that delta's size), a gap_delta
  // delta's buffers and its decoded copy, a raw delta's change list and
  // patch (docs/python.md, "publish").
  void ReleaseBuffers();

 private:
  Publisher(std::shared_ptr<Store> store, PublisherOptions options);
  // Resolves options_ against `stored` (nullptr: a new bucket) into settings_.
  Status UseSettings(const Manifest* stored);
  Status CheckNewVersion(uint64_t version) const;
  DetectOptions Detection() const;
  // A delta's PatchInfo in options_.encoding, from base_version (whose state is `base`) to `version`.
  PatchInfo DeltaInfo(uint64_t version, uint64_t base_version, const WeightState& base) const;
  // Encodes `changes` (relative to `base`) in options_.encoding.
  Result<EncodedPatch> EncodeDeltaFrom(uint64_t version, uint64_t base_version, const StateHash& base_hash,
                                       const WeightState& base, std::span<const TensorChanges> changes) const;
  // A version's delta, encoded and already applied to state_.
  struct Prepared {
    EncodedPatch delta;
    uint64_t changed = 0;
    uint64_t gap_delta_bytes = 0;  // with measure_gap_delta
    StateHash next_hash;
    // When set, next_hash lacks (most of) the delta's hash change, which this
    // sums: Commit runs it beside the delta's upload and adds it before the
    // manifest's entry (sync/deferred_state_hash.h).
    std::function<StateHash()> hash_later;
    std::function<void()> rollback;  // puts state_ back as it was
    // Where delta's buffers go once it is written: back to buffers_ (a
    // compact delta), to kept_patch_ (kept_changes_' delta), or freed.
    enum class Recycle { kNone, kStreamBuffers, kKeptPatch } recycle = Recycle::kNone;
  };
  // From a change list (any encoding).
  Result<Prepared> PrepareChanges(uint64_t version, std::vector<TensorChanges> changes);
  // gap_delta: detected, encoded and applied in one pass, each block's
  // changes from the delta's own gap and value streams while the block is
  // in cache (bf16/detect_encode_apply.h; gap_ holds the buffers).
  Result<Prepared> PrepareGapDelta(uint64_t version, std::span<const TensorView> tensors);
  // raw: detects the changes into kept_changes_ and applies
  // them in the same pass, their old values into kept_old_ for the rollback
  // (bf16/detect_apply.h), then encodes them into kept_patch_'s buffers (no
  // fresh pages for a version about as large as the last).
  Result<Prepared> PrepareDetected(uint64_t version, std::span<const TensorView> tensors);
  // Compact: detect, encode and apply in one pass over `tensors` (scan_).
  Result<Prepared> PrepareScanned(uint64_t version, std::span<const TensorView> tensors);
  Result<uint64_t> GapDeltaSize(uint64_t version, std::span<const TensorChanges> changes) const;
  // Applies `changes` to state_ and adds their hash change to *hash; the
  // result puts the old values back.
  std::function<void()> ApplyWithUndo(std::vector<TensorChanges> changes, StateHash* hash);
  // Everything after the delta: cumulative delta, anchor, upload, commit;
  // rolls back on failure. `first_state` for a version without a base (the
  // first one, or a recovered one when degraded), else `prepared`.
  // `unchanged` (Publish's) is asked before anything of the weights is uploaded.
  Result<PublishStats> Commit(uint64_t version, std::optional<WeightState> first_state, Prepared prepared,
                              const Stopwatch& clock, std::optional<FileSet> files = std::nullopt,
                              const std::function<Status()>& unchanged = {});
  void RememberAnchor();
  // Writes `next` (stamped with this writer) with compare-and-swap.
  Status CommitManifest(Manifest next);

  std::shared_ptr<Store> store_;
  PublisherOptions options_;
  BucketSettings settings_;                     // options_ resolved against the bucket's
  std::vector<std::string> changed_settings_;
  Manifest manifest_;
  std::optional<std::string> manifest_token_;  // nullopt: no manifest yet
  std::string writer_id_;                       // this instance's WriterStamp id
  std::shared_ptr<Notifier> notifier_;  // created on the first commit with notify_urls
  WeightState state_;
  StateHash state_hash_;
  uint64_t last_anchor_ = 0;
  uint64_t last_anchor_bytes_ = 0;     // size of its anchor object
  uint64_t versions_since_anchor_ = 0;
  // With cumulative deltas or adaptive anchors: the state at last_anchor_.
  WeightState anchor_state_;
  StateHash anchor_hash_;
  // The fused compact pass, kept between versions so its buffers are reused.
  std::unique_ptr<bf16::CompactScan> scan_;
  // The last compact delta's stream buffers, written into by the next one
  // (no page faults, no munmap): at most 4x that delta's bytes + 4 MiB.
  // ReleaseBuffers frees them.
  std::unique_ptr<compact::StreamBuffers> buffers_;
  // PrepareDetected's change list, old values and patch buffers, kept between
  // versions and written over by the next (DetectAndApply and EncodeDelta
  // into reused results): about 12 bytes per change of the largest version
  // so far. Valid while the version that filled them commits (its rollback
  // reads them); ReleaseBuffers frees them.
  std::vector<TensorChanges> kept_changes_;
  std::vector<std::vector<uint8_t>> kept_old_;
  EncodedPatch kept_patch_;
  // PrepareGapDelta's buffers (about 10 bytes per change of the largest
  // version so far), likewise valid while its version commits.
  std::unique_ptr<GapDeltaPublish> gap_;
  // Non-empty while the newest state is unknown (Open could not rebuild it).
  std::string degraded_reason_;
};

}  // namespace deltasync
