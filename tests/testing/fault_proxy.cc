#include "testing/fault_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <list>
#include <vector>

namespace deltasync::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Per-direction buffer cap: beyond it the proxy stops reading (backpressure).
constexpr size_t kMaxPending = 4u << 20;
constexpr size_t kMaxConnections = 512;
// How long a failed connection is drained after the canned answer, so that
// closing it does not turn into an RST that destroys the answer in flight.
constexpr auto kDrainTime = std::chrono::seconds(2);

constexpr char kSlowDownBody[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
    "<Message>Please reduce your request rate.</Message><RequestId>fault-proxy</RequestId></Error>";

std::string SlowDownResponse() {
  return "HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: " +
         std::to_string(sizeof(kSlowDownBody) - 1) + "\r\nConnection: close\r\n\r\n" + kSlowDownBody;
}

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Closes with an RST instead of a FIN: what a crashed peer or middlebox does.
void CloseWithReset(int fd) {
  linger lg{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  ::close(fd);
}

int ConnectLoopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  SetNonBlocking(fd);
  return fd;
}

// Sends as much of `buf` as the socket takes; false on a hard error.
bool Flush(int fd, std::string& buf, size_t limit = SIZE_MAX) {
  size_t n = std::min(buf.size(), limit);
  if (n == 0) return true;
  ssize_t w = ::send(fd, buf.data(), n, MSG_NOSIGNAL);
  if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  buf.erase(0, static_cast<size_t>(w));
  return true;
}

}  // namespace

struct FaultProxy::Conn {
  int client = -1;
  int upstream = -1;
  std::string to_upstream, to_client;
  bool request_boundary = true;   // the next client bytes start a new request
  bool upstream_done = false;     // the server closed: flush to the client, then close
  bool reset_armed = false;
  uint64_t reset_budget = 0;      // response bytes still to pass before the RST
  bool failing = false;           // answered 503: send it, then drain and close
  Clock::time_point drain_until{};
  Clock::time_point stall_until{};
  bool dead = false;

  void Close(bool reset) {
    if (client >= 0) reset ? CloseWithReset(client) : (void)::close(client);
    if (upstream >= 0) ::close(upstream);
    client = upstream = -1;
    dead = true;
  }
};

