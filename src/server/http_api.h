// HttpApi: the daemon's HTTP(S) transport on cpp-httplib. Routing to
// Routes, body size limit (413), bearer authentication of mutating routes
// (401), JSON errors for everything the library answers itself (404, 405),
// per-request metrics. The daemon keeps serving after any bad request.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "server/listen_address.h"
#include "server/metrics.h"
#include "server/routes.h"

namespace httplib {
class Server;
}

namespace deltasync::server {

struct HttpOptions {
  ListenAddress address;
  std::string token;  // empty: no authentication
  std::string tls_cert, tls_key;  // both or neither
  size_t max_body_bytes = 64 * 1024;
};

class HttpApi {
 public:
  // Registers the routes and binds the socket (the kernel queues connections
  // from here on). kIOError when the address cannot be bound or the TLS
  // files cannot be loaded.
  static Result<std::unique_ptr<HttpApi>> Bind(Routes& routes, Metrics& metrics, HttpOptions options);
  ~HttpApi();

  // Starts the accept loop on its own thread; returns once it runs.
  Status Start();
  // Closes the socket and joins the threads (requests in progress finish).
  void Stop();

  const std::string& address() const { return address_; }
  int port() const { return port_; }

 private:
  HttpApi(Routes& routes, Metrics& metrics, HttpOptions options);
  void Register();

  Routes& routes_;
  Metrics& metrics_;
  HttpOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::string address_;
  int port_ = 0;
};

}  // namespace deltasync::server
