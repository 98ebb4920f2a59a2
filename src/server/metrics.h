// Counters for GET /metrics, in the Prometheus text exposition format
// (version 0.0.4). All metric names start with "deltasync_".
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "deltasync/replica.h"
#include "deltasync/status.h"
#include "server/snapshot.h"

namespace deltasync::server {

class Metrics {
 public:
  // Upper bounds (seconds) of the apply histogram's buckets; +Inf is implied.
  static constexpr std::array<double, 12> kApplyBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                           0.5,   1,    2.5,   5,    10,  30};

  // One successful Replica::Update: versions moved through (anchors loaded +
  // deltas applied), bytes it downloaded, its decode+verify+apply time, and
  // its compact applies in place (held: from held class totals; stale: redone
  // after the held totals were found wrong).
  void RecordUpdate(const UpdateStats& stats);
  void RecordError(std::string_view stage, ErrorCode code);
  // `route` must be one of the daemon's routes or "other" (bounded labels).
  void RecordRequest(std::string_view route, int status);

  // The whole exposition, with gauges taken from `snapshot`.
  std::string Render(const FollowerSnapshot& snapshot) const;

 private:
  mutable std::mutex mu_;
  uint64_t versions_applied_ = 0;
  uint64_t bytes_downloaded_ = 0;
  uint64_t compact_applies_ = 0;
  uint64_t held_applies_ = 0;
  uint64_t stale_applies_ = 0;
  std::array<uint64_t, kApplyBuckets.size()> apply_buckets_{};  // non-cumulative counts
  uint64_t apply_count_ = 0;
  double apply_sum_ = 0;
  std::map<std::pair<std::string, std::string>, uint64_t> errors_;    // (stage, kind)
  std::map<std::pair<std::string, int>, uint64_t> requests_;          // (route, status)
};

}  // namespace deltasync::server
