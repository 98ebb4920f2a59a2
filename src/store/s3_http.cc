#include "store/s3_http.h"

#include <curl/curl.h>
#include <strings.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>

#include "common/stream_copy.h"
#include "store/s3_fields.h"

namespace deltasync::s3 {
namespace {

// Easy handles kept for reuse; more than this many idle ones are closed.
constexpr size_t kMaxIdleHandles = 64;
// curl's receive and send buffers. Larger than the 16/64 KiB defaults so that
// a loopback or datacenter link is not bounded by callback overhead.
constexpr long kRecvBuffer = 512 * 1024;
constexpr long kSendBuffer = 512 * 1024;
// A fixed sink at least this large (a large download's part) is written with
// non-temporal stores: it cannot stay cached, and a plain copy would first
// read every destination line from memory (common/stream_copy.h).
constexpr size_t kUncachedSink = 4u << 20;

std::once_flag g_curl_init;

// Per-request state shared with curl's callbacks.
struct Transfer {
  const HttpRequest* request;
  HttpResponse* response;
  uint64_t read_pos = 0;  // relative to request->body.offset
};

std::string LowerTrim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r' || s[e - 1] == '\n')) --e;
  return std::string(s.substr(b, e - b));
}

// Copies body bytes [pos, pos + n) out of the span list into `dst`.
size_t CopyBody(const BodySource& body, uint64_t pos, uint8_t* dst, size_t n) {
  uint64_t skip = body.offset + pos;
  size_t done = 0;
  for (ByteSpan part : body.parts) {
    if (done == n) break;
    if (skip >= part.size()) {
      skip -= part.size();
      continue;
    }
    size_t take = static_cast<size_t>(std::min<uint64_t>(part.size() - skip, n - done));
    std::memcpy(dst + done, part.data() + skip, take);
    done += take;
    skip = 0;
  }
  return done;
}

size_t ReadCallback(char* buffer, size_t size, size_t nitems, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  const BodySource& body = t->request->body;
  uint64_t left = body.length - t->read_pos;
  size_t n = static_cast<size_t>(std::min<uint64_t>(left, size * nitems));
  size_t copied = CopyBody(body, t->read_pos, reinterpret_cast<uint8_t*>(buffer), n);
  if (copied != n) return CURL_READFUNC_ABORT;  // spans shorter than declared: a caller bug
  t->read_pos += n;
  return n;
}

// curl rewinds the body when it must resend it (e.g. on a reused connection
// that turned out to be closed).
int SeekCallback(void* userdata, curl_off_t offset, int origin) {
  auto* t = static_cast<Transfer*>(userdata);
  if (origin != SEEK_SET || offset < 0 || static_cast<uint64_t>(offset) > t->request->body.length) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  if (t->read_pos > 0) t->response->resent = true;
  t->read_pos = static_cast<uint64_t>(offset);
  return CURL_SEEKFUNC_OK;
}

size_t HeaderCallback(char* buffer, size_t size, size_t nitems, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  size_t n = size * nitems;
  std::string_view line(buffer, n);
  if (line.substr(0, 5) == "HTTP/") {
    // A new status line (after "100 Continue", or a redirect): start over.
    t->response->headers.clear();
    size_t sp = line.find(' ');
    t->response->status = sp == std::string_view::npos ? 0 : std::atol(std::string(line.substr(sp + 1, 3)).c_str());
    return n;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return n;
  std::string name = LowerTrim(line.substr(0, colon));
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string value = LowerTrim(line.substr(colon + 1));
  // Reserve the whole body up front when it is going to a growable buffer.
  if (name == "content-length" && t->request->grow_into != nullptr && t->response->status >= 200 &&
      t->response->status < 300) {
    std::optional<uint64_t> len = ParseContentLength(value);
    // Out of memory here is reported when the body arrives.
    if (len && *len > 0 && *len < (uint64_t{1} << 40)) {
      (void)t->request->grow_into->Reserve(t->request->grow_into->size() + *len);
    }
  }
  t->response->headers[name] = std::move(value);
  return n;
}

size_t WriteCallback(char* data, size_t size, size_t nmemb, void* userdata) {
  auto* t = static_cast<Transfer*>(userdata);
  HttpResponse& r = *t->response;
  size_t n = size * nmemb;
  bool success = r.status >= 200 && r.status < 300;
  if (success && !t->request->into.empty()) {
    MutableByteSpan into = t->request->into;
    if (r.sink_bytes + n > into.size()) {
      r.sink_overflow = true;
      return 0;  // more than asked for: stop (curl reports CURLE_WRITE_ERROR)
    }
    uint8_t* dst = into.data() + r.sink_bytes;
    if (into.size() >= kUncachedSink) {
      CopyToUncached(dst, reinterpret_cast<const uint8_t*>(data), n);
    } else {
      std::memcpy(dst, data, n);
    }
    r.sink_bytes += n;
  } else if (success && t->request->grow_into != nullptr) {
    if (!t->request->grow_into->Append(ByteSpan(reinterpret_cast<const uint8_t*>(data), n))) {
      r.sink_no_memory = true;
      return 0;  // stop (curl reports CURLE_WRITE_ERROR)
    }
    r.sink_bytes += n;
  } else if (r.body.size() < (64u << 20)) {  // error bodies are small; never hold a runaway one
    r.body.append(data, n);
  }
  return n;
}

}  // namespace

struct ShareLock {
  static void Lock(CURL*, curl_lock_data data, curl_lock_access, void* userptr) {
    static_cast<HttpClient*>(userptr)->share_locks_[static_cast<size_t>(data) % 8].lock();
  }
  static void Unlock(CURL*, curl_lock_data data, void* userptr) {
    static_cast<HttpClient*>(userptr)->share_locks_[static_cast<size_t>(data) % 8].unlock();
  }
};

HttpClient::HttpClient(HttpOptions options) : options_(options) {
  std::call_once(g_curl_init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  CURLSH* share = curl_share_init();
  if (share != nullptr) {
    curl_share_setopt(share, CURLSHOPT_LOCKFUNC, &ShareLock::Lock);
    curl_share_setopt(share, CURLSHOPT_UNLOCKFUNC, &ShareLock::Unlock);
    curl_share_setopt(share, CURLSHOPT_USERDATA, this);
    curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
  }
  share_ = share;
}

HttpClient::~HttpClient() {
  for (void* easy : idle_) curl_easy_cleanup(static_cast<CURL*>(easy));
  if (share_ != nullptr) curl_share_cleanup(static_cast<CURLSH*>(share_));
}

void* HttpClient::Acquire() {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!idle_.empty()) {
      void* easy = idle_.back();
      idle_.pop_back();
      return easy;
    }
  }
  return curl_easy_init();
}

