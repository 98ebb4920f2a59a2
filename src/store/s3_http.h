// HttpClient: one HTTP/1.1 request at a time per calling thread over
// libcurl, with a shared pool of connections (internal).
//
// Bodies are streamed from the caller's spans and responses written straight
// into the caller's buffer, so no request stages a whole object in a copy.
// Nothing here retries or interprets S3: that is S3Client's job.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "deltasync/blob.h"
#include "deltasync/tensor.h"

namespace deltasync::s3 {

// Bytes [offset, offset + length) of `parts` concatenated: an upload body that
// may start and end inside any span.
struct BodySource {
  std::span<const ByteSpan> parts;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct HttpRequest {
  std::string method;  // GET, HEAD, PUT, POST, DELETE
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  BodySource body;  // length 0: an empty body
  // Where a 2xx body goes: `into` (fixed, must not overflow) when non-empty,
  // else appended to *grow_into when set, else HttpResponse::body.
  MutableByteSpan into;
  BlobBuffer* grow_into = nullptr;
};

struct HttpResponse {
  // 0 when a response arrived; otherwise a CURLcode (connection refused or
  // reset, timeout, ...) described by transport_message.
  int transport_error = 0;
  std::string transport_message;
  long status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;          // non-2xx bodies, and 2xx bodies with no sink
  uint64_t sink_bytes = 0;   // body bytes written to `into` / grow_into
  bool sink_overflow = false;  // the body did not fit `into` (the transfer was cut)
  bool sink_no_memory = false;  // grow_into could not grow (the transfer was cut)
  int attempts = 1;          // filled in by S3Client
  // curl sent the body more than once on its own (it does so when a reused
  // connection turns out dead): the server may have seen the request twice.
  bool resent = false;

  // "" when absent.
  std::string Header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? "" : it->second;
  }
  bool ok() const { return transport_error == 0 && status >= 200 && status < 300; }
};

struct HttpOptions {
  std::chrono::milliseconds connect_timeout{5000};
  uint32_t low_speed_bytes_per_s = 1;
  std::chrono::seconds low_speed_time{30};
};

class HttpClient {
 public:
  explicit HttpClient(HttpOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends one request and waits for the whole response. Never throws.
  // Thread-safe: concurrent calls use different pooled connections.
  HttpResponse Perform(const HttpRequest& request);

 private:
  void* Acquire();           // a CURL* easy handle, reused when one is idle
  void Release(void* easy);  // back to the pool, keeping its live connection

  HttpOptions options_;
  void* share_ = nullptr;  // CURLSH*: DNS cache and TLS sessions, shared
  std::mutex share_locks_[8];
  std::mutex pool_mu_;
  std::vector<void*> idle_;

  friend struct ShareLock;
};

}  // namespace deltasync::s3
