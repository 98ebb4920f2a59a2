// The watcher loop. One thread owns the Replica, so there is no locking
// around it: HTTP handlers talk to this thread through flags (pause, wake),
// a queue of move requests, and the snapshot, all under mu_. The lock is
// never held across a manifest read, an update or an export.
#include "server/follower.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/clock.h"

namespace deltasync::server {
namespace {

std::string V(uint64_t v) { return "version " + std::to_string(v); }

std::string Mb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

std::string Ms(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", ms);
  return buf;
}

}  // namespace

Follower::Follower(std::shared_ptr<Store> store, std::vector<std::unique_ptr<StateSink>> sinks, Metrics& metrics,
                   FollowerOptions options)
    : store_(std::move(store)),
      replica_(Replica::Create(store_, ReplicaWithThreads(options.threads))),
      sinks_(std::move(sinks)),
      exported_(sinks_.size(), 0),
      metrics_(metrics),
      options_(std::move(options)),
      jitter_rng_(std::random_device{}()) {}

Follower::~Follower() { Stop(); }

void Follower::Start() { thread_ = std::thread([this] { Run(); }); }

void Follower::Stop() {
  std::deque<Request> dropped;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    dropped.swap(requests_);
  }
  wake_cv_.notify_all();
  idle_cv_.notify_all();
  for (Request& r : dropped) {
    MoveOutcome out;
    out.kind = MoveOutcome::Kind::kUnavailable;
    out.status = Status::FailedPrecondition("the daemon is shutting down");
    r.answer->set_value(std::move(out));
  }
  if (thread_.joinable()) thread_.join();
  // The thread is gone; release the sinks now (the --shm object is marked
  // closed and unlinked) rather than whenever the Follower is destroyed.
  sinks_.clear();
  exported_.clear();
}

void Follower::Notify(uint64_t version) {
  {
    std::lock_guard lock(mu_);
    if (version <= snapshot_.version) return;
    wake_ = true;
  }
  wake_cv_.notify_all();
}

void Follower::Pause() {
  std::unique_lock lock(mu_);
  if (!paused_) Log("paused: holding " + V(snapshot_.version));
  paused_ = true;
  snapshot_.paused = true;
  // A cycle that started before the pause may still be moving; the engine
  // must not see a change after this returns.
  idle_cv_.wait(lock, [&] { return !busy_ || stopping_; });
}

void Follower::Resume() {
  {
    std::lock_guard lock(mu_);
    if (paused_) Log("resumed");
    paused_ = false;
    snapshot_.paused = false;
    wake_ = true;
  }
  wake_cv_.notify_all();
}

void Follower::BeginWeightUpdate() {
  std::unique_lock lock(mu_);
  in_weight_update_ = true;
  snapshot_.in_weight_update = true;
  idle_cv_.wait(lock, [&] { return !busy_ || stopping_; });
}

void Follower::FinishWeightUpdate() {
  {
    std::lock_guard lock(mu_);
    in_weight_update_ = false;
    snapshot_.in_weight_update = false;
    wake_ = true;
  }
  wake_cv_.notify_all();
}

MoveOutcome Follower::MoveToObject(const std::string& key, std::chrono::duration<double> timeout) {
  auto answer = std::make_shared<std::promise<MoveOutcome>>();
  std::future<MoveOutcome> future = answer->get_future();
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
      MoveOutcome out;
      out.kind = MoveOutcome::Kind::kUnavailable;
      out.status = Status::FailedPrecondition("the daemon is shutting down");
      return out;
    }
    requests_.push_back(Request{key, answer});
  }
  wake_cv_.notify_all();
  if (future.wait_for(timeout) != std::future_status::ready) {
    // The request still runs; its answer is dropped.
    MoveOutcome out;
    out.kind = MoveOutcome::Kind::kTimedOut;
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", timeout.count());
    out.status = Status::IOError(std::string("no answer within ") + seconds + " s");
    std::lock_guard lock(mu_);
    out.held = snapshot_.version;
    out.state_hash = snapshot_.state_hash;
    return out;
  }
  return future.get();
}

FollowerSnapshot Follower::Snapshot() const {
  std::lock_guard lock(mu_);
  return snapshot_;
}