void HttpClient::Release(void* easy) {
  std::lock_guard<std::mutex> lock(pool_mu_);
  if (idle_.size() < kMaxIdleHandles) {
    idle_.push_back(easy);
  } else {
    curl_easy_cleanup(static_cast<CURL*>(easy));
  }
}

HttpResponse HttpClient::Perform(const HttpRequest& request) {
  HttpResponse response;
  CURL* curl = static_cast<CURL*>(Acquire());
  if (curl == nullptr) {
    response.transport_error = CURLE_FAILED_INIT;
    response.transport_message = "curl_easy_init failed";
    return response;
  }
  // Reset options but keep the handle's open connection for reuse.
  curl_easy_reset(curl);
  Transfer transfer{&request, &response};
  char errbuf[CURL_ERROR_SIZE] = {0};

  curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(curl, CURLOPT_SHARE, share_);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM-based DNS timeouts
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout.count()));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, static_cast<long>(options_.low_speed_bytes_per_s));
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(options_.low_speed_time.count()));
  curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(curl, CURLOPT_BUFFERSIZE, kRecvBuffer);
  curl_easy_setopt(curl, CURLOPT_UPLOAD_BUFFERSIZE, kSendBuffer);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &HeaderCallback);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &transfer);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &WriteCallback);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);

  const std::string& m = request.method;
  if (m == "HEAD") {
    curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
  } else if (m == "PUT") {
    curl_easy_setopt(curl, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body.length));
  } else if (m == "POST") {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.length));
  } else if (m != "GET") {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, m.c_str());
  }
  if (m == "PUT" || m == "POST") {
    curl_easy_setopt(curl, CURLOPT_READFUNCTION, &ReadCallback);
    curl_easy_setopt(curl, CURLOPT_READDATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_SEEKFUNCTION, &SeekCallback);
    curl_easy_setopt(curl, CURLOPT_SEEKDATA, &transfer);
  }

  curl_slist* headers = nullptr;
  bool has_content_type = false;
  for (const auto& [name, value] : request.headers) {
    std::string line = name + ": " + value;
    headers = curl_slist_append(headers, line.c_str());
    if (strcasecmp(name.c_str(), "content-type") == 0) has_content_type = true;
  }
  // No "Expect: 100-continue" round trip (and no one-second wait on servers
  // that never answer it); and no form Content-Type curl would add to POSTs.
  headers = curl_slist_append(headers, "Expect:");
  if (!has_content_type) headers = curl_slist_append(headers, "Content-Type:");
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);

  CURLcode rc = curl_easy_perform(curl);
  if (rc != CURLE_OK) {
    response.transport_error = static_cast<int>(rc);
    response.transport_message = errbuf[0] != '\0' ? errbuf : curl_easy_strerror(rc);
    if (response.sink_overflow) response.transport_message = "the response body is larger than requested";
    if (response.sink_no_memory) {
      response.transport_message = "out of memory for the response body (" +
                                   std::to_string(request.grow_into->capacity()) + " bytes held)";
    }
  } else {
    long code = 0;
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
    response.status = code;
  }
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, nullptr);
  curl_slist_free_all(headers);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, nullptr);
  Release(curl);
  return response;
}

}  // namespace deltasync::s3
