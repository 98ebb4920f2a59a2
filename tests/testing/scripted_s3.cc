#include "testing/scripted_s3.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>

namespace deltasync::testing {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r')) --e;
  return std::string(s.substr(b, e - b));
}

std::string PercentDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      out += static_cast<char>(std::strtol(std::string(s.substr(i + 1, 2)).c_str(), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 301: return "Moved Permanently";
    case 307: return "Temporary Redirect";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 412: return "Precondition Failed";
    case 416: return "Range Not Satisfiable";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

}  // namespace

std::string ScriptedRequest::Query(std::string_view name, bool* present) const {
  if (present != nullptr) *present = false;
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t amp = query.find('&', pos);
    if (amp == std::string::npos) amp = query.size();
    std::string_view item(query.data() + pos, amp - pos);
    size_t eq = item.find('=');
    std::string key = PercentDecode(item.substr(0, eq));
    if (key == name) {
      if (present != nullptr) *present = true;
      return eq == std::string_view::npos ? "" : PercentDecode(item.substr(eq + 1));
    }
    pos = amp + 1;
  }
  return "";
}

ScriptedReply HttpReply(int status, const std::vector<std::pair<std::string, std::string>>& headers,
                        std::string_view body) {
  std::string raw = "HTTP/1.1 " + std::to_string(status) + " " + Reason(status) + "\r\n";
  bool has_length = false;
  for (const auto& [name, value] : headers) {
    raw += name + ": " + value + "\r\n";
    has_length |= Lower(name) == "content-length";
  }
  if (!has_length) raw += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  raw += "\r\n";
  raw += body;
  return ScriptedReply{std::move(raw), false};
}

ScriptedReply S3ErrorReply(int status, std::string_view code, std::string_view message) {
  std::string body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>" + std::string(code) +
                     "</Code><Message>" + std::string(message) + "</Message><RequestId>scripted</RequestId></Error>";
  return HttpReply(status, {{"Content-Type", "application/xml"}}, body);
}

std::unique_ptr<ScriptedS3> ScriptedS3::Start(Handler handler, std::string* error) {
  std::unique_ptr<ScriptedS3> s(new ScriptedS3());
  s->handler_ = std::move(handler);
  s->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (s->listen_fd_ < 0 || ::bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(s->listen_fd_, 64) != 0 ||
      ::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    *error = std::string("cannot listen on 127.0.0.1: ") + std::strerror(errno);
    return nullptr;
  }
  s->port_ = ntohs(addr.sin_port);
  s->acceptor_ = std::thread([p = s.get()] { p->AcceptLoop(); });
  return s;
}

ScriptedS3::~ScriptedS3() {
  stop_.store(true);
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : conns_) {
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    }  // wakes workers blocked in recv
    workers = std::move(workers_);
  }
  for (std::thread& t : workers) t.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

std::vector<std::string> ScriptedS3::log() const {
  std::lock_guard<std::mutex> lock(mu_);
  return log_;
}

void ScriptedS3::AcceptLoop() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> lock(mu_);
    conns_.push_back(fd);
    workers_.emplace_back([this, fd] { Serve(fd); });
  }
}

void ScriptedS3::Serve(int fd) {
  std::string buf;
  char chunk[64 * 1024];
  auto fill = [&]() {
    ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) return false;
    buf.append(chunk, static_cast<size_t>(n));
    return true;
  };
  while (!stop_.load()) {
    size_t head_end;
    while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
      if (!fill()) goto done;
    }
    {
      ScriptedRequest req;
      std::string_view head(buf.data(), head_end);
      size_t line_end = head.find("\r\n");
      std::string_view line = head.substr(0, line_end);
      size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
      req.method = std::string(line.substr(0, sp1));
      std::string target(line.substr(sp1 + 1, sp2 - sp1 - 1));
      size_t q = target.find('?');
      req.path = target.substr(0, q);
      if (q != std::string::npos) req.query = target.substr(q + 1);
      size_t pos = line_end == std::string_view::npos ? head.size() : line_end + 2;
      while (pos < head.size()) {
        size_t e = head.find("\r\n", pos);
        if (e == std::string_view::npos) e = head.size();
        std::string_view h = head.substr(pos, e - pos);
        size_t colon = h.find(':');
        if (colon != std::string_view::npos) req.headers[Lower(Trim(h.substr(0, colon)))] = Trim(h.substr(colon + 1));
        pos = e + 2;
      }
      size_t body_len = std::strtoull(req.Header("content-length").c_str(), nullptr, 10);
      buf.erase(0, head_end + 4);
      while (buf.size() < body_len) {
        if (!fill()) goto done;
      }
      req.body = buf.substr(0, body_len);
      buf.erase(0, body_len);
      requests_.fetch_add(1);
      {
        std::lock_guard<std::mutex> lock(mu_);
        log_.push_back(req.method + " " + req.path + (req.query.empty() ? "" : "?" + req.query));
      }
      ScriptedReply reply = handler_(req);
      if (!WriteAll(fd, reply.raw) || reply.close) goto done;
    }
  }
done:
  ::shutdown(fd, SHUT_RDWR);
  std::lock_guard<std::mutex> lock(mu_);
  for (int& c : conns_) {
    if (c == fd) c = -1;
  }
  ::close(fd);
}

}  // namespace deltasync::testing
