// Notifier: the trainer side of POST /notify. After each commit the
// Publisher hands the version here; one thread per replica URL posts
// {"version": V} to URL/notify with short timeouts. Fire and forget: Notify
// never blocks and never fails; a replica that is down or slow only misses
// the wake-up (it still finds the version by polling). Versions that pile
// up while a post is in flight collapse into the newest.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deltasync/publisher.h"

namespace deltasync {

class Notifier {
 public:
  // urls: "http://host:port" or "https://host:port", optionally with a path
  // prefix ("http://host:port/replica1" posts to /replica1/notify). token:
  // sent as "Authorization: Bearer <token>" when non-empty.
  Notifier(const std::vector<std::string>& urls, std::string token);
  // Delivers a version still pending (bounded by the timeouts), then joins.
  ~Notifier();
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  void Notify(uint64_t version);

  // Posts answered with 2xx, and all other outcomes (refused, timed out,
  // non-2xx, bad URL).
  uint64_t delivered() const { return delivered_.load(); }
  uint64_t failed() const { return failed_.load(); }

  // Waits until every version handed to Notify so far has been posted or
  // has failed, or `timeout_seconds` passed. For tests and short-lived tools.
  bool Flush(double timeout_seconds) const;

 private:
  struct Target;
  void Run(Target& target, const std::string& token);  // one thread per target
  void Stop();  // delivers what is pending, joins

  std::vector<std::unique_ptr<Target>> targets_;
  std::atomic<uint64_t> delivered_{0};
  std::atomic<uint64_t> failed_{0};
};

// The Publisher's hook: creates `notifier` on first use from the options'
// notify_urls/notify_token and hands it `version`. No-op without URLs.
void NotifyAfterCommit(std::shared_ptr<Notifier>& notifier, const PublisherOptions& options, uint64_t version);

}  // namespace deltasync
