// Publisher::Prepare* (publisher.h): a new version's delta encoded from
// the published state and the changes applied to it, undoably, before
// Commit uploads anything: from a change list (PrepareChanges), detected
// and applied in one pass (PrepareDetected, raw), by the gap_delta
// publisher (PrepareGapDelta), or by the fused compact scan
// (PrepareScanned). Each returns its rollback; a failure leaves the state
// as it was.
#include "deltasync/publisher.h"

#include <algorithm>

#include "bf16/chunks.h"
#include "bf16/compact_scan.h"
#include "bf16/detect_apply.h"
#include "codec/compact_bf16.h"
#include "codec/stream_buffers.h"
#include "common/parallel.h"
#include "deltasync/compact.h"
#include "sync/gap_delta_publish.h"

namespace deltasync {
namespace {

uint64_t CountChanged(std::span<const TensorChanges> changes) {
  uint64_t n = 0;
  for (const TensorChanges& c : changes) n += c.count();
  return n;
}

}  // namespace

Result<Publisher::Prepared> Publisher::PrepareChanges(uint64_t version, std::vector<TensorChanges> changes) {
  const uint64_t previous = latest_version();
  Prepared p;
  p.changed = CountChanged(changes);
  // Encoded against the state before the changes (compact codes relative to it).
  DS_ASSIGN_OR_RETURN(p.delta, EncodeDeltaFrom(version, previous, state_hash_, state_, changes));
  if (options_.measure_gap_delta) {
    if (settings_.encoding == IndexEncoding::kGapDelta) {
      p.gap_delta_bytes = p.delta.size;
    } else {
      DS_ASSIGN_OR_RETURN(p.gap_delta_bytes, GapDeltaSize(version, changes));
    }
  }
  p.next_hash = state_hash_;
  p.rollback = ApplyWithUndo(std::move(changes), &p.next_hash);
  return p;
}

Result<Publisher::Prepared> Publisher::PrepareDetected(uint64_t version, std::span<const TensorView> tensors) {
  // Detected and applied in one pass (bf16/detect_apply.h); the delta is
  // encoded from the same change list, which holds the new values.
  StateHash delta_hash;
  DS_RETURN_IF_ERROR(bf16::DetectAndApply(state_, tensors, Detection(), bf16::kDefaultChunkElements, kept_changes_,
                                          kept_old_, &delta_hash));
  const int threads = options_.threads;
  Prepared p;
  p.rollback = [this, threads] { UndoChanges(state_, kept_changes_, kept_old_, threads); };
  p.changed = CountChanged(kept_changes_);
  p.next_hash = state_hash_ + delta_hash;
  // The patch's info counts the state's elements, which applying does not change.
  Status encoded = EncodeDelta(DeltaInfo(version, latest_version(), state_), kept_changes_, kept_patch_);
  if (encoded.ok() && options_.measure_gap_delta) {  // raw: gap_delta's size measured apart
    Result<uint64_t> size = GapDeltaSize(version, kept_changes_);
    encoded = size.status();
    if (size.ok()) p.gap_delta_bytes = *size;
  }
  if (!encoded.ok()) {
    p.rollback();
    return encoded;
  }
  p.delta = std::move(kept_patch_);
  p.recycle = Prepared::Recycle::kKeptPatch;
  return p;
}

Result<Publisher::Prepared> Publisher::PrepareGapDelta(uint64_t version, std::span<const TensorView> tensors) {
  if (!gap_) gap_ = std::make_unique<GapDeltaPublish>();
  const int threads = options_.threads;
  const PatchInfo info = DeltaInfo(version, latest_version(), state_);
  Prepared p;
  if (ResolveThreads(threads) > 1) {
    // The hash terms of the 2-byte changes (~20% of the scan's CPU) summed
    // from the delta's streams while Commit writes the delta, whose fsync
    // leaves the cores idle, instead of in the scan. The other dtypes' terms
    // are in next_hash already.
    DS_ASSIGN_OR_RETURN(StateHash scanned, gap_->RunHashLater(state_, tensors, Detection(), info));
    p.next_hash = state_hash_ + scanned;
    p.hash_later = [this, threads] { return gap_->HashLater(threads); };
  } else {
    DS_ASSIGN_OR_RETURN(StateHash delta_hash, gap_->Run(state_, tensors, Detection(), info));
    p.next_hash = state_hash_ + delta_hash;
  }
  p.delta = gap_->TakePatch();
  p.changed = gap_->changed();
  if (options_.measure_gap_delta) p.gap_delta_bytes = p.delta.size;
  p.rollback = [this, threads] { gap_->Undo(state_, threads); };
  return p;
}

std::function<void()> Publisher::ApplyWithUndo(std::vector<TensorChanges> changes, StateHash* hash) {
  struct Undo {
    std::vector<TensorChanges> changes;
    std::vector<std::vector<uint8_t>> old;  // old values, per entry of `changes`
  };
  auto undo = std::make_shared<Undo>();
  undo->changes = std::move(changes);
  const int threads = options_.threads;
  *hash += ApplyChangesWithUndo(state_, undo->changes, threads, undo->old);
  return [this, undo, threads] { UndoChanges(state_, undo->changes, undo->old, threads); };
}

// The fused route (bf16/compact_scan.h): one pass finds, codes and applies
// the bf16 changes; other dtypes go the plain way.
Result<Publisher::Prepared> Publisher::PrepareScanned(uint64_t version, std::span<const TensorView> tensors) {
  if (!scan_) scan_ = std::make_unique<bf16::CompactScan>();
  DS_RETURN_IF_ERROR(scan_->Run(state_, tensors, Detection()));
  const int threads = options_.threads;
  std::vector<TensorChanges>& others = scan_->other_changes();
  PatchInfo info;
  info.kind = PatchKind::kDelta;
  info.model_version = version;
  info.base_version = latest_version();
  Prepared p;
  if (!buffers_) buffers_ = std::make_unique<compact::StreamBuffers>();
  Result<EncodedPatch> delta = EncodeScannedCompactDelta(info, state_hash_, state_, *scan_, others, threads,
                                                             options_.compact_stream_version,
                                                             options_.compact_container, buffers_.get());
  if (options_.measure_gap_delta && delta.ok()) {
    std::vector<TensorChanges> all = scan_->AppliedChanges();
    all.insert(all.end(), others.begin(), others.end());
    std::sort(all.begin(), all.end(), [](const TensorChanges& a, const TensorChanges& b) { return a.name < b.name; });
    Result<uint64_t> size = GapDeltaSize(version, all);
    if (!size.ok()) delta = size.status();
    p.gap_delta_bytes = size.ok() ? *size : 0;
  }
  if (!delta.ok()) {
    scan_->Undo(threads);
    return delta.status();
  }
  p.delta = std::move(*delta);
  p.recycle = Prepared::Recycle::kStreamBuffers;
  p.changed = scan_->bf16_changed() + CountChanged(others);
  p.next_hash = state_hash_ + scan_->bf16_hash_delta();
  std::function<void()> undo_others = ApplyWithUndo(std::move(others), &p.next_hash);
  p.rollback = [this, undo_others, threads] {
    undo_others();
    scan_->Undo(threads);
  };
  return p;
}

Result<uint64_t> Publisher::GapDeltaSize(uint64_t version, std::span<const TensorChanges> changes) const {
  PatchInfo info;
  info.model_version = version;
  info.encoding = IndexEncoding::kGapDelta;
  info.base_version = latest_version();
  info.total_elements = state_.total_elements();
  DS_ASSIGN_OR_RETURN(EncodedPatch trl, EncodeDelta(info, changes));
  return trl.size;
}

}  // namespace deltasync
