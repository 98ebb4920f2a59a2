// Prometheus text format: "# HELP", "# TYPE", then samples; histogram buckets
// are cumulative and end with le="+Inf"; label values are escaped.
#include "server/metrics.h"

#include <cstdio>
#include <sstream>

namespace deltasync::server {
namespace {

std::string Escape(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

// Prometheus floats: "%.9g" keeps bucket bounds readable ("0.005", not
// "0.0050000000000000001") and sums precise enough.
std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void Head(std::ostringstream& out, const char* name, const char* type, const char* help) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

}  // namespace

void Metrics::RecordUpdate(const UpdateStats& stats) {
  const double apply_seconds = stats.apply_ms / 1000.0;
  std::lock_guard lock(mu_);
  versions_applied_ += stats.anchors_applied + stats.deltas_applied;
  bytes_downloaded_ += stats.bytes_downloaded;
  compact_applies_ += stats.compact_applies;
  held_applies_ += stats.held_applies;
  stale_applies_ += stats.stale_applies;
  for (size_t i = 0; i < kApplyBuckets.size(); ++i) {
    if (apply_seconds <= kApplyBuckets[i]) {
      apply_buckets_[i]++;
      break;
    }
  }
  apply_count_++;
  apply_sum_ += apply_seconds;
}

void Metrics::RecordError(std::string_view stage, ErrorCode code) {
  std::lock_guard lock(mu_);
  errors_[{std::string(stage), std::string(KindName(code))}]++;
}

void Metrics::RecordRequest(std::string_view route, int status) {
  std::lock_guard lock(mu_);
  requests_[{std::string(route), status}]++;
}

std::string Metrics::Render(const FollowerSnapshot& s) const {
  std::lock_guard lock(mu_);
  std::ostringstream out;
  Head(out, "deltasync_versions_applied_total", "counter", "Versions the replica moved through (anchors loaded + deltas applied).");
  out << "deltasync_versions_applied_total " << versions_applied_ << '\n';
  Head(out, "deltasync_bytes_downloaded_total", "counter", "Bytes of verified objects downloaded from the bucket.");
  out << "deltasync_bytes_downloaded_total " << bytes_downloaded_ << '\n';
  Head(out, "deltasync_compact_applies_total", "counter",
       "Compact deltas applied in place (a parted delta's parts count one each).");
  out << "deltasync_compact_applies_total " << compact_applies_ << '\n';
  Head(out, "deltasync_held_applies_total", "counter",
       "Compact applies that started every chunk from held class totals (no look-back).");
  out << "deltasync_held_applies_total " << held_applies_ << '\n';
  Head(out, "deltasync_stale_applies_total", "counter",
       "Compact applies that found the held class totals wrong and were redone exactly.");
  out << "deltasync_stale_applies_total " << stale_applies_ << '\n';

  Head(out, "deltasync_apply_seconds", "histogram", "Decode + verify + apply time of each successful update.");
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kApplyBuckets.size(); ++i) {
    cumulative += apply_buckets_[i];
    out << "deltasync_apply_seconds_bucket{le=\"" << Num(kApplyBuckets[i]) << "\"} " << cumulative << '\n';
  }
  out << "deltasync_apply_seconds_bucket{le=\"+Inf\"} " << apply_count_ << '\n';
  out << "deltasync_apply_seconds_sum " << Num(apply_sum_) << '\n';
  out << "deltasync_apply_seconds_count " << apply_count_ << '\n';

  Head(out, "deltasync_errors_total", "counter",
       "Failures by stage (manifest, update, export) and kind (deltasync error code).");
  for (const auto& [key, n] : errors_) {
    out << "deltasync_errors_total{stage=\"" << Escape(key.first) << "\",kind=\"" << Escape(key.second) << "\"} " << n
        << '\n';
  }
  Head(out, "deltasync_http_requests_total", "counter", "HTTP requests answered, by route and status code.");
  for (const auto& [key, n] : requests_) {
    out << "deltasync_http_requests_total{route=\"" << Escape(key.first) << "\",code=\"" << key.second << "\"} " << n
        << '\n';
  }

  Head(out, "deltasync_held_version", "gauge", "The verified version held (0 before the first).");
  out << "deltasync_held_version " << s.version << '\n';
  Head(out, "deltasync_latest_version", "gauge", "The newest version in the manifest as last read.");
  out << "deltasync_latest_version " << s.latest_version << '\n';
  Head(out, "deltasync_lag_versions", "gauge", "Versions in the manifest newer than the held one.");
  out << "deltasync_lag_versions " << s.lag_versions << '\n';
  Head(out, "deltasync_bad_objects", "gauge",
       "Bucket objects found damaged or missing and still listed by the manifest (routed around).");
  out << "deltasync_bad_objects " << s.bad_objects.size() << '\n';
  Head(out, "deltasync_paused", "gauge", "1 while paused (POST /pause) or inside a weight update bracket.");
  out << "deltasync_paused " << ((s.paused || s.in_weight_update) ? 1 : 0) << '\n';
  return out.str();
}

}  // namespace deltasync::server