void Follower::Run() {
  std::unique_lock lock(mu_);
  auto next_poll = std::chrono::steady_clock::now();  // catch up at once
  while (!stopping_) {
    // Move requests first: a caller is waiting for each.
    if (!requests_.empty()) {
      Request request = std::move(requests_.front());
      requests_.pop_front();
      busy_ = true;
      lock.unlock();
      MoveOutcome out;
      try {
        out = HandleMove(request.key);
      } catch (const std::exception& e) {  // std::bad_alloc: answer, keep running
        out.kind = MoveOutcome::Kind::kFailed;
        out.status = Status::Internal(e.what());
        RecordError("update", out.status);
      }
      request.answer->set_value(std::move(out));
      lock.lock();
      busy_ = false;
      idle_cv_.notify_all();
      continue;
    }
    if (wake_ || std::chrono::steady_clock::now() >= next_poll) {
      wake_ = false;
      const bool hold = paused_ || in_weight_update_;
      busy_ = true;
      lock.unlock();
      bool ok = false;
      try {
        ok = Cycle(hold);
      } catch (const std::exception& e) {  // std::bad_alloc: report, back off, retry
        RecordError("update", Status::Internal(e.what()));
      }
      lock.lock();
      busy_ = false;
      idle_cv_.notify_all();
      failures_ = ok ? 0 : failures_ + 1;
      next_poll = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(NextInterval());
      continue;
    }
    wake_cv_.wait_until(lock, next_poll);
  }
}

std::chrono::duration<double> Follower::NextInterval() {
  // Exponential backoff while failing, so an unreachable bucket is not
  // hammered; jitter so that many replicas started together do not poll in
  // lockstep.
  double base = options_.poll_seconds;
  if (failures_ > 0) {
    double cap = std::max(30.0, options_.poll_seconds);
    base = std::min(cap, options_.poll_seconds * std::pow(2.0, std::min(failures_, 16)));
  }
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  return std::chrono::duration<double>(base * jitter(jitter_rng_));
}

bool Follower::Cycle(bool hold) {
  Status read = ReadManifest();
  if (!read.ok()) {
    // Nothing published yet is the normal state of a daemon started before
    // its trainer: keep polling at the normal pace (the first version then
    // arrives within one interval), back off only on real failures.
    return read.code() == ErrorCode::kNotFound && replica_->version() == 0;
  }
  bool ok = ExportPending().ok();
  if (!hold) {
    const VersionEntry* latest = replica_->manifest().Latest();
    // Refresh refuses a manifest older than the held version, so "newer" is
    // the only other case.
    if (latest && latest->version != replica_->version()) {
      ok = MoveTo(latest->version).ok() && ok;
    } else {
      Log("up to date: holding " + V(replica_->version()), LogLevel::kDebug);
      ClearError("update");  // nothing left to move to
    }
  }
  return ok;
}

void Follower::ClearError(std::string_view stage) {
  std::lock_guard lock(mu_);
  ClearErrorLocked(stage);
}

void Follower::ClearErrorLocked(std::string_view stage) {
  // Only a success of the stage that failed clears its error: a held cycle
  // that reads the manifest fine says nothing about a failed update.
  if (!snapshot_.last_error || snapshot_.last_error->stage != stage) return;
  Log("recovered from the " + std::string(stage) + " failure: holding " + V(snapshot_.version));
  snapshot_.last_error.reset();
  last_logged_error_.clear();
}

Status Follower::ReadManifest() {
  Status refreshed = replica_->Refresh();
  if (refreshed.code() == ErrorCode::kNotFound && replica_->version() == 0) {
    // No manifest and nothing held: the trainer has not published yet. The
    // normal state of a daemon started first, not a failure.
    std::lock_guard lock(mu_);
    snapshot_.waiting_for_first_version = true;
    if (!logged_waiting_) Log("waiting for the first version (nothing is published in the bucket yet)");
    logged_waiting_ = true;
    return refreshed;
  }
  if (!refreshed.ok()) {
    RecordError("manifest", refreshed);
    return refreshed;
  }
  std::lock_guard lock(mu_);
  snapshot_.waiting_for_first_version = false;
  snapshot_.manifest_read_ever = true;
  snapshot_.last_manifest_read = std::chrono::steady_clock::now();
  PublishHeldLocked();
  ClearErrorLocked("manifest");
  return Status::OK();
}

