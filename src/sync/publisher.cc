// Publisher: detect -> encode -> upload objects -> commit the manifest.
//
// The publisher keeps the last published bf16 state in memory (like TRL v1)
// and advances it in place. A failed publish must leave it unchanged, so the
// changes are applied with an undo log (the old values of the changed
// elements: proportional to the delta, not the model) and rolled back when
// anything after the apply fails.
#include "deltasync/publisher.h"

#include <chrono>
#include <cstring>

#include "common/clock.h"
#include "deltasync/replica.h"

#include <unistd.h>

#include <random>
#include "sync/notifier.h"

namespace deltasync {
namespace {

// The old values at the changed positions, for rollback.
std::vector<TensorChanges> UndoLogFor(const WeightState& state, std::span<const TensorChanges> changes) {
  std::vector<TensorChanges> undo;
  undo.reserve(changes.size());
  for (const TensorChanges& c : changes) {
    const WeightState::Tensor* t = state.Find(c.name);
    size_t width = DTypeSize(c.dtype);
    TensorChanges u{c.name, c.dtype, c.indices, std::vector<uint8_t>(c.values.size())};
    for (size_t k = 0; k < c.indices.size(); ++k) {
      std::memcpy(&u.values[k * width], &t->data[c.indices[k] * width], width);
    }
    undo.push_back(std::move(u));
  }
  return undo;
}

uint64_t CountChanged(std::span<const TensorChanges> changes) {
  uint64_t n = 0;
  for (const TensorChanges& c : changes) n += c.count();
  return n;
}

}  // namespace

Result<std::unique_ptr<Publisher>> Publisher::Open(std::shared_ptr<Store> store, PublisherOptions options) {
  if (options.anchor_interval == 0) {
    return Status::InvalidArgument("anchor interval must be at least 1");
  }
  std::unique_ptr<Publisher> pub(new Publisher(store, options));
  // A random id per Publisher instance: "<host>-<pid>-<64 random bits>".
  char host[64] = "host";
  ::gethostname(host, sizeof host - 1);
  std::random_device rd;
  char id[160];
  std::snprintf(id, sizeof id, "%s-%d-%08x%08x", host, static_cast<int>(::getpid()), rd(), rd());
  pub->writer_id_ = id;
  for (char& c : pub->writer_id_) {
    if (c < 0x21 || c > 0x7E) c = '_';
  }
  Result<Store::Versioned> current = store->GetVersioned(kManifestKey);
  if (!current.ok()) {
    if (current.status().code() != ErrorCode::kNotFound) return current.status();
    pub->manifest_.anchor_interval = options.anchor_interval;
    return pub;
  }
  DS_ASSIGN_OR_RETURN(pub->manifest_,
                      Manifest::Parse(current->blob.bytes(), store->Describe() + "/" + std::string(kManifestKey)));
  pub->manifest_token_ = current->token;
  if (pub->manifest_.versions.empty()) return pub;

  // Continue where the bucket stands: rebuild its newest state, verified.
  std::unique_ptr<Replica> replica = Replica::Create(store, ReplicaOptions{options.threads});
  Result<UpdateStats> caught_up = replica->Update(pub->manifest_.Latest()->version);
  if (!caught_up.ok()) {
    return caught_up.status().WithContext("cannot continue publishing to " + store->Describe() +
                                          ": rebuilding its newest version failed");
  }
  pub->state_hash_ = replica->state_hash();
  pub->state_ = std::move(*replica).ReleaseState();
  for (const VersionEntry& v : pub->manifest_.versions) {
    if (v.anchor()) pub->last_anchor_ = v.version;
  }
  pub->manifest_.anchor_interval = options.anchor_interval;
  return pub;
}

uint64_t Publisher::latest_version() const {
  const VersionEntry* latest = manifest_.Latest();
  return latest ? latest->version : 0;
}

Result<PublishStats> Publisher::Publish(uint64_t version, std::span<const TensorView> tensors) {
  const uint64_t previous = latest_version();
  if (version == 0) return Status::InvalidArgument("version must be a positive integer, got 0");
  if (version <= previous) {
    return Status::InvalidArgument("version " + std::to_string(version) + " is not newer than the latest published version " +
                                   std::to_string(previous) + " in " + store_->Describe());
  }
  PublishStats stats;
  stats.version = version;
  DetectOptions detect{options_.allow_nonfinite, options_.threads, [this](std::string_view name) {
                         for (const std::string& suffix : options_.keep_fp32_suffixes) {
                           if (name.ends_with(suffix)) return true;
                         }
                         return false;
                       }};
  Stopwatch detect_clock;

  const bool first = previous == 0;
  const bool anchor = first || version / options_.anchor_interval > last_anchor_ / options_.anchor_interval;
  std::vector<TensorChanges> changes;
  std::vector<TensorChanges> undo;
  EncodedPatch delta;
  StateHash next_hash;
  WeightState first_state;

  if (first) {
    DS_ASSIGN_OR_RETURN(first_state, ToPublishedState(tensors, detect));
    next_hash = HashState(first_state, options_.threads);
    stats.changed_elements = first_state.total_elements();
  } else {
    DS_ASSIGN_OR_RETURN(changes, DetectChanges(state_, tensors, detect));
    stats.changed_elements = CountChanged(changes);
    PatchInfo info;
    info.kind = PatchKind::kDelta;
    info.model_version = version;
    info.encoding = options_.encoding;
    info.base_version = previous;
    info.total_elements = state_.total_elements();
    DS_ASSIGN_OR_RETURN(delta, EncodeDelta(info, changes));
    next_hash = state_hash_ + HashChanges(state_, changes, options_.threads);
    undo = UndoLogFor(state_, changes);
    ApplyChanges(state_, changes, options_.threads);
  }
  WeightState& next_state = first ? first_state : state_;
  auto rollback = [&] {
    if (!first) ApplyChanges(state_, undo, options_.threads);
  };

  EncodedPatch full;
  if (anchor) {
    if (!first && HashState(state_, options_.threads) != next_hash) {
      rollback();
      return Status::Internal("version " + std::to_string(version) +
                              ": incremental state hash disagrees with a full recomputation");
    }
    std::vector<TensorView> views = next_state.views();
    Result<EncodedPatch> encoded = EncodeAnchor(version, views);
    if (!encoded.ok()) {
      rollback();
      return encoded.status();
    }
    full = std::move(*encoded);
  }
  stats.detect_encode_ms = detect_clock.ElapsedMs();
  stats.total_elements = next_state.total_elements();
  stats.full_bytes = next_state.total_bytes();

  // Objects first, manifest last: a reader never sees a version whose objects
  // are missing.
  Stopwatch upload_clock;
  VersionEntry entry;
  entry.version = version;
  entry.state_hash = next_hash;
  entry.total_elements = stats.total_elements;
  entry.changed_elements = stats.changed_elements;
  entry.created_unix_ms = UnixMillis();
  auto upload = [&](PatchKind kind, const std::string& key, const EncodedPatch& patch,
                    std::optional<uint64_t> base) -> Status {
    DS_RETURN_IF_ERROR(store_->Put(key, patch.parts));
    entry.objects.push_back(ObjectEntry{kind, key, kind == PatchKind::kAnchor ? IndexEncoding::kRaw : options_.encoding,
                                        patch.size, Xxh3Hex(patch.parts), base});
    return Status::OK();
  };
  Status uploaded = Status::OK();
  if (!first) {
    uploaded = upload(PatchKind::kDelta, DeltaKey(version), delta, previous);
    stats.wrote_delta = uploaded.ok();
    stats.delta_bytes = delta.size;
  }
  if (uploaded.ok() && anchor) {
    uploaded = upload(PatchKind::kAnchor, AnchorKey(version), full, std::nullopt);
    stats.wrote_anchor = uploaded.ok();
    stats.anchor_bytes = full.size;
  }
  if (uploaded.ok()) {
    Manifest next = manifest_;
    next.anchor_interval = options_.anchor_interval;
    uint64_t seq = manifest_.writer && manifest_.writer->id == writer_id_ ? manifest_.writer->seq : 0;
    next.writer = WriterStamp{writer_id_, seq + 1};
    next.versions.push_back(std::move(entry));
    uploaded = CommitManifest(std::move(next));
  }
  if (!uploaded.ok()) {
    rollback();
    return uploaded.WithContext("publishing version " + std::to_string(version) + " to " + store_->Describe());
  }
  stats.upload_ms = upload_clock.ElapsedMs();

  if (first) state_ = std::move(first_state);
  state_hash_ = next_hash;
  if (anchor) last_anchor_ = version;
  stats.state_hash = next_hash;
  // Committed: wake replica daemons (fire and forget, never fails the publish).
  NotifyAfterCommit(notifier_, options_, version);
  return stats;
}

Status Publisher::CommitManifest(Manifest next) {
  std::string json = next.ToJson();
  ByteSpan bytes(reinterpret_cast<const uint8_t*>(json.data()), json.size());
  Result<std::string> token =
      store_->PutIfUnchanged(kManifestKey, std::span<const ByteSpan>(&bytes, 1), manifest_token_);
  if (!token.ok()) {
    if (token.status().code() == ErrorCode::kConflict) {
      // A retried conditional write whose first attempt landed also ends in
      // a conflict: if the manifest now is exactly this writer's next
      // commit, it is ours, not another publisher's.
      Result<Store::Versioned> now = store_->GetVersioned(kManifestKey);
      if (now.ok()) {
        Result<Manifest> current = Manifest::Parse(now->blob.bytes());
        if (current.ok() && current->writer == next.writer && current->Latest() && next.Latest() &&
            current->Latest()->version == next.Latest()->version &&
            current->Latest()->state_hash == next.Latest()->state_hash) {
          manifest_token_ = now->token;
          manifest_ = std::move(next);
          return Status::OK();
        }
      }
      return Status::Conflict("another publisher wrote " + std::string(kManifestKey) +
                              " since this one read it; refusing to overwrite its history (" +
                              token.status().message() + ")");
    }
    return token.status();
  }
  manifest_token_ = *token;
  manifest_ = std::move(next);
  return Status::OK();
}

}  // namespace deltasync
