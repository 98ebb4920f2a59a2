// Route bodies. Each turns a parse error into 400 and a follower outcome
// into a status code; none throws (nlohmann::json is only built, never read
// unchecked, here).
#include "server/routes.h"

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "server/requests.h"

namespace deltasync::server {
namespace {

using nlohmann::json;

Reply JsonReply(int status, const json& body) { return Reply{status, body.dump() + "\n", "application/json"}; }

Reply BadRequest(const Status& s) { return ErrorReply(400, "bad_request", s.message()); }

json HashOrNull(uint64_t version, const StateHash& hash) { return version ? json(hash.Hex()) : json(nullptr); }

}  // namespace

Reply ErrorReply(int status, std::string_view error, std::string_view message) {
  return JsonReply(status, json{{"error", error}, {"message", message}});
}

Reply Routes::Pause(const std::string* mode, std::string_view body) {
  Result<std::string> parsed = ParsePauseMode(mode);
  if (!parsed.ok()) return BadRequest(parsed.status());
  if (Status s = ParseOptionalObject(body); !s.ok()) return BadRequest(s);
  follower_.Pause();
  FollowerSnapshot s = follower_.Snapshot();
  return JsonReply(200, {{"paused", true}, {"mode", *parsed}, {"version", s.version}});
}

Reply Routes::Resume(std::string_view body) {
  if (Status s = ParseOptionalObject(body); !s.ok()) return BadRequest(s);
  follower_.Resume();
  return JsonReply(200, {{"paused", false}, {"version", follower_.Snapshot().version}});
}

Reply Routes::StartWeightUpdate(std::string_view body) {
  Result<bool> checkpoint = ParseStartWeightUpdate(body);
  if (!checkpoint.ok()) return BadRequest(checkpoint.status());
  follower_.BeginWeightUpdate();
  return JsonReply(200, {{"in_weight_update", true},
                         {"is_checkpoint_format", *checkpoint},
                         {"version", follower_.Snapshot().version}});
}

Reply Routes::FinishWeightUpdate(std::string_view body) {
  if (Status s = ParseOptionalObject(body); !s.ok()) return BadRequest(s);
  follower_.FinishWeightUpdate();
  FollowerSnapshot s = follower_.Snapshot();
  return JsonReply(200, {{"in_weight_update", false},
                         {"version", s.version},
                         {"state_hash", HashOrNull(s.version, s.state_hash)}});
}

Reply Routes::UpdateWeights(std::string_view body) {
  Result<UpdateWeightsRequest> request = ParseUpdateWeights(body);
  if (!request.ok()) return BadRequest(request.status());
  const std::string& key = request->filename;
  MoveOutcome out = follower_.MoveToObject(key, options_.update_timeout);
  using Kind = MoveOutcome::Kind;
  switch (out.kind) {
    case Kind::kMoved:
    case Kind::kAlreadyHeld:
      return JsonReply(200, {{"version", out.held},
                             {"state_hash", out.state_hash.Hex()},
                             {"moved", out.kind == Kind::kMoved},
                             {"from_version", out.kind == Kind::kMoved ? out.stats.from_version : out.held},
                             {"anchors_applied", out.stats.anchors_applied},
                             {"deltas_applied", out.stats.deltas_applied},
                             {"bytes_downloaded", out.stats.bytes_downloaded},
                             {"apply_ms", out.stats.apply_ms},
                             {"compact_applies", out.stats.compact_applies},
                             {"held_applies", out.stats.held_applies},
                             {"stale_applies", out.stats.stale_applies}});
    case Kind::kUnknownKey:
      return ErrorReply(404, "not_found",
                        "'" + key + "' is not an object of any version in " + options_.bucket + "/manifest.json");
    case Kind::kOlder:
      return ErrorReply(409, "conflict",
                        "'" + key + "' belongs to version " + std::to_string(out.version) +
                            ", older than the held version " + std::to_string(out.held) +
                            "; replicas only move forward");
    case Kind::kUnavailable:
      return ErrorReply(503, "unavailable", out.status.message());
    case Kind::kTimedOut:
      return ErrorReply(504, "timeout",
                        out.status.message() + "; the update continues, version " + std::to_string(out.held) +
                            " is held now");
    case Kind::kFailed:
      break;
  }
  return JsonReply(500, {{"error", KindName(out.status.code())},
                         {"message", out.status.message()},
                         {"version", out.held},
                         {"state_hash", HashOrNull(out.held, out.state_hash)}});
}

Reply Routes::Notify(std::string_view body) {
  Result<uint64_t> version = ParseNotify(body);
  if (!version.ok()) return BadRequest(version.status());
  follower_.Notify(*version);
  return JsonReply(202, {{"notified", *version}, {"version", follower_.Snapshot().version}});
}

Reply Routes::GetStatus() {
  FollowerSnapshot s = follower_.Snapshot();
  const uint64_t now = UnixMillis();
  // Lag in time: how long the oldest version not yet held has existed
  // (trainer clock; clamped at 0 for skew).
  double lag_seconds = 0;
  if (s.lag_versions > 0 && s.oldest_pending_unix_ms > 0 && now > s.oldest_pending_unix_ms) {
    lag_seconds = static_cast<double>(now - s.oldest_pending_unix_ms) / 1000.0;
  }
  json last_error = nullptr;
  if (s.last_error) {
    last_error = {{"stage", s.last_error->stage},
                  {"kind", KindName(s.last_error->code)},
                  {"message", s.last_error->message},
                  {"at", static_cast<double>(s.last_error->unix_ms) / 1000.0}};
  }
  json bad_objects = json::array();
  for (const BadObject& b : s.bad_objects) {
    bad_objects.push_back({{"key", b.key}, {"version", b.version}, {"kind", KindName(b.code)}, {"reason", b.reason}});
  }
  return JsonReply(200, {{"version", s.version},
                         {"state_hash", HashOrNull(s.version, s.state_hash)},
                         {"updated_at", s.updated_unix_ms ? json(static_cast<double>(s.updated_unix_ms) / 1000.0)
                                                          : json(nullptr)},
                         {"lag_versions", s.lag_versions},
                         {"lag_seconds", lag_seconds},
                         {"paused", s.paused},
                         {"last_error", last_error},
                         {"latest_version", s.latest_version},
                         {"in_weight_update", s.in_weight_update},
                         {"export_error", s.export_error.empty() ? json(nullptr) : json(s.export_error)},
                         {"bad_objects", std::move(bad_objects)},
                         {"bucket", options_.bucket}});
}

Reply Routes::Healthz() {
  FollowerSnapshot s = follower_.Snapshot();
  auto unhealthy = [&](const std::string& reason) {
    return JsonReply(503, {{"ok", false}, {"version", s.version}, {"reason", reason}});
  };
  std::string last = s.last_error ? " (last error: " + s.last_error->message + ")" : "";
  if (s.version == 0) {
    if (s.waiting_for_first_version) return unhealthy("no verified version held yet: waiting for the first version");
    return unhealthy("no verified version held yet" + last);
  }
  auto since = std::chrono::steady_clock::now() - s.last_manifest_read;
  if (since > options_.stale_after) {
    return unhealthy("no successful read of manifest.json for " +
                     std::to_string(std::chrono::duration_cast<std::chrono::seconds>(since).count()) + " s" + last);
  }
  if (!s.export_error.empty()) return unhealthy("export failed: " + s.export_error);
  return JsonReply(200, {{"ok", true}, {"version", s.version}});
}

Reply Routes::GetMetrics() {
  return Reply{200, metrics_.Render(follower_.Snapshot()), "text/plain; version=0.0.4; charset=utf-8"};
}

}  // namespace deltasync::server
