// Follower: the daemon's watcher thread. It owns the Replica (nothing else
// touches it), polls manifest.json, moves to the newest version unless held
// (paused, or inside a weight-update bracket), exports every version it
// reaches to the sinks, and runs explicit move requests (/update_weights)
// one at a time. Everything it knows about itself is in Snapshot().
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "deltasync/replica.h"
#include "deltasync/server.h"
#include "deltasync/store.h"
#include "server/metrics.h"
#include "server/sink.h"
#include "server/snapshot.h"

namespace deltasync::server {

struct FollowerOptions {
  double poll_seconds = 1.0;
  int threads = 0;
  std::function<void(LogLevel, std::string_view)> log;  // may be empty
};

// The answer to a move request.
struct MoveOutcome {
  enum class Kind {
    kMoved,        // now holds `version`
    kAlreadyHeld,  // `version` was already held: no work
    kUnknownKey,   // no version in the manifest lists the object
    kOlder,        // `version` is older than the one held
    kFailed,       // the move or an export failed (`status`); holds `held`
    kUnavailable,  // the manifest could not be read, or the daemon is stopping
    kTimedOut,     // still running after the caller's timeout
  };
  Kind kind = Kind::kFailed;
  uint64_t version = 0;  // the version the object belongs to (when known)
  uint64_t held = 0;     // the version held afterwards
  StateHash state_hash;  // of `held`
  UpdateStats stats;     // kMoved only
  Status status;         // kFailed, kUnavailable, kTimedOut
};

class Follower {
 public:
  Follower(std::shared_ptr<Store> store, std::vector<std::unique_ptr<StateSink>> sinks, Metrics& metrics,
           FollowerOptions options);
  ~Follower();
  Follower(const Follower&) = delete;
  Follower& operator=(const Follower&) = delete;

  void Start();
  // Answers queued requests with kUnavailable, waits for the cycle in
  // progress, joins the thread. Idempotent.
  void Stop();

  // Wakes the watcher for a manifest read now, unless `version` is already held.
  void Notify(uint64_t version);
  // Holds the current version. Returns once no update is in progress, so
  // what the sinks show does not change after it returns (until Resume or an
  // explicit move).
  void Pause();
  void Resume();
  // /start_weight_update and /finish_weight_update: the watcher holds while a
  // bracket is open, so the trainer's /update_weights decides the version.
  void BeginWeightUpdate();
  void FinishWeightUpdate();

  // Moves to the version whose objects include `key` (already validated),
  // reading the manifest afresh. Waits up to `timeout` for the answer.
  MoveOutcome MoveToObject(const std::string& key, std::chrono::duration<double> timeout);

  FollowerSnapshot Snapshot() const;

 private:
  struct Request {
    std::string key;
    std::shared_ptr<std::promise<MoveOutcome>> answer;
  };

  void Run();
  // One poll: read the manifest, retry behind sinks, move unless `hold`.
  // False when something failed (the next poll backs off).
  bool Cycle(bool hold);
  MoveOutcome HandleMove(const std::string& key);
  // Replica::Refresh, recorded (health, lag, errors).
  Status ReadManifest();
  // Replica::Update(target), exports, metrics, log. The update's error, or
  // else an export's. `stats_out` (optional) receives the update's stats.
  Status MoveTo(uint64_t target, UpdateStats* stats_out = nullptr);
  // Exports the held version to every sink that does not have it yet.
  Status ExportPending();
  void RecordError(std::string_view stage, const Status& status);
  // Clears last_error when it is from `stage` (which just succeeded).
  void ClearError(std::string_view stage);
  void ClearErrorLocked(std::string_view stage);  // REQUIRES mu_
  void PublishHeldLocked();  // copies version/hash/lag from the replica; REQUIRES mu_
  std::chrono::duration<double> NextInterval();
  void Log(const std::string& line, LogLevel level = LogLevel::kInfo) const;

  std::shared_ptr<Store> store_;
  std::unique_ptr<Replica> replica_;
  std::vector<std::unique_ptr<StateSink>> sinks_;
  std::vector<uint64_t> exported_;  // per sink: the version it shows
  Metrics& metrics_;
  FollowerOptions options_;
  std::mt19937_64 jitter_rng_;
  int failures_ = 0;  // consecutive failed cycles, for the backoff

  mutable std::mutex mu_;
  std::condition_variable wake_cv_;  // the watcher waits here
  std::condition_variable idle_cv_;  // Pause waits here for busy_ to clear
  std::deque<Request> requests_;
  bool wake_ = false;
  bool busy_ = false;
  bool stopping_ = false;
  bool paused_ = false;
  bool in_weight_update_ = false;
  FollowerSnapshot snapshot_;  // guarded by mu_
  std::string last_logged_error_;
  bool logged_waiting_ = false;  // "waiting for the first version" said once
  std::thread thread_;
};

}  // namespace deltasync::server
