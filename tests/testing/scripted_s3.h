// ScriptedS3: an HTTP/1.1 server on 127.0.0.1 whose every answer a test
// writes itself, byte for byte: an S3-compatible server that misbehaves on
// cue (a body shorter or longer than its Content-Length, a 206 for another
// range, an ETag that changes between ranges, a listing whose continuation
// tokens go round in a circle). Unlike FaultProxy it needs no real S3
// server behind it. Signatures are not checked.
//
// One thread per connection (S3Store's parallel ranged GETs open several);
// keep-alive connections are served until the client or the reply closes
// them. The handler runs on those threads: guard what it shares.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "deltasync/s3_store.h"

namespace deltasync::testing {

struct ScriptedRequest {
  std::string method;
  std::string path;   // "/bucket/key", still URL-encoded
  std::string query;  // after '?', still URL-encoded; "" when none
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;

  // "" when absent.
  std::string Header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? "" : it->second;
  }
  // The decoded value of query parameter `name` (nullptr-like "" when absent;
  // `present` says whether it was there).
  std::string Query(std::string_view name, bool* present = nullptr) const;
};

struct ScriptedReply {
  std::string raw;     // written as is: status line, headers, body
  bool close = false;  // close the connection after writing it
};

// A well-formed answer: the status line, `headers`, a Content-Length of
// body.size() (unless `headers` has one: then that one is sent, true or not),
// and the body.
ScriptedReply HttpReply(int status, const std::vector<std::pair<std::string, std::string>>& headers = {},
                        std::string_view body = {});
// An S3 <Error> answer with that code.
ScriptedReply S3ErrorReply(int status, std::string_view code, std::string_view message = "scripted");

class ScriptedS3 {
 public:
  using Handler = std::function<ScriptedReply(const ScriptedRequest&)>;

  // nullptr (with *error set) when it cannot listen.
  static std::unique_ptr<ScriptedS3> Start(Handler handler, std::string* error);
  ~ScriptedS3();  // closes every connection and joins every thread
  ScriptedS3(const ScriptedS3&) = delete;
  ScriptedS3& operator=(const ScriptedS3&) = delete;

  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests() const { return requests_.load(); }
  // Every request seen, in arrival order ("GET /bucket/key?query").
  std::vector<std::string> log() const;

 private:
  ScriptedS3() = default;
  void AcceptLoop();
  void Serve(int fd);

  Handler handler_;
  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  std::thread acceptor_;
  mutable std::mutex mu_;  // guards the members below
  std::vector<int> conns_;
  std::vector<std::thread> workers_;
  std::vector<std::string> log_;
};

// Options for an S3Store on `server`: path-style, made-up credentials, no
// environment, one attempt (a scripted answer is never retried).
inline S3Options ScriptedS3Options(const ScriptedS3& server) {
  S3Options o;
  o.endpoint = server.endpoint();
  o.region = "us-east-1";
  o.access_key = "AKIDEXAMPLE";
  o.secret_key = "secret";
  o.addressing = S3Addressing::kPath;
  o.read_environment = false;
  o.max_attempts = 1;
  return o;
}

}  // namespace deltasync::testing
