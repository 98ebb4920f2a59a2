// cpp-httplib wiring. Three details of the library shape this file:
//  - a POST without Content-Length (and not chunked) has no body by HTTP/1.1
//    rules, but the library would wait for the connection to close to read
//    one; the pre-routing hook answers those requests itself, with an empty
//    body, before the library starts reading;
//  - set_payload_max_length only caps bodies with a Content-Length, so the
//    POST handlers read through a content reader that also caps chunked ones;
//  - handlers run on the library's thread pool; nothing may throw out of
//    them, so each is wrapped (the library's exception handler is a backstop).
#include "server/http_api.h"

#include <httplib.h>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "server/auth.h"

namespace deltasync::server {
namespace {

struct Route {
  std::string method;  // "GET" or "POST"
  std::string path;
  bool mutating;       // needs the token (every POST)
  std::function<Reply(const httplib::Request&, std::string_view body)> handle;
};

std::string ErrorWord(int status) {
  switch (status) {
    case 400: return "bad_request";
    case 401: return "unauthorized";
    case 404: return "not_found";
    case 405: return "method_not_allowed";
    case 413: return "payload_too_large";
    case 500: return "internal";
    default: return "error";
  }
}

void Write(httplib::Response& res, const Reply& reply) {
  res.status = reply.status;
  res.set_content(reply.body, reply.content_type.c_str());
}

}  // namespace

HttpApi::HttpApi(Routes& routes, Metrics& metrics, HttpOptions options)
    : routes_(routes), metrics_(metrics), options_(std::move(options)) {}

HttpApi::~HttpApi() { Stop(); }

Result<std::unique_ptr<HttpApi>> HttpApi::Bind(Routes& routes, Metrics& metrics, HttpOptions options) {
  std::unique_ptr<HttpApi> api(new HttpApi(routes, metrics, std::move(options)));
  const HttpOptions& o = api->options_;
  if (!o.tls_cert.empty() || !o.tls_key.empty()) {
    for (const std::string& f : {o.tls_cert, o.tls_key}) {
      if (f.empty()) return Status::InvalidArgument("TLS needs both --tls-cert and --tls-key");
      if (::access(f.c_str(), R_OK) != 0) return Status::IOError(f + ": cannot read: " + std::strerror(errno));
    }
    api->http_ = std::make_unique<httplib::SSLServer>(o.tls_cert.c_str(), o.tls_key.c_str());
    if (!api->http_->is_valid()) {
      return Status::IOError("cannot load the TLS certificate " + o.tls_cert + " and key " + o.tls_key +
                             " (PEM files that match each other?)");
    }
  } else {
    api->http_ = std::make_unique<httplib::Server>();
  }
  api->Register();

  errno = 0;
  const std::string& host = o.address.host;
  if (o.address.port == 0) {
    api->port_ = api->http_->bind_to_any_port(host);
  } else {
    api->port_ = api->http_->bind_to_port(host, o.address.port) ? o.address.port : -1;
  }
  if (api->port_ <= 0) {
    std::string why = errno ? std::string(": ") + std::strerror(errno) : "";
    return Status::IOError("cannot listen on " + o.address.ToString() + why +
                           " (is the port in use, or the host not an address of this machine?)");
  }
  api->address_ = o.address.WithPort(api->port_);
  return api;
}

void HttpApi::Register() {
  auto routes = std::make_shared<std::vector<Route>>();
  auto post = [&](std::string path, std::function<Reply(const httplib::Request&, std::string_view)> fn) {
    routes->push_back(Route{"POST", std::move(path), true, std::move(fn)});
  };
  auto get = [&](std::string path, std::function<Reply()> fn) {
    routes->push_back(Route{"GET", std::move(path), false,
                            [fn = std::move(fn)](const httplib::Request&, std::string_view) { return fn(); }});
  };
  Routes& r = routes_;
  post("/pause", [&r](const httplib::Request& req, std::string_view body) {
    if (!req.has_param("mode")) return r.Pause(nullptr, body);
    std::string mode = req.get_param_value("mode");
    return r.Pause(&mode, body);
  });
  post("/resume", [&r](const httplib::Request&, std::string_view body) { return r.Resume(body); });
  post("/start_weight_update",
       [&r](const httplib::Request&, std::string_view body) { return r.StartWeightUpdate(body); });
  post("/finish_weight_update",
       [&r](const httplib::Request&, std::string_view body) { return r.FinishWeightUpdate(body); });
  post("/update_weights", [&r](const httplib::Request&, std::string_view body) { return r.UpdateWeights(body); });
  post("/notify", [&r](const httplib::Request&, std::string_view body) { return r.Notify(body); });
  get("/status", [&r] { return r.GetStatus(); });
  get("/healthz", [&r] { return r.Healthz(); });
  get("/metrics", [&r] { return r.GetMetrics(); });

  auto find = [routes](const std::string& path) -> const Route* {
    for (const Route& route : *routes) {
      if (route.path == path) return &route;
    }
    return nullptr;
  };
  // Authentication, then the route, with every exception turned into a 500.
  auto dispatch = [this](const Route& route, const httplib::Request& req, std::string_view body,
                         httplib::Response& res) {
    if (route.mutating && !options_.token.empty() &&
        !BearerMatches(req.get_header_value("Authorization"), options_.token)) {
      res.set_header("WWW-Authenticate", "Bearer realm=\"deltasync\"");
      return Write(res, ErrorReply(401, "unauthorized",
                                   "this route needs 'Authorization: Bearer <token>' with the daemon's token"));
    }
    try {
      Write(res, route.handle(req, body));
    } catch (const std::exception& e) {
      Write(res, ErrorReply(500, "internal", std::string("unexpected failure: ") + e.what()));
    } catch (...) {
      Write(res, ErrorReply(500, "internal", "unexpected failure"));
    }
  };

  // Each handler keeps the table alive (it outlives Register).
  for (size_t i = 0; i < routes->size(); ++i) {
    const Route& route = (*routes)[i];
    if (route.method == "GET") {
      http_->Get(route.path, [dispatch, routes, i](const httplib::Request& req, httplib::Response& res) {
        dispatch((*routes)[i], req, {}, res);
      });
      continue;
    }
    const size_t cap = options_.max_body_bytes;
    http_->Post(route.path, [dispatch, routes, i, cap](const httplib::Request& req, httplib::Response& res,
                                                       const httplib::ContentReader& read) {
      std::string body;
      bool too_big = false;
      bool ok = read([&](const char* data, size_t n) {
        if (n > cap - std::min(cap, body.size())) {
          too_big = true;
          return false;
        }
        body.append(data, n);
        return true;
      });
      // The library sets 413 itself when a Content-Length exceeds the cap.
      if (too_big || res.status == 413) {
        res.set_header("Connection", "close");
        return Write(res, ErrorReply(413, "payload_too_large",
                                     "the body exceeds " + std::to_string(cap) + " bytes"));
      }
      if (!ok) {
        res.set_header("Connection", "close");
        return Write(res, ErrorReply(400, "bad_request", "the body could not be read (truncated or malformed chunks)"));
      }
      dispatch((*routes)[i], req, body, res);
    });
  }

  http_->set_pre_routing_handler([find, dispatch](const httplib::Request& req, httplib::Response& res) {
    const Route* route = find(req.path);
    if (!route) return httplib::Server::HandlerResponse::Unhandled;  // 404 below
    bool head_of_get = req.method == "HEAD" && route->method == "GET";
    if (req.method != route->method && !head_of_get) {
      res.set_header("Allow", route->method == "GET" ? "GET, HEAD" : "POST");
      Write(res, ErrorReply(405, "method_not_allowed", req.path + " accepts " + route->method + " only"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.method == "POST" && !req.has_header("Content-Length") && !req.has_header("Transfer-Encoding")) {
      dispatch(*route, req, {}, res);  // no body by HTTP/1.1 rules
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  http_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = res.status == 404 ? "no route " + req.method + " " + req.path +
                                                   " (routes: /pause /resume /start_weight_update "
                                                   "/finish_weight_update /update_weights /notify /status "
                                                   "/healthz /metrics)"
                                             : "the request was refused";
    Write(res, ErrorReply(res.status, ErrorWord(res.status), message));
  });
  http_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    Write(res, ErrorReply(500, "internal", "unexpected failure"));
  });
  // Counted before the response is written (the logger runs after it), so a
  // client that reads /metrics right after its own request sees it counted.
  http_->set_post_routing_handler([this, find](const httplib::Request& req, httplib::Response& res) {
    // Only known paths become labels: arbitrary paths must not grow /metrics.
    metrics_.RecordRequest(find(req.path) ? req.path : "other", res.status);
  });
  http_->set_payload_max_length(options_.max_body_bytes);
  // The library's default also sets SO_REUSEPORT, which lets a second
  // daemon bind the same port and silently take half the requests. Only
  // SO_REUSEADDR: a restarted daemon need not wait out TIME_WAIT.
  http_->set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
}

Status HttpApi::Start() {
  thread_ = std::thread([this] { http_->listen_after_bind(); });
  // stop() is a no-op before the loop runs, so wait for it.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!http_->is_running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::IOError("the HTTP server on " + address_ + " did not start");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return Status::OK();
}

void HttpApi::Stop() {
  if (!thread_.joinable()) return;
  http_->stop();
  thread_.join();
}

}  // namespace deltasync::server