std::unique_ptr<FaultProxy> FaultProxy::Start(uint16_t upstream_port, std::string* error) {
  std::unique_ptr<FaultProxy> p(new FaultProxy());
  p->upstream_port_ = upstream_port;
  p->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (p->listen_fd_ < 0 || ::bind(p->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(p->listen_fd_, 64) != 0 ||
      ::getsockname(p->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      ::pipe2(p->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    *error = std::string("fault proxy: cannot listen on 127.0.0.1: ") + std::strerror(errno);
    return nullptr;
  }
  SetNonBlocking(p->listen_fd_);
  p->port_ = ntohs(addr.sin_port);
  p->thread_ = std::thread([raw = p.get()] { raw->Loop(); });
  return p;
}

FaultProxy::~FaultProxy() {
  stop_.store(true);
  if (wake_[1] >= 0) (void)::write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void FaultProxy::ResetNextRequests(int n, uint64_t after_response_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  reset_next_ = n;
  reset_after_ = after_response_bytes;
}

void FaultProxy::FailNextRequests(int n, int skip) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_next_ = n;
  fail_skip_ = skip;
}

void FaultProxy::StallNextRequests(int n, std::chrono::milliseconds duration) {
  std::lock_guard<std::mutex> lock(mu_);
  stall_next_ = n;
  stall_for_ = duration;
}

void FaultProxy::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  reset_next_ = fail_next_ = fail_skip_ = stall_next_ = 0;
}

FaultProxy::Fault FaultProxy::TakeFault(uint64_t* reset_after, std::chrono::milliseconds* stall) {
  std::lock_guard<std::mutex> lock(mu_);
  if (reset_next_ > 0) {
    --reset_next_;
    *reset_after = reset_after_;
    return Fault::kReset;
  }
  if (fail_next_ > 0) {
    if (fail_skip_ > 0) {
      --fail_skip_;
      return Fault::kNone;
    }
    --fail_next_;
    return Fault::kFail;
  }
  if (stall_next_ > 0) {
    --stall_next_;
    *stall = stall_for_;
    return Fault::kStall;
  }
  return Fault::kNone;
}

void FaultProxy::Loop() {
  std::list<Conn> conns;
  std::vector<pollfd> fds;
  std::vector<std::pair<Conn*, bool>> owners;  // per pollfd: connection, is the client side
  char buf[64 * 1024];

  while (!stop_.load()) {
    const Clock::time_point now = Clock::now();
    fds.clear();
    owners.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    owners.emplace_back(nullptr, false);
    if (conns.size() < kMaxConnections) {
      fds.push_back({listen_fd_, POLLIN, 0});
      owners.emplace_back(nullptr, true);
    }
    for (Conn& c : conns) {
      if (now < c.stall_until) continue;  // a stalled connection moves nothing
      short cev = 0, uev = 0;
      if (c.to_upstream.size() < kMaxPending) cev |= POLLIN;
      if (!c.to_client.empty()) cev |= POLLOUT;
      if (c.upstream >= 0) {
        if (c.to_client.size() < kMaxPending && !c.upstream_done) uev |= POLLIN;
        if (!c.to_upstream.empty()) uev |= POLLOUT;
        fds.push_back({c.upstream, uev, 0});
        owners.emplace_back(&c, false);
      }
      fds.push_back({c.client, cev, 0});
      owners.emplace_back(&c, true);
    }
    if (::poll(fds.data(), fds.size(), 20) < 0 && errno != EINTR) break;

    for (size_t i = 0; i < fds.size(); ++i) {
      const pollfd& p = fds[i];
      if (p.revents == 0) continue;
      Conn* c = owners[i].first;
      bool client_side = owners[i].second;
      if (c == nullptr) {
        if (p.fd == wake_[0]) {
          while (::read(wake_[0], buf, sizeof buf) > 0) {
          }
          continue;
        }
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) continue;
        int up = ConnectLoopback(upstream_port_);
        if (up < 0) {
          ::close(fd);
          continue;
        }
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conns.push_back(Conn{});
        conns.back().client = fd;
        conns.back().upstream = up;
        continue;
      }
      if (c->dead) continue;

      if (client_side) {
        if (p.revents & POLLOUT) {
          size_t limit = c->reset_armed ? c->reset_budget : SIZE_MAX;
          size_t before = c->to_client.size();
          if (!Flush(c->client, c->to_client, limit)) {
            c->Close(false);
            continue;
          }
          if (c->reset_armed) {
            c->reset_budget -= before - c->to_client.size();
            if (c->reset_budget == 0) {
              faults_.fetch_add(1);
              c->Close(true);
              continue;
            }
          }
          if (c->failing && c->to_client.empty() && c->drain_until == Clock::time_point{}) {
            ::shutdown(c->client, SHUT_WR);
            c->drain_until = Clock::now() + kDrainTime;
          }
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
          ssize_t n = ::recv(c->client, buf, sizeof buf, 0);
          if (n <= 0) {
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            c->Close(false);  // the client is done with this connection
            continue;
          }
          if (c->failing) continue;  // drained and dropped
          if (c->request_boundary) {
            c->request_boundary = false;
            requests_.fetch_add(1);
            uint64_t reset_after = 0;
            std::chrono::milliseconds stall{0};
            switch (TakeFault(&reset_after, &stall)) {
              case Fault::kReset:
                if (reset_after == 0) {
                  faults_.fetch_add(1);
                  c->Close(true);
                  continue;
                }
                c->reset_armed = true;
                c->reset_budget = reset_after;
                break;
              case Fault::kFail:
                faults_.fetch_add(1);
                c->failing = true;
                c->to_client = SlowDownResponse();
                ::close(c->upstream);
                c->upstream = -1;
                continue;
              case Fault::kStall:
                faults_.fetch_add(1);
                c->stall_until = Clock::now() + stall;
                break;
              case Fault::kNone:
                break;
            }
          }
          c->to_upstream.append(buf, static_cast<size_t>(n));
        }
      } else {
        if (p.revents & POLLOUT) {
          if (!Flush(c->upstream, c->to_upstream)) {
            c->Close(false);
            continue;
          }
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
          ssize_t n = ::recv(c->upstream, buf, sizeof buf, 0);
          if (n <= 0) {
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            c->upstream_done = true;
            continue;
          }
          c->to_client.append(buf, static_cast<size_t>(n));
          c->request_boundary = true;  // the server answered: the client's next bytes are a new request
        }
      }
    }

    const Clock::time_point after = Clock::now();
    for (auto it = conns.begin(); it != conns.end();) {
      Conn& c = *it;
      if (!c.dead && c.upstream_done && c.to_client.empty()) c.Close(false);
      if (!c.dead && c.failing && c.drain_until != Clock::time_point{} && after >= c.drain_until) c.Close(false);
      it = c.dead ? conns.erase(it) : std::next(it);
    }
  }
  for (Conn& c : conns) c.Close(false);
}

}  // namespace deltasync::testing
