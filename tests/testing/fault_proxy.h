// FaultProxy: a TCP proxy on 127.0.0.1 that forwards to a local server (the
// test RGW) and, on request, breaks the next requests in the ways networks
// and S3 do: connection resets, stalls, and "503 SlowDown" answers. Used to
// show that S3Store retries what it should and gives clear errors otherwise.
//
// It understands just enough HTTP/1.1 to count requests on a kept-alive
// connection: bytes from the client after the server has answered (or the
// first bytes of a connection) start a new request. That holds for clients
// that do not pipeline and send no "Expect: 100-continue", like S3Store.
//
// Loopback only; one thread; every fault is armed for a counted number of
// requests, so a test cannot leave it failing forever.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace deltasync::testing {

class FaultProxy {
 public:
  // Listens on an ephemeral 127.0.0.1 port and forwards each connection to
  // 127.0.0.1:upstream_port. nullptr (with *error set) when it cannot listen.
  static std::unique_ptr<FaultProxy> Start(uint16_t upstream_port, std::string* error);
  ~FaultProxy();  // stops the thread and closes every socket
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  uint16_t port() const { return port_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // The next n requests get their connection reset (RST): at once, before
  // anything reaches the server, when after_response_bytes is 0; otherwise
  // after that many bytes of the server's answer have been passed on.
  void ResetNextRequests(int n, uint64_t after_response_bytes = 0);
  // After `skip` requests pass, the next n are answered "503 Slow Down" (an
  // S3 <Error> with Code SlowDown) by the proxy itself; the connection is
  // then closed.
  void FailNextRequests(int n, int skip = 0);
  // The next n requests stall: nothing moves in either direction on their
  // connection for `duration`, then forwarding resumes.
  void StallNextRequests(int n, std::chrono::milliseconds duration);
  // Disarms every pending fault.
  void Clear();

  int requests() const { return requests_.load(); }        // request starts seen
  int faults_injected() const { return faults_.load(); }   // resets + 503s + stalls applied

 private:
  struct Conn;
  enum class Fault { kNone, kReset, kFail, kStall };

  FaultProxy() = default;
  void Loop();
  Fault TakeFault(uint64_t* reset_after, std::chrono::milliseconds* stall);

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  uint16_t port_ = 0;
  uint16_t upstream_port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;

  std::mutex mu_;  // guards the counters below
  int reset_next_ = 0;
  uint64_t reset_after_ = 0;
  int fail_next_ = 0;
  int fail_skip_ = 0;
  int stall_next_ = 0;
  std::chrono::milliseconds stall_for_{0};

  std::atomic<int> requests_{0};
  std::atomic<int> faults_{0};
};

}  // namespace deltasync::testing
