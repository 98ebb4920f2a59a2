// demo --serve: the demo's replicas as `deltasync serve` daemons. The demo
// publishes with their /notify URLs, then asks each daemon's /status for its
// lag and waits until it holds the version with the trainer's state hash.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deltasync/state_hash.h"
#include "deltasync/status.h"

namespace deltasync::cli {

class ServeReplicas {
 public:
  // Starts `count` daemons on 127.0.0.1 ephemeral ports following `bucket`
  // and waits for each one's "listening on ADDR" line.
  static Result<std::unique_ptr<ServeReplicas>> Spawn(const std::string& exe, const std::string& bucket, int count);
  // Kills daemons still running.
  ~ServeReplicas();

  // "http://127.0.0.1:PORT" per daemon, for PublisherOptions::notify_urls.
  std::vector<std::string> NotifyUrls() const;

  // After `version` was published (publish() returned at `published`):
  // each daemon's lag from /status, then the time until it held `version`.
  // Fills `cells` (one table cell per daemon) and returns an error naming
  // the daemon when one does not reach `version` with `trainer_hash` within
  // `timeout_s`.
  Status Check(uint64_t version, std::chrono::steady_clock::time_point published, const StateHash& trainer_hash,
               double timeout_s, std::string& cells);

  // SIGTERM to every daemon; an error when one does not exit 0.
  Status Stop();

 private:
  struct Daemon {
    pid_t pid = -1;
    std::string address;
  };
  std::vector<Daemon> daemons_;
};

}  // namespace deltasync::cli
