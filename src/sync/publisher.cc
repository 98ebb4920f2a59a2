// Publisher: detect -> encode -> upload objects -> commit the manifest.
//
// The publisher keeps the last published bf16 state in memory (like TRL v1)
// and advances it in place. A failed publish must leave it unchanged, so the
// changes are applied with an undo log (the old values of the changed
// elements: proportional to the delta, not the model) and rolled back when
// anything after the apply fails.
#include "deltasync/publisher.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "bf16/compact_scan.h"
#include "codec/compact_bf16.h"
#include "codec/stream_buffers.h"
#include "common/clock.h"
#include "common/parallel.h"
#include "common/thread_start.h"
#include "deltasync/compact.h"
#include "deltasync/replica.h"
#include "deltasync/side_files.h"

#include <unistd.h>

#include <random>
#include "sync/bucket_settings.h"
#include "sync/deferred_state_hash.h"
#include "sync/gap_delta_publish.h"
#include "sync/manifest_writer.h"
#include "sync/notifier.h"
#include "sync/replay.h"

namespace deltasync {

Publisher::Publisher(std::shared_ptr<Store> store, PublisherOptions options)
    : store_(std::move(store)), options_(std::move(options)) {}
Publisher::~Publisher() = default;

Result<std::unique_ptr<Publisher>> Publisher::Open(std::shared_ptr<Store> store, PublisherOptions options) {
  // Checked before the bucket is read, so a bad value fails fast.
  DS_RETURN_IF_ERROR(ResolveSettings(options, nullptr, store->Describe()).status());
  std::unique_ptr<Publisher> pub(new Publisher(store, options));
  pub->writer_id_ = NewWriterId();  // one per Publisher instance
  Result<Store::Versioned> current = store->GetVersioned(kManifestKey);
  if (!current.ok()) {
    if (current.status().code() != ErrorCode::kNotFound) return current.status();
    DS_RETURN_IF_ERROR(pub->UseSettings(nullptr));
    return pub;
  }
  DS_ASSIGN_OR_RETURN(pub->manifest_,
                      Manifest::Parse(current->blob.bytes(), store->Describe() + "/" + std::string(kManifestKey)));
  pub->manifest_token_ = current->token;
  DS_RETURN_IF_ERROR(pub->UseSettings(&pub->manifest_));
  if (pub->manifest_.versions.empty()) return pub;

  // Continue where the bucket stands: rebuild its newest state, verified
  // (and the last anchor's, when cumulative deltas are computed from it).
  for (const VersionEntry& v : pub->manifest_.versions) {
    if (v.anchor()) {
      pub->last_anchor_ = v.version;
      pub->last_anchor_bytes_ = v.anchor()->size;
      pub->versions_since_anchor_ = 0;
    } else {
      pub->versions_since_anchor_++;
    }
  }
  ReplicaOptions replica_options = ReplicaWithThreads(options.threads);
  replica_options.progress = options.progress;
  std::unique_ptr<Replica> replica = Replica::Create(store, std::move(replica_options));
  uint64_t rebuilding = 0;
  auto rebuild = [&](uint64_t version) -> Status {
    rebuilding = version;
    Result<UpdateStats> caught_up = replica->Update(version);
    if (caught_up.ok()) return Status::OK();
    return caught_up.status().WithContext("cannot continue publishing to " + store->Describe() +
                                          ": rebuilding version " + std::to_string(version) + " failed");
  };
  Status rebuilt = Status::OK();
  if (pub->settings_.cumulative_interval > 0 || pub->settings_.anchor_max_fraction > 0) {
    rebuilt = rebuild(pub->last_anchor_);
    if (rebuilt.ok()) {
      std::vector<TensorView> views = replica->state().views();
      DS_ASSIGN_OR_RETURN(pub->anchor_state_, WeightState::FromViews(views));
      pub->anchor_hash_ = replica->state_hash();
    }
  }
  if (rebuilt.ok()) rebuilt = rebuild(pub->manifest_.Latest()->version);
  if (rebuilt.ok()) {
    pub->state_hash_ = replica->state_hash();
    pub->state_ = std::move(*replica).ReleaseState();
    return pub;
  }
  // Degraded only when objects of the bucket block every route (the replica
  // already routed around what it could); a store failure says nothing about
  // the objects and fails Open as it is.
  if (!replay::ObjectFault(rebuilt) || replica->bad_objects().empty()) return rebuilt;
  std::string bad;
  for (const BadObject& b : replica->bad_objects()) {
    bad += (bad.empty() ? "" : ", ") + b.key + " (version " + std::to_string(b.version) + ": " +
           std::string(ErrorCodeName(b.code)) + ")";
  }
  pub->anchor_state_ = WeightState();
  pub->degraded_reason_ = "version " + std::to_string(rebuilding) + " of " + store->Describe() +
                          " cannot be rebuilt: damaged or missing " + bad +
                          "; the next version must be published with the full weights and becomes an anchor-only "
                          "(recovered) version";
  return pub;
}

Status Publisher::UseSettings(const Manifest* stored) {
  DS_ASSIGN_OR_RETURN(ResolvedSettings resolved, ResolveSettings(options_, stored, store_->Describe()));
  settings_ = resolved.settings;
  changed_settings_ = std::move(resolved.changed);
  return Status::OK();
}

uint64_t Publisher::latest_version() const {
  const VersionEntry* latest = manifest_.Latest();
  return latest ? latest->version : 0;
}

Status Publisher::CheckNewVersion(uint64_t version) const {
  const uint64_t previous = latest_version();
  if (version == 0) return Status::InvalidArgument("version must be a positive integer, got 0");
  if (version > kMaxPublishVersion) {
    return Status::InvalidArgument("version " + std::to_string(version) + " is above 2^53-1 (" +
                                   std::to_string(kMaxPublishVersion) +
                                   "), the largest integer every JSON reader of the manifest keeps exact");
  }
  if (version <= previous) {
    return Status::InvalidArgument("version " + std::to_string(version) + " is not newer than the latest published version " +
                                   std::to_string(previous) + " in " + store_->Describe());
  }
  if (previous > 0 && version - previous > kMaxVersionJump && !options_.allow_version_jump) {
    return Status::InvalidArgument("version " + std::to_string(version) + " is " + std::to_string(version - previous) +
                                   " past the newest version " + std::to_string(previous) + " in " +
                                   store_->Describe() + " (more than " + std::to_string(kMaxVersionJump) +
                                   "); if that is intended, pass --allow-version-jump (Python: "
                                   "allow_version_jump=True)");
  }
  return Status::OK();
}

DetectOptions Publisher::Detection() const {
  return DetectOptions{options_.allow_nonfinite, options_.threads, [this](std::string_view name) {
                         for (const std::string& suffix : options_.keep_fp32_suffixes) {
                           if (name.ends_with(suffix)) return true;
                         }
                         return false;
                       }};
}

Result<PublishStats> Publisher::Publish(uint64_t version, std::span<const TensorView> tensors,
                                       std::optional<std::span<const SideFile>> files,
                                       const std::function<Status()>& unchanged) {
  DS_RETURN_IF_ERROR(CheckNewVersion(version));
  Stopwatch clock;
  // Side files first (small): listed only when the set changed, uploaded
  // before anything else so that a failure leaves the state untouched.
  std::optional<FileSet> changed_files;
  if (files) {
    DS_ASSIGN_OR_RETURN(FileSet set, DescribeSideFiles(*files));
    if (set != manifest_.FilesAt(latest_version())) {
      Status uploaded = UploadSideFiles(*store_, *files, set);
      if (!uploaded.ok()) {
        return uploaded.WithContext("publishing version " + std::to_string(version) + " to " + store_->Describe());
      }
      changed_files = std::move(set);
    }
  }
  if (latest_version() == 0 || degraded()) {
    DS_ASSIGN_OR_RETURN(WeightState first, ToPublishedState(tensors, Detection()));
    if (degraded() && first.total_elements() != manifest_.Latest()->total_elements) {
      return Status::InvalidArgument("version " + std::to_string(version) + ": the tensors hold " +
                                     std::to_string(first.total_elements()) + " elements but version " +
                                     std::to_string(latest_version()) + " in " + store_->Describe() + " holds " +
                                     std::to_string(manifest_.Latest()->total_elements) +
                                     "; a recovered version must be the same model's complete weights");
    }
    return Commit(version, std::move(first), Prepared{}, clock, std::move(changed_files), unchanged);
  }
  if (settings_.encoding == IndexEncoding::kCompact) {
    DS_ASSIGN_OR_RETURN(Prepared delta, PrepareScanned(version, tensors));
    return Commit(version, std::nullopt, std::move(delta), clock, std::move(changed_files), unchanged);
  }
  DS_ASSIGN_OR_RETURN(Prepared delta, settings_.encoding == IndexEncoding::kGapDelta ? PrepareGapDelta(version, tensors)
                                                                                    : PrepareDetected(version, tensors));
  return Commit(version, std::nullopt, std::move(delta), clock, std::move(changed_files), unchanged);
}

Result<PublishStats> Publisher::PublishFolder(uint64_t version, const HfFolder& folder) {
  return Publish(version, folder.tensors, std::span<const SideFile>(folder.side_files),
                 [&folder] { return CheckHfFolderUnchanged(folder); });
}

Result<WeightState> Publisher::Snapshot(std::span<const TensorView> tensors) const {
  return ToPublishedState(tensors, Detection());
}

Result<PublishStats> Publisher::PublishChanges(uint64_t version, std::span<const TensorChanges> changes) {
  DS_RETURN_IF_ERROR(CheckNewVersion(version));
  if (latest_version() == 0) {
    return Status::FailedPrecondition("publish the first version with full tensors (Publish): " +
                                      store_->Describe() + " has no version to apply changes to");
  }
  if (degraded()) {
    return Status::FailedPrecondition("cannot publish version " + std::to_string(version) +
                                      " as changes: " + degraded_reason_ +
                                      ". Publish the full weights once (deltasync publish, Publisher.publish); "
                                      "changes work again after that");
  }
  Stopwatch clock;
  std::vector<TensorChanges> copy(changes.begin(), changes.end());
  std::sort(copy.begin(), copy.end(), [](const TensorChanges& a, const TensorChanges& b) { return a.name < b.name; });
  for (size_t i = 0; i < copy.size(); ++i) {
    const TensorChanges& c = copy[i];
    const std::string at = "changes for '" + c.name + "': ";
    if (i > 0 && copy[i - 1].name == c.name) return Status::InvalidArgument(at + "the tensor is named twice");
    const WeightState::Tensor* t = state_.Find(c.name);
    if (!t) return Status::InvalidArgument(at + "no such tensor in the published state");
    if (c.dtype != t->dtype) {
      return Status::InvalidArgument(at + "values are " + std::string(DTypeName(c.dtype)) +
                                     " but the tensor is published as " + std::string(DTypeName(t->dtype)));
    }
    const size_t width = DTypeSize(c.dtype);
    if (c.values.size() != c.indices.size() * width) {
      return Status::InvalidArgument(at + std::to_string(c.indices.size()) + " indices but " +
                                     std::to_string(c.values.size()) + " value bytes (expected " +
                                     std::to_string(c.indices.size() * width) + ")");
    }
    for (size_t k = 0; k < c.indices.size(); ++k) {
      if (c.indices[k] >= t->num_elements()) {
        return Status::InvalidArgument(at + "index " + std::to_string(c.indices[k]) + " is out of range (" +
                                       std::to_string(t->num_elements()) + " elements)");
      }
      if (k > 0 && c.indices[k] <= c.indices[k - 1]) {
        return Status::InvalidArgument(at + "indices must be strictly ascending; index " + std::to_string(k) +
                                       " (" + std::to_string(c.indices[k]) + ") follows " +
                                       std::to_string(c.indices[k - 1]));
      }
    }
    if (!options_.allow_nonfinite && (c.dtype == DType::kBF16 || c.dtype == DType::kF32)) {
      for (size_t k = 0; k < c.indices.size(); ++k) {
        bool nonfinite;
        if (c.dtype == DType::kBF16) {
          uint16_t bits;
          std::memcpy(&bits, &c.values[2 * k], 2);
          nonfinite = (bits & 0x7F80u) == 0x7F80u;
        } else {
          uint32_t bits;
          std::memcpy(&bits, &c.values[4 * k], 4);
          nonfinite = (bits & 0x7F800000u) == 0x7F800000u;
        }
        if (nonfinite) {
          return Status::InvalidArgument(at + "element " + std::to_string(c.indices[k]) +
                                         " is NaN or Inf (pass --allow-nonfinite, or allow_nonfinite=True in "
                                         "Python, to publish it)");
        }
      }
    }
  }
  DS_ASSIGN_OR_RETURN(Prepared delta, PrepareChanges(version, std::move(copy)));
  return Commit(version, std::nullopt, std::move(delta), clock);
}

PatchInfo Publisher::DeltaInfo(uint64_t version, uint64_t base_version, const WeightState& base) const {
  PatchInfo info;
  info.kind = PatchKind::kDelta;
  info.model_version = version;
  info.encoding = settings_.encoding;
  info.base_version = base_version;
  info.total_elements = base.total_elements();
  return info;
}

Result<EncodedPatch> Publisher::EncodeDeltaFrom(uint64_t version, uint64_t base_version, const StateHash& base_hash,
                                                const WeightState& base,
                                                std::span<const TensorChanges> changes) const {
  const PatchInfo info = DeltaInfo(version, base_version, base);
  if (settings_.encoding == IndexEncoding::kCompact) {
    return EncodeCompactDelta(info, base_hash, base, changes, options_.threads, options_.compact_stream_version,
                              options_.compact_container);
  }
  return EncodeDelta(info, changes);
}

namespace {
// Objects at least this large are checksummed while they are written.
constexpr uint64_t kOverlapChecksumBytes = uint64_t{1} << 20;
}  // namespace

Result<PublishStats> Publisher::Commit(uint64_t version, std::optional<WeightState> first_state, Prepared prepared,
                                       const Stopwatch& clock, std::optional<FileSet> files,
                                       const std::function<Status()>& unchanged) {
  const uint64_t previous = latest_version();
  const bool first = first_state.has_value();
  // A version without a base after others: degraded, the previous state is unknown.
  const bool recovered = first && previous > 0;
  const bool compact = settings_.encoding == IndexEncoding::kCompact;
  PublishStats stats;
  stats.version = version;
  bool anchor = first || (settings_.anchor_interval > 0 &&
                          version / settings_.anchor_interval > last_anchor_ / settings_.anchor_interval);
  // The delta was encoded and applied by Prepare*; prepared.rollback undoes that.
  EncodedPatch& delta = prepared.delta;
  EncodedPatch cumulative;
  StateHash next_hash;
  if (first) {
    next_hash = HashState(*first_state, options_.threads);
    stats.changed_elements = recovered ? std::nullopt : std::optional<uint64_t>(first_state->total_elements());
    stats.recovered = recovered;
  } else {
    next_hash = prepared.next_hash;
    stats.changed_elements = prepared.changed;
    stats.gap_delta_bytes = prepared.gap_delta_bytes;
  }
  WeightState& next_state = first ? *first_state : state_;
  auto rollback = [&] {
    if (!first) prepared.rollback();
  };
  auto fail = [&](const Status& s) {
    rollback();
    return s;
  };
  // Every tensor was read (Prepare*, ToPublishedState): files they were
  // mapped from must still be the checkpoint read, or the version mixes two.
  if (unchanged) {
    Status same = unchanged();
    if (!same.ok()) {
      return fail(same.WithContext("version " + std::to_string(version) + " not published to " + store_->Describe()));
    }
  }

  // A cumulative delta from the last anchor: every cumulative_interval-th
  // version after it, and every version when anchors are adaptive (its size
  // decides whether this version becomes an anchor instead).
  const bool keep_anchor_state = settings_.cumulative_interval > 0 || settings_.anchor_max_fraction > 0;
  const uint64_t since_anchor = versions_since_anchor_ + 1;
  const bool cumulative_due = settings_.cumulative_interval > 0 && since_anchor % settings_.cumulative_interval == 0 &&
                              since_anchor > 1;
  if (!anchor && keep_anchor_state && (cumulative_due || settings_.anchor_max_fraction > 0)) {
    std::vector<TensorView> views = state_.views();
    Result<std::vector<TensorChanges>> since = DetectChanges(anchor_state_, views, Detection());
    if (!since.ok()) return fail(since.status());
    Result<EncodedPatch> encoded = EncodeDeltaFrom(version, last_anchor_, anchor_hash_, anchor_state_, *since);
    if (!encoded.ok()) return fail(encoded.status());
    if (settings_.anchor_max_fraction > 0 &&
        static_cast<double>(encoded->size) > settings_.anchor_max_fraction * static_cast<double>(last_anchor_bytes_)) {
      anchor = true;  // adaptive: the cumulative change outgrew the last anchor
    } else if (cumulative_due) {
      cumulative = std::move(*encoded);
    }
  }

  // The delta's hash change when Prepare left it for later (gap_delta):
  // summed beside the upload below, or here when an anchor's check needs it
  // (sync/deferred_state_hash.h: the manifest's hash is the state published).
  DeferredStateHash later_hash(std::move(prepared.hash_later));
  if (anchor && later_hash.pending()) {
    Result<StateHash> change = later_hash.Join();
    if (!change.ok()) return fail(change.status().WithContext("version " + std::to_string(version)));
    next_hash += *change;
  }
  EncodedPatch full;
  std::vector<TensorView> full_views;
  if (anchor) {
    if (!first && HashState(state_, options_.threads) != next_hash) {
      return fail(Status::Internal("version " + std::to_string(version) +
                                   ": incremental state hash disagrees with a full recomputation"));
    }
    full_views = next_state.views();
    Result<EncodedPatch> encoded = compact ? EncodeCompressedAnchor(version, full_views, options_.threads)
                                           : EncodeAnchor(version, full_views);
    if (!encoded.ok()) return fail(encoded.status());
    full = std::move(*encoded);
  }
  stats.detect_encode_ms = clock.ElapsedMs();
  stats.total_elements = next_state.total_elements();
  stats.full_bytes = next_state.total_bytes();

  // Objects first, manifest last: a reader never sees a version whose objects
  // are missing.
  Stopwatch upload_clock;
  VersionEntry entry;
  entry.version = version;
  entry.total_elements = stats.total_elements;
  entry.changed_elements = stats.changed_elements;
  entry.created_unix_ms = UnixMillis();
  entry.files = std::move(files);
  const uint64_t upload_total =
      (first ? 0 : delta.size) + cumulative.size + (anchor ? full.size : 0);
  uint64_t uploaded_bytes = 0;
  auto upload = [&](PatchKind kind, const std::string& key, const EncodedPatch& patch,
                    std::optional<uint64_t> base) -> Status {
    if (options_.progress) options_.progress(uploaded_bytes, upload_total);
    // The object's checksum on a second thread while this one writes it
    // (both only read the parts): the write and its fsync otherwise run
    // alone, then the checksum alone.
    std::string checksum;
    Status put;
    std::vector<std::thread> hasher;  // none when the system refuses a thread (thread_start.h)
    hasher.reserve(1);
    if (patch.size >= kOverlapChecksumBytes && ResolveThreads(options_.threads) > 1 &&
        TryStartThread(hasher, [&] { checksum = Xxh3Hex(patch.parts); })) {
      put = store_->Put(key, patch.parts);
      hasher[0].join();
    } else {
      put = store_->Put(key, patch.parts);
      if (put.ok()) checksum = Xxh3Hex(patch.parts);
    }
    DS_RETURN_IF_ERROR(put);
    uploaded_bytes += patch.size;
    if (options_.progress) options_.progress(uploaded_bytes, upload_total);
    IndexEncoding encoding = kind == PatchKind::kAnchor && !compact ? IndexEncoding::kRaw : settings_.encoding;
    entry.objects.push_back(ObjectEntry{kind, key, encoding, patch.size, std::move(checksum), base, {}});
    return Status::OK();
  };
  // Refused before any upload when another publisher committed meanwhile (same keys).
  Status uploaded = CheckNoOtherCommit(*store_, writer_id_, manifest_, manifest_token_, version);
  later_hash.Start();
  if (uploaded.ok() && !first) {
    uploaded = upload(PatchKind::kDelta, compact ? CompactDeltaKey(version) : DeltaKey(version), delta, previous);
    stats.wrote_delta = uploaded.ok();
    stats.delta_bytes = delta.size;
  }
  if (uploaded.ok() && cumulative.size > 0) {
    uploaded = upload(PatchKind::kDelta, CumulativeDeltaKey(last_anchor_, version, settings_.encoding), cumulative,
                      last_anchor_);
    stats.cumulative_bytes = cumulative.size;
  }
  if (uploaded.ok() && anchor) {
    uploaded = upload(PatchKind::kAnchor, compact ? CompressedAnchorKey(version) : AnchorKey(version), full,
                      std::nullopt);
    stats.wrote_anchor = uploaded.ok();
    stats.anchor_bytes = full.size;
  }
  // Taken before the manifest's entry is written, and before a rollback.
  Result<StateHash> change = later_hash.Join();
  if (uploaded.ok() && !change.ok()) uploaded = change.status();
  if (uploaded.ok()) {
    next_hash += *change;
    entry.state_hash = next_hash;
    Manifest next = manifest_;
    next.settings = settings_;
    next.anchor_interval = settings_.anchor_interval;
    next.versions.push_back(std::move(entry));
    uploaded = CommitManifest(std::move(next));
  }
  if (!uploaded.ok()) {
    return fail(uploaded.WithContext("publishing version " + std::to_string(version) + " to " + store_->Describe()));
  }
  stats.upload_ms = upload_clock.ElapsedMs();

  if (first) state_ = std::move(*first_state);
  state_hash_ = next_hash;
  degraded_reason_.clear();  // the state is known again
  if (anchor) {
    last_anchor_ = version;
    last_anchor_bytes_ = full.size;
    versions_since_anchor_ = 0;
    if (keep_anchor_state) RememberAnchor();
  } else {
    versions_since_anchor_++;
  }
  stats.state_hash = next_hash;
  if (prepared.recycle == Prepared::Recycle::kStreamBuffers && buffers_) {
    buffers_->Give(std::move(delta.owned), delta.size);
    delta = EncodedPatch{};
  } else if (prepared.recycle == Prepared::Recycle::kKeptPatch) {
    kept_patch_ = std::move(delta);
  }
  // Committed: wake replica daemons (fire and forget, never fails the publish).
  NotifyAfterCommit(notifier_, options_, version);
  return stats;
}

void Publisher::ReleaseBuffers() {
  if (buffers_) buffers_->Release();
  kept_changes_ = {};
  kept_old_ = {};
  kept_patch_ = EncodedPatch{};
  if (gap_) gap_->Release();
}

void Publisher::RememberAnchor() {
  std::vector<TensorView> views = state_.views();
  Result<WeightState> copy = WeightState::FromViews(views);
  anchor_state_ = std::move(*copy);  // cannot fail: state_ is valid
  anchor_hash_ = state_hash_;
}

Status Publisher::CommitManifest(Manifest next) {
  return deltasync::CommitManifest(*store_, writer_id_, manifest_, manifest_token_, std::move(next));
}

}  // namespace deltasync
