// Server: wires the pieces of `deltasync serve` together (store -> watcher
// with its sinks -> routes -> HTTP) and owns their lifetimes. Stop order
// matters: the watcher stops first (it answers queued /update_weights, so
// no HTTP handler is left waiting on it), then the HTTP server (which waits
// for handlers in progress), then the sinks (the --shm object is unlinked).
#include "deltasync/server.h"

#include <cmath>
#include <mutex>

#include "server/auth.h"
#include "server/follower.h"
#include "server/http_api.h"
#include "server/listen_address.h"
#include "server/metrics.h"
#include "server/out_dir.h"
#include "server/routes.h"
#include "server/shm_export.h"

namespace deltasync {

struct Server::Impl {
  server::Metrics metrics;
  std::unique_ptr<server::Follower> follower;
  std::unique_ptr<server::Routes> routes;
  std::unique_ptr<server::HttpApi> http;
  std::once_flag stopped;

  void Stop() {
    std::call_once(stopped, [&] {
      if (follower) follower->Stop();
      if (http) http->Stop();
    });
  }
};

namespace {

Status CheckOptions(const ServerOptions& o) {
  auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  if (!positive(o.poll_seconds)) return Status::InvalidArgument("--poll must be a positive number of seconds");
  if (o.stale_after_seconds != 0 && !positive(o.stale_after_seconds)) {
    return Status::InvalidArgument("stale_after_seconds must be positive (or 0 for the default)");
  }
  if (!positive(o.update_timeout_seconds)) return Status::InvalidArgument("update_timeout_seconds must be positive");
  if (o.max_body_bytes == 0) return Status::InvalidArgument("max_body_bytes must be positive");
  if (!o.token.empty() && !server::IsValidToken(o.token)) {
    return Status::InvalidArgument("the token must be 1-4096 printable ASCII characters without spaces");
  }
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return Status::InvalidArgument("TLS needs both --tls-cert and --tls-key");
  }
  if (!o.store && o.bucket.empty()) return Status::InvalidArgument("no bucket given (--bucket URL)");
  return Status::OK();
}

}  // namespace

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { Stop(); }

void Server::Stop() { impl_->Stop(); }

const std::string& Server::address() const { return impl_->http->address(); }

int Server::port() const { return impl_->http->port(); }

Result<std::unique_ptr<Server>> Server::Start(ServerOptions options) {
  // Threads and allocations can throw; nothing may escape the API.
  try {
    return StartOrThrow(std::move(options));
  } catch (const std::exception& e) {
    return Status::Internal(std::string("cannot start the daemon: ") + e.what());
  }
}

Result<std::unique_ptr<Server>> Server::StartOrThrow(ServerOptions options) {
  DS_RETURN_IF_ERROR(CheckOptions(options));
  DS_ASSIGN_OR_RETURN(server::ListenAddress address, server::ParseListenAddress(options.listen));
  std::shared_ptr<Store> store = options.store;
  if (!store) {
    // Not created: a typo in --bucket should fail here, not wait forever on
    // an empty new directory.
    Result<std::shared_ptr<Store>> opened = OpenStore(options.bucket, /*create=*/false);
    if (!opened.ok()) {
      // Store messages name the bucket already; add it only where they do not.
      Status failed = opened.status();
      if (failed.message().find(options.bucket) != std::string::npos) return failed;
      return failed.WithContext("bucket " + options.bucket);
    }
    store = *opened;
  }

  std::vector<std::unique_ptr<server::StateSink>> sinks;
  if (!options.out_dir.empty()) {
    DS_ASSIGN_OR_RETURN(auto out, server::OutDirSink::Open(options.out_dir, options.keep, options.out_layout, store));
    sinks.push_back(std::move(out));
  }
  if (!options.shm_name.empty()) {
    DS_ASSIGN_OR_RETURN(auto shm, server::ShmExport::Create(options.shm_name));
    sinks.push_back(std::move(shm));
  }

  auto impl = std::make_unique<Impl>();
  impl->follower = std::make_unique<server::Follower>(
      store, std::move(sinks), impl->metrics,
      server::FollowerOptions{options.poll_seconds, options.threads, options.log});
  server::RouteOptions route_options;
  route_options.bucket = store->Describe();
  route_options.stale_after = std::chrono::duration<double>(
      options.stale_after_seconds > 0 ? options.stale_after_seconds : std::max(10.0, 5 * options.poll_seconds));
  route_options.update_timeout = std::chrono::duration<double>(options.update_timeout_seconds);
  impl->routes = std::make_unique<server::Routes>(*impl->follower, impl->metrics, std::move(route_options));

  server::HttpOptions http_options{address, options.token, options.tls_cert, options.tls_key, options.max_body_bytes};
  DS_ASSIGN_OR_RETURN(impl->http, server::HttpApi::Bind(*impl->routes, impl->metrics, std::move(http_options)));
  DS_RETURN_IF_ERROR(impl->http->Start());
  impl->follower->Start();
  if (options.log) {
    options.log(LogLevel::kInfo, "following " + store->Describe() + " on " + impl->http->address() +
                (options.tls_cert.empty() ? "" : " (TLS)") + (options.token.empty() ? "" : " (token required)"));
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

}  // namespace deltasync
