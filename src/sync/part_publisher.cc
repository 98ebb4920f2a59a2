// PartPublisher (part_publisher.h): one rank's part of a version. The fused
// compact pass (bf16/compact_scan.h) runs on the part's blocks as if they were
// tensors (gaps count in the block's row-major order, contexts come from the
// block's base values); only the state hash needs the full tensors' flat
// indices, so the changes' terms are computed from the scan's old and new
// values through the block's geometry.
#include "deltasync/part_publisher.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "bf16/compact_scan.h"
#include "common/parallel.h"
#include "codec/compact_bf16.h"
#include "deltasync/compact.h"
#include "deltasync/replica.h"
#include "sync/bucket_settings.h"
#include "sync/manifest_writer.h"
#include "sync/part_rebuild.h"
#include "sync/part_settings.h"

namespace deltasync {
namespace {

std::string V(uint64_t version) { return "version " + std::to_string(version); }

}  // namespace

Result<BucketSettings> PartedSettings(const PublisherOptions& options, const Manifest* manifest,
                                      const std::string& bucket) {
  DS_ASSIGN_OR_RETURN(ResolvedSettings resolved, ResolveSettings(options, manifest, bucket));
  const BucketSettings& s = resolved.settings;
  if (s.encoding != IndexEncoding::kCompact) {
    return Status::FailedPrecondition(bucket + " is published as " + std::string(EncodingName(s.encoding)) +
                                      "; parts are compact only (TRL encodings stay single-part): publish from one "
                                      "process, or to a compact bucket");
  }
  if (s.cumulative_interval > 0 || s.anchor_max_fraction > 0) {
    return Status::FailedPrecondition(
        bucket + " uses " + (s.cumulative_interval > 0 ? "cumulative deltas" : "adaptive anchors") +
        ", which parted publishing does not support (they keep a second copy of every block); publish from one "
        "process, or change the bucket's settings (--change-settings with --cumulative-interval 0 "
        "--anchor-max-fraction 0)");
  }
  return s;
}

Status CheckNextVersion(uint64_t version, uint64_t latest, bool allow_jump, const std::string& bucket) {
  if (version == 0) return Status::InvalidArgument("version must be a positive integer, got 0");
  if (version > kMaxPublishVersion) {
    return Status::InvalidArgument(V(version) + " is above 2^53-1 (" + std::to_string(kMaxPublishVersion) +
                                   "), the largest integer every JSON reader of the manifest keeps exact");
  }
  if (version <= latest) {
    return Status::InvalidArgument(V(version) + " is not newer than the latest published version " +
                                   std::to_string(latest) + " in " + bucket);
  }
  if (latest > 0 && version - latest > kMaxVersionJump && !allow_jump) {
    return Status::InvalidArgument(V(version) + " is " + std::to_string(version - latest) + " past the newest " +
                                   V(latest) + " in " + bucket + " (more than " + std::to_string(kMaxVersionJump) +
                                   "); if that is intended, pass allow_version_jump=True");
  }
  return Status::OK();
}

DType PublishedDType(std::string_view name, DType source, const PublisherOptions& options) {
  if (source == DType::kF32) {
    for (const std::string& suffix : options.keep_fp32_suffixes) {
      if (name.ends_with(suffix)) return DType::kF32;
    }
    return DType::kBF16;
  }
  return source;
}

PartPublisher::~PartPublisher() = default;

Result<std::unique_ptr<PartPublisher>> PartPublisher::Open(std::shared_ptr<Store> store, PartLayout layout,
                                                           uint32_t part, PublisherOptions options) {
  DS_RETURN_IF_ERROR(layout.Validate());
  if (part >= layout.parts.size()) {
    return Status::InvalidArgument("part " + std::to_string(part) + " of a layout of " +
                                   std::to_string(layout.parts.size()) + " parts");
  }
  std::unique_ptr<PartPublisher> pub(new PartPublisher());
  pub->store_ = store;
  pub->options_ = options;
  pub->digest_ = layout.Digest();
  pub->layout_ = std::move(layout);
  pub->part_ = part;
  Result<Manifest> manifest = FetchManifest(*store);
  if (!manifest.ok() && manifest.status().code() != ErrorCode::kNotFound) return manifest.status();
  DS_ASSIGN_OR_RETURN(pub->settings_,
                      PartedSettings(options, manifest.ok() ? &*manifest : nullptr, store->Describe()));
  if (!manifest.ok() || manifest->versions.empty()) return pub;

  // Continue where the bucket stands: the part's blocks of its newest
  // state, rebuilt from the objects they depend on only (part_rebuild.h).
  for (const VersionEntry& v : manifest->versions) {
    if (v.anchor()) pub->last_anchor_ = v.version;
  }
  const uint64_t latest = manifest->Latest()->version;
  Result<RebuiltPart> rebuilt = RebuildPart(*store, *manifest, pub->layout_, part, options.threads);
  if (!rebuilt.ok()) {
    if (rebuilt.status().code() == ErrorCode::kInvalidArgument) return rebuilt.status();
    return rebuilt.status().WithContext("cannot continue publishing part " + std::to_string(part) + " to " +
                                        store->Describe() + ": rebuilding " + V(latest) + " failed");
  }
  pub->state_ = std::move(rebuilt->blocks);
  pub->hash_ = rebuilt->hash;
  pub->latest_ = latest;
  return pub;
}

DetectOptions PartPublisher::Detection() const {
  return DetectOptions{options_.allow_nonfinite, options_.threads, [this](std::string_view name) {
                         auto it = std::lower_bound(layout_.tensors.begin(), layout_.tensors.end(), name,
                                                    [](const TensorDesc& t, std::string_view n) { return t.name < n; });
                         return it != layout_.tensors.end() && it->name == name && it->dtype == DType::kF32;
                       }};
}

Status PartPublisher::CheckBlocks(std::span<const TensorView> blocks) const {
  const std::vector<Block>& want = layout_.parts[part_];
  std::map<std::string_view, const TensorView*> given;
  for (const TensorView& b : blocks) {
    if (!given.emplace(b.name, &b).second) return Status::InvalidArgument("block of '" + b.name + "' given twice");
  }
  for (const Block& b : want) {
    const TensorDesc& d = layout_.tensors[b.tensor];
    auto it = given.find(d.name);
    if (it == given.end()) {
      return Status::InvalidArgument("part " + std::to_string(part_) + ": no block given for '" + d.name + "'");
    }
    const TensorView& v = *it->second;
    if (v.shape != b.shape) {
      return Status::InvalidArgument("part " + std::to_string(part_) + ": the block of '" + d.name + "' is " +
                                     ShapeToString(v.shape) + "; the layout says " + ShapeToString(b.shape));
    }
    const bool fits = d.dtype == DType::kBF16 ? (v.dtype == DType::kBF16 || v.dtype == DType::kF32) : v.dtype == d.dtype;
    if (!fits) {
      return Status::InvalidArgument("part " + std::to_string(part_) + ": the block of '" + d.name + "' is " +
                                     std::string(DTypeName(v.dtype)) + "; the layout publishes it as " +
                                     std::string(DTypeName(d.dtype)));
    }
    given.erase(it);
  }
  if (!given.empty()) {
    return Status::InvalidArgument("part " + std::to_string(part_) + ": '" + std::string(given.begin()->first) +
                                   "' is not a block of this part in the layout");
  }
  return Status::OK();
}

PartReceipt PartPublisher::NewReceipt(uint64_t version) const {
  PartReceipt r;
  r.version = version;
  r.part = part_;
  r.parts = static_cast<uint32_t>(layout_.parts.size());
  r.layout = digest_;
  return r;
}

Result<PartReceipt> PartPublisher::Publish(uint64_t version, std::span<const TensorView> blocks) {
  if (pending_) {
    return Status::FailedPrecondition(V(pending_->version) + " of part " + std::to_string(part_) +
                                      " is still pending; call Finish with the committer's outcome first");
  }
  DS_RETURN_IF_ERROR(CheckNextVersion(version, latest_, options_.allow_version_jump, store_->Describe()));
  DS_RETURN_IF_ERROR(CheckBlocks(blocks));
  // Another job committed since this part's view (a zombie beside its
  // restarted job): this version's part keys are its too; upload nothing.
  // A HEAD suffices while the manifest is the one the committer wrote.
  Result<std::string> token = manifest_token_ ? store_->Token(kManifestKey) : Status::NotFound("no token held");
  if (!token.ok() || *token != *manifest_token_) {
    Result<Manifest> now = FetchManifest(*store_);
    if (!now.ok() && now.status().code() != ErrorCode::kNotFound) return now.status();
    const uint64_t newest = now.ok() && now->Latest() ? now->Latest()->version : 0;
    if (newest != latest_) return OtherPublisherConflict(*store_, newest, latest_, version);
  }
  const bool anchor = AnchorDue(settings_, version, latest_, last_anchor_);
  if (latest_ > 0) return PublishDelta(version, blocks, anchor);

  DS_ASSIGN_OR_RETURN(WeightState first, ToPublishedState(blocks, Detection()));
  const StateHash hash = HashPart(layout_, part_, first, options_.threads);
  std::vector<TensorView> views = first.views();
  DS_ASSIGN_OR_RETURN(EncodedPatch encoded, EncodeCompressedAnchor(version, views, options_.threads));
  const std::string key = PartAnchorKey(version, part_, layout_.parts.size());
  DS_RETURN_IF_ERROR(store_->Put(key, encoded.parts).WithContext("publishing part " + std::to_string(part_) + " of " +
                                                                  V(version) + " to " + store_->Describe()));
  PartReceipt r = NewReceipt(version);
  r.state_hash = hash;
  r.changed_elements = first.total_elements();
  r.objects.push_back({PatchKind::kAnchor, key, encoded.size, Xxh3Hex(encoded.parts), 0});
  pending_ = Pending{version, true, hash, std::move(first), {}};
  return r;
}

Result<PartReceipt> PartPublisher::PublishDelta(uint64_t version, std::span<const TensorView> blocks, bool anchor) {
  const int threads = options_.threads;
  if (!scan_) {
    scan_ = std::make_unique<bf16::CompactScan>();
    // Blocks that are one run of their full tensor (FSDP2's row ranges) get
    // their hash terms from the fused pass itself; otherwise each change's
    // term is computed afterwards at its full flat index.
    std::vector<bf16::CompactScan::HashFrame> frames;
    framed_ = true;
    for (const WeightState::Tensor& t : state_.tensors()) {
      for (const Block& b : layout_.parts[part_]) {
        if (layout_.tensors[b.tensor].name != t.name) continue;
        const BlockGeometry g = layout_.Geometry(b);
        if (g.runs() != 1) framed_ = false;
        frames.push_back({g.full_shape(), g.RunStart(0)});
      }
    }
    if (framed_) scan_->SetHashFrames(std::move(frames));
  }
  DS_RETURN_IF_ERROR(scan_->Run(state_, blocks, Detection()));
  std::vector<TensorChanges> others = std::move(scan_->other_changes());
  PatchInfo info;
  info.kind = PatchKind::kDelta;
  info.model_version = version;
  info.base_version = latest_;
  Result<EncodedPatch> delta =
      EncodeScannedCompactDelta(info, hash_, state_, *scan_, others, threads, options_.compact_stream_version,
                                options_.compact_container);
  if (!delta.ok()) {
    scan_->Undo(threads);
    return delta.status();
  }
  auto geometry = [&](std::string_view name) {
    for (const Block& b : layout_.parts[part_]) {
      if (layout_.tensors[b.tensor].name == name) return layout_.Geometry(b);
    }
    return BlockGeometry();  // unreachable: the scan's tensors are the part's blocks
  };
  // The hash: each change's term at its full flat index.
  StateHash next = hash_;
  uint64_t changed = scan_->bf16_changed();
  if (framed_) {
    next += scan_->bf16_hash_delta();
  } else {
    std::vector<uint64_t> indices;
    std::vector<uint8_t> old_values, new_values;
    for (size_t i = 0; i < scan_->tensors(); ++i) {
      scan_->ChangesOf(i, indices, old_values, new_values);
      next += HashBlockChanges(scan_->name(i), DType::kBF16, geometry(scan_->name(i)), indices, old_values, new_values);
    }
  }
  // Other dtypes: found, not applied by the scan; applied here with their old values kept.
  std::vector<std::vector<uint8_t>> others_old(others.size());
  for (size_t i = 0; i < others.size(); ++i) {
    const TensorChanges& c = others[i];
    const WeightState::Tensor* t = state_.Find(c.name);
    const size_t width = DTypeSize(c.dtype);
    others_old[i].resize(c.values.size());
    for (size_t k = 0; k < c.indices.size(); ++k) {
      std::memcpy(others_old[i].data() + k * width, t->data.data() + c.indices[k] * width, width);
    }
    next += HashBlockChanges(c.name, c.dtype, geometry(c.name), c.indices, others_old[i], c.values);
    changed += c.count();
  }
  ApplyChanges(state_, others, threads);
  auto rollback = [this, threads, others = std::move(others), others_old = std::move(others_old)]() mutable {
    for (size_t i = 0; i < others.size(); ++i) std::swap(others[i].values, others_old[i]);
    ApplyChanges(state_, others, threads);
    for (size_t i = 0; i < others.size(); ++i) std::swap(others[i].values, others_old[i]);
    scan_->Undo(threads);
  };
  auto fail = [&](Status s) {
    rollback();
    return s.WithContext("publishing part " + std::to_string(part_) + " of " + V(version) + " to " +
                         store_->Describe());
  };

  PartReceipt r = NewReceipt(version);
  r.base_version = latest_;
  r.state_hash = next;
  r.changed_elements = changed;
  const std::string delta_key = PartDeltaKey(version, latest_, part_, layout_.parts.size());
  if (Status s = store_->Put(delta_key, delta->parts); !s.ok()) return fail(s);
  r.objects.push_back({PatchKind::kDelta, delta_key, delta->size, Xxh3Hex(delta->parts), latest_});
  if (anchor) {
    if (HashPart(layout_, part_, state_, threads) != next) {
      return fail(Status::Internal("part " + std::to_string(part_) + " of " + V(version) +
                                   ": incremental state hash disagrees with a full recomputation"));
    }
    std::vector<TensorView> views = state_.views();
    Result<EncodedPatch> full = EncodeCompressedAnchor(version, views, threads);
    if (!full.ok()) return fail(full.status());
    const std::string key = PartAnchorKey(version, part_, layout_.parts.size());
    if (Status s = store_->Put(key, full->parts); !s.ok()) return fail(s);
    r.objects.push_back({PatchKind::kAnchor, key, full->size, Xxh3Hex(full->parts), 0});
  }
  pending_ = Pending{version, anchor, next, std::nullopt, std::move(rollback)};
  return r;
}

void PartPublisher::Finish(bool committed, std::optional<std::string> manifest_token) {
  if (!pending_) return;
  Pending p = std::move(*pending_);
  pending_.reset();
  manifest_token_.reset();
  if (!committed) {
    if (p.rollback) p.rollback();
    return;
  }
  manifest_token_ = std::move(manifest_token);
  if (p.first) state_ = std::move(*p.first);
  hash_ = p.hash;
  latest_ = p.version;
  if (p.anchor) last_anchor_ = p.version;
}

// One process publishing every part (a model folder, folder_parts.h): the
// newest state is rebuilt once and cut into each part's blocks. (Kept apart
// from Open, which rebuilds per part.)
Result<std::vector<std::unique_ptr<PartPublisher>>> PartPublisher::OpenAll(std::shared_ptr<Store> store,
                                                                           PartLayout layout,
                                                                           PublisherOptions options) {
  DS_RETURN_IF_ERROR(layout.Validate());
  const size_t n = layout.parts.size();
  Result<Manifest> manifest = FetchManifest(*store);
  if (!manifest.ok() && manifest.status().code() != ErrorCode::kNotFound) return manifest.status();
  DS_ASSIGN_OR_RETURN(BucketSettings settings,
                      PartedSettings(options, manifest.ok() ? &*manifest : nullptr, store->Describe()));
  // The parts publish side by side: the threads are shared between them.
  PublisherOptions each = options;
  each.threads = std::max(1, ResolveThreads(options.threads) / static_cast<int>(n));
  const std::string digest = layout.Digest();
  std::vector<std::unique_ptr<PartPublisher>> pubs;
  for (uint32_t part = 0; part < n; ++part) {
    std::unique_ptr<PartPublisher> pub(new PartPublisher());
    pub->store_ = store;
    pub->options_ = each;
    pub->settings_ = settings;
    pub->digest_ = digest;
    pub->layout_ = layout;
    pub->part_ = part;
    pubs.push_back(std::move(pub));
  }
  if (!manifest.ok() || manifest->versions.empty()) return pubs;

  uint64_t last_anchor = 0;
  for (const VersionEntry& v : manifest->versions) {
    if (v.anchor()) last_anchor = v.version;
  }
  const uint64_t latest = manifest->Latest()->version;
  std::unique_ptr<Replica> replica = Replica::Create(store, ReplicaWithThreads(options.threads));
  if (Result<UpdateStats> caught_up = replica->Update(latest); !caught_up.ok()) {
    return caught_up.status().WithContext("cannot continue publishing to " + store->Describe() + ": rebuilding " +
                                          V(latest) + " failed");
  }
  // Every tensor, those without elements included (they have no block, so
  // cutting the parts below would not see them): a layout that names another
  // would commit a version no replica can reach from this one.
  std::vector<TensorDesc> held;
  for (const WeightState::Tensor& t : replica->state().tensors()) held.push_back({t.name, t.dtype, t.shape});
  DS_RETURN_IF_ERROR(SameTensors(layout, held, latest, *store));
  for (std::unique_ptr<PartPublisher>& pub : pubs) {
    Result<WeightState> blocks = ExtractPart(pub->layout_, pub->part_, replica->state());
    if (!blocks.ok()) {
      return blocks.status().WithContext("the layout does not fit " + V(latest) + " of " + store->Describe());
    }
    pub->state_ = std::move(*blocks);
    pub->hash_ = HashPart(pub->layout_, pub->part_, pub->state_, options.threads);
    pub->latest_ = latest;
    pub->last_anchor_ = last_anchor;
  }
  return pubs;
}

}  // namespace deltasync
