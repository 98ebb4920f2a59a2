// The daemon's HTTP routes as plain functions from a request body to a
// reply, independent of the HTTP library (http_api.cc does transport, body
// limits and authentication). Schemas: docs/serve.md.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "server/follower.h"
#include "server/metrics.h"

namespace deltasync::server {

struct Reply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
};

// {"error": error, "message": message} with `status`.
Reply ErrorReply(int status, std::string_view error, std::string_view message);

struct RouteOptions {
  std::string bucket;  // Store::Describe(), reported by /status
  std::chrono::duration<double> stale_after{10};
  std::chrono::duration<double> update_timeout{600};
};

class Routes {
 public:
  Routes(Follower& follower, Metrics& metrics, RouteOptions options)
      : follower_(follower), metrics_(metrics), options_(std::move(options)) {}

  // TRL's control plane.
  Reply Pause(const std::string* mode, std::string_view body);
  Reply Resume(std::string_view body);
  Reply StartWeightUpdate(std::string_view body);
  Reply FinishWeightUpdate(std::string_view body);
  Reply UpdateWeights(std::string_view body);
  // Ours.
  Reply Notify(std::string_view body);
  Reply GetStatus();
  Reply Healthz();
  Reply GetMetrics();

 private:
  Follower& follower_;
  Metrics& metrics_;
  RouteOptions options_;
};

}  // namespace deltasync::server
