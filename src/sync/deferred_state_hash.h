// A version's state-hash change summed on a thread of its own while
// Publisher::Commit writes the version's objects (internal to src/sync).
//
// The gap_delta publish (Publisher::PrepareGapDelta) leaves the hash terms of
// its 2-byte changes out of the scan and hands Commit a sum of them from the
// delta's gap, value and old-value streams (GapDeltaPublish::HashLater):
// Commit starts it before the delta's write and takes it after, so the sum
// runs while the write's fsync leaves the cores idle.
//
// The contract: the manifest's state hash is the hash of the state actually
// published. Commit takes the sum (Join) before it writes the version's
// manifest entry, and a sum that failed (it threw: out of memory, no thread)
// fails the version like a failed Put: nothing committed, the publisher's
// state rolled back, the error returned. The sum reads only what the
// version's Prepare left (the delta's streams and old values), which neither
// the upload nor a rollback writes.
#pragma once

#include <functional>
#include <thread>

#include "deltasync/state_hash.h"
#include "deltasync/status.h"

namespace deltasync {

class DeferredStateHash {
 public:
  using Sum = std::function<StateHash()>;

  // `sum` may be empty: nothing deferred, Join gives a zero change.
  explicit DeferredStateHash(Sum sum) : sum_(std::move(sum)) {}
  ~DeferredStateHash();  // joins a started sum (its result unread)
  DeferredStateHash(const DeferredStateHash&) = delete;
  DeferredStateHash& operator=(const DeferredStateHash&) = delete;

  // A sum not yet taken by Join.
  bool pending() const { return static_cast<bool>(sum_); }
  // Starts the sum on a thread of its own (here, at once, when no thread can
  // be started); nothing when none is pending.
  void Start();
  // Waits for the sum (running it here when not started) and gives it: the
  // state-hash change, or kInternal naming what the sum threw. Once; after
  // it nothing is pending and Join gives a zero change.
  Result<StateHash> Join();

  // For tests: called on the sum's thread before every sum (nullptr: none);
  // it may throw, as an allocation in the sum can.
  using Hook = void (*)();
  static void SetHookForTesting(Hook hook);

 private:
  void RunSum() noexcept;  // runs sum_ into change_ or error_

  Sum sum_;
  std::thread thread_;
  bool done_ = false;  // RunSum ran (read after thread_ joined)
  StateHash change_;
  char error_[160] = {};  // what the sum threw, empty when it did not
};

}  // namespace deltasync