Status Follower::MoveTo(uint64_t target, UpdateStats* stats_out) {
  const uint64_t from = replica_->version();
  Log(from == 0 ? "loading " + V(target) : "catching up from " + V(from) + " to " + V(target));
  // The replica routes around damaged or missing objects by itself
  // (Replica::Update) and remembers them, so a bad object is not fetched
  // again on every poll; each is logged once, when found.
  const size_t bad_before = replica_->bad_objects().size();
  Result<UpdateStats> stats = replica_->Update(target);
  {
    const std::vector<BadObject>& bad = replica_->bad_objects();
    for (size_t i = std::min(bad_before, bad.size()); i < bad.size(); ++i) {
      Log("bad object " + bad[i].key + " (" + V(bad[i].version) + ", " + KindName(bad[i].code) +
              "): planning around it: " + bad[i].reason,
          LogLevel::kError);
    }
    std::lock_guard lock(mu_);
    snapshot_.bad_objects = bad;
  }
  // Sinks first, then /status: nobody reads a version in /status that the
  // engine cannot see yet. A partial move (an error after some verified
  // versions) is shown too. The metrics and the cleared error are settled
  // before /status shows the version, so whoever sees the version there
  // also sees its counts in /metrics and no stale error.
  if (stats.ok()) {
    metrics_.RecordUpdate(*stats);
  }
  Status exported;
  if (replica_->version() != from) {
    exported = ExportPending();
    std::lock_guard lock(mu_);
    snapshot_.updated_unix_ms = UnixMillis();
    PublishHeldLocked();
    if (stats.ok()) ClearErrorLocked("update");
  }
  if (!stats.ok()) {
    RecordError("update", stats.status());
    return stats.status();
  }
  ClearError("update");
  if (stats_out) *stats_out = *stats;
  Log("holding " + V(replica_->version()) + " (state hash " + replica_->state_hash().Hex() + "; " +
      std::to_string(stats->anchors_applied) + " anchor(s) + " + std::to_string(stats->deltas_applied) +
      " delta(s), " + Mb(stats->bytes_downloaded) + " downloaded, apply " + Ms(stats->apply_ms) + ")");
  return exported;
}

Status Follower::ExportPending() {
  const uint64_t held = replica_->version();
  Status first_error;
  std::string export_error;
  for (size_t i = 0; i < sinks_.size() && held > 0; ++i) {
    if (exported_[i] == held) continue;
    Status s = sinks_[i]->Export(held, replica_->state_hash(), replica_->state(), replica_->manifest().FilesAt(held));
    if (s.ok()) {
      exported_[i] = held;
      continue;
    }
    RecordError("export", s);
    if (first_error.ok()) first_error = s;
    export_error = sinks_[i]->Describe() + " still shows " + V(exported_[i]) + ": " + s.message();
  }
  std::lock_guard lock(mu_);
  snapshot_.export_error = export_error;
  if (first_error.ok()) ClearErrorLocked("export");
  return first_error;
}

MoveOutcome Follower::HandleMove(const std::string& key) {
  MoveOutcome out;
  auto finish = [&](MoveOutcome::Kind kind) {
    out.kind = kind;
    out.held = replica_->version();
    out.state_hash = replica_->state_hash();
    return out;
  };
  Status read = ReadManifest();
  if (!read.ok()) {
    out.status = read;
    return finish(MoveOutcome::Kind::kUnavailable);
  }
  const VersionEntry* owner = nullptr;
  for (const VersionEntry& v : replica_->manifest().versions) {
    for (const ObjectEntry& o : v.objects) {
      for (const PartObject& stored : StoredObjects(o)) {
        if (stored.key == key) owner = &v;
      }
    }
  }
  if (!owner) return finish(MoveOutcome::Kind::kUnknownKey);
  out.version = owner->version;
  if (owner->version < replica_->version()) return finish(MoveOutcome::Kind::kOlder);
  if (owner->version == replica_->version()) {
    // No work, unless a sink still lags (then this retries it).
    out.status = ExportPending();
    return finish(out.status.ok() ? MoveOutcome::Kind::kAlreadyHeld : MoveOutcome::Kind::kFailed);
  }
  Log("update_weights: " + key + " is " + V(owner->version));
  out.status = MoveTo(owner->version, &out.stats);
  if (!out.status.ok()) return finish(MoveOutcome::Kind::kFailed);
  return finish(MoveOutcome::Kind::kMoved);
}

void Follower::RecordError(std::string_view stage, const Status& status) {
  metrics_.RecordError(stage, status.code());
  std::lock_guard lock(mu_);
  snapshot_.last_error = ErrorRecord{std::string(stage), status.code(), status.message(), UnixMillis()};
  // A persistent failure is logged once, not on every poll.
  std::string line = std::string(stage) + " failed: " + status.ToString() + " (holding " + V(snapshot_.version) + ")";
  if (line != last_logged_error_) {
    Log(line, LogLevel::kError);
    last_logged_error_ = line;
  }
}

void Follower::PublishHeldLocked() {
  snapshot_.version = replica_->version();
  snapshot_.state_hash = replica_->state_hash();
  snapshot_.bad_objects = replica_->bad_objects();  // forgotten once the manifest stops listing them
  const Manifest& m = replica_->manifest();
  snapshot_.latest_version = m.Latest() ? m.Latest()->version : 0;
  snapshot_.lag_versions = 0;
  snapshot_.oldest_pending_unix_ms = 0;
  for (const VersionEntry& v : m.versions) {
    if (v.version <= snapshot_.version) continue;
    if (snapshot_.lag_versions++ == 0) snapshot_.oldest_pending_unix_ms = v.created_unix_ms;
  }
}

void Follower::Log(const std::string& line, LogLevel level) const {
  if (options_.log) options_.log(level, line);
}

}  // namespace deltasync::server
