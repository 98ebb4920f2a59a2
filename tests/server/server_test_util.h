// Helpers for the daemon tests: a bucket with a publisher, in-process
// daemons on ephemeral loopback ports, plain HTTP calls, and `deltasync
// serve` child processes whose output lines can be waited for. Header-only:
// the test CMake builds tests/server/*_test.cc into one binary.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/server.h"
#include "deltasync/state_hash.h"
#include "deltasync/store.h"
#include "testing/bucket_util.h"
#include "testing/process_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

extern char** environ;

namespace deltasync::testing {

// Generous: these bound waits for things that take milliseconds, so that a
// loaded machine (or a sanitizer build) never fails a test by being slow.
inline constexpr std::chrono::seconds kWait{60};

// Polls `done` every few milliseconds until it is true or `timeout` passes.
inline bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout = kWait) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A bucket in a temporary directory with a publisher over a RandomModel.
class TestBucket {
 public:
  // An anchor every 4 versions by default, so that both kinds show up; TRL's
  // encoding, because the HTTP routes follow TRL's choreography, which names
  // TRL's objects (deltas/step_N.safetensors).
  explicit TestBucket(uint64_t seed = 1,
                      PublisherOptions options = {.anchor_interval = 4, .encoding = IndexEncoding::kGapDelta})
      : model_(seed) {
    dir_ = tmp_.Sub("bucket");
    store_ = OpenDirStore(dir_);
    auto p = Publisher::Open(store_, options);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    publisher_ = std::move(*p);
  }

  // Steps the model (except before the first version) and publishes it,
  // with `files` as the version's side files (nullopt: the previous set).
  StateHash Publish(uint64_t version, double fraction = 0.05,
                    std::optional<std::span<const SideFile>> files = std::nullopt) {
    if (publisher_->latest_version() > 0) model_.Step(fraction);
    auto stats = publisher_->Publish(version, model_.Views(), files);
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    hashes_[version] = stats.ok() ? stats->state_hash : StateHash{};
    return hashes_[version];
  }
  void PublishRange(uint64_t first, uint64_t last) {
    for (uint64_t v = first; v <= last; ++v) Publish(v);
  }

  const std::string& dir() const { return dir_; }
  std::shared_ptr<Store> store() const { return store_; }
  Publisher& publisher() { return *publisher_; }
  RandomModel& model() { return model_; }
  StateHash hash(uint64_t version) const { return hashes_.at(version); }
  const TempDir& tmp() const { return tmp_; }

 private:
  TempDir tmp_;
  std::string dir_;
  std::shared_ptr<Store> store_;
  RandomModel model_;
  std::unique_ptr<Publisher> publisher_;
  std::map<uint64_t, StateHash> hashes_;
};

// Options for a daemon on `store` that polls often (tests wait less).
inline ServerOptions DaemonOptions(std::shared_ptr<Store> store) {
  ServerOptions o;
  o.store = std::move(store);
  o.poll_seconds = 0.05;
  o.threads = 1;
  return o;
}

// An in-process daemon on 127.0.0.1 with an ephemeral port.
inline std::unique_ptr<Server> StartDaemon(ServerOptions options) {
  options.listen = "127.0.0.1:0";
  auto server = Server::Start(std::move(options));
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? std::move(*server) : nullptr;
}

struct HttpReply {
  int status = 0;  // 0: no answer (connection failed)
  std::string body;
  nlohmann::json json;  // discarded when the body is not JSON
  httplib::Headers headers;
};

inline HttpReply ToReply(const httplib::Result& r) {
  HttpReply out;
  if (!r) return out;
  out.status = r->status;
  out.body = r->body;
  out.headers = r->headers;
  out.json = nlohmann::json::parse(out.body, nullptr, false);
  return out;
}

// A response header ("" when absent); names are case-insensitive.
inline std::string Header(const HttpReply& reply, const std::string& name) {
  auto it = reply.headers.find(name);
  return it == reply.headers.end() ? "" : it->second;
}

inline std::unique_ptr<httplib::Client> Client(const std::string& address) {
  auto c = std::make_unique<httplib::Client>("http://" + address);
  c->set_connection_timeout(10, 0);
  c->set_read_timeout(120, 0);
  c->set_write_timeout(30, 0);
  return c;
}

inline HttpReply HttpGet(const std::string& address, const std::string& path) {
  return ToReply(Client(address)->Get(path.c_str()));
}

inline HttpReply HttpPost(const std::string& address, const std::string& path, const std::string& body,
                          const std::string& token = "") {
  auto c = Client(address);
  if (!token.empty()) c->set_bearer_token_auth(token);
  return ToReply(c->Post(path.c_str(), body, "application/json"));
}

// The daemon's /status, or a discarded JSON when it does not answer.
inline nlohmann::json StatusOf(const std::string& address) { return HttpGet(address, "/status").json; }

inline uint64_t HeldVersion(const std::string& address) {
  nlohmann::json s = StatusOf(address);
  return s.is_object() && s["version"].is_number_unsigned() ? s["version"].get<uint64_t>() : 0;
}

inline bool WaitForVersion(const std::string& address, uint64_t version) {
  return WaitUntil([&] { return HeldVersion(address) >= version; });
}

// A daemon with DaemonOptions(store) that holds `version`; nullptr when it
// did not start or did not reach the version within kWait.
inline std::unique_ptr<Server> StartFollowing(std::shared_ptr<Store> store, uint64_t version) {
  std::unique_ptr<Server> daemon = StartDaemon(DaemonOptions(std::move(store)));
  if (!daemon || !WaitForVersion(daemon->address(), version)) return nullptr;
  return daemon;
}

inline std::string UpdateWeightsBody(const std::string& key) {
  return nlohmann::json{{"update_info", {{"repo_id", "bucket"}, {"filename", key}, {"update_kind", "sparse_flat"}}}}
      .dump();
}

// A unique POSIX shared-memory name for one test.
inline std::string UniqueShmName(const std::string& tag) {
  std::random_device rd;
  return "/ds-test-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
}

// `args` as the command that runs them. In a cross build whose tests run
// under an emulator (CMAKE_CROSSCOMPILING_EMULATOR, e.g. qemu-aarch64 in
// build-arm64/, docs/arm64.md) the built CLI is a foreign binary that the
// host kernel cannot exec without binfmt_misc (posix_spawn's child exits
// 127): it runs through the same emulator as the test, which passes it the
// environment (QEMU_CPU) too. Elsewhere `args` unchanged.
inline std::vector<std::string> EmulatedCommand(const std::vector<std::string>& args) {
  std::vector<std::string> command;
#ifdef DS_TEST_EMULATOR
  // The emulator and its arguments, '|'-separated (tests/CMakeLists.txt).
  const std::string emulator = DS_TEST_EMULATOR;
  for (size_t start = 0; start <= emulator.size();) {
    size_t end = emulator.find('|', start);
    if (end == std::string::npos) end = emulator.size();
    if (end > start) command.push_back(emulator.substr(start, end - start));
    start = end + 1;
  }
#endif
  command.insert(command.end(), args.begin(), args.end());
  return command;
}

// A child process (the built CLI) whose stdout and stderr lines are collected.
class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool Start(const std::vector<std::string>& args) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return false;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
    std::vector<std::string> copy = EmulatedCommand(args);
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    int rc = posix_spawn(&pid_, copy[0].c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    ::close(err[1]);
    if (rc != 0) {
      ::close(out[0]);
      ::close(err[0]);
      pid_ = -1;
      return false;
    }
    readers_.emplace_back([this, fd = out[0]] { Collect(fd, "out: "); });
    readers_.emplace_back([this, fd = err[0]] { Collect(fd, "err: "); });
    return true;
  }

  // The first collected line (prefixed "out: " or "err: ") containing
  // `needle`, waiting up to `timeout`.
  std::optional<std::string> WaitForLine(const std::string& needle, std::chrono::milliseconds timeout = kWait) {
    std::unique_lock lock(mu_);
    std::optional<std::string> found;
    cv_.wait_for(lock, timeout, [&] {
      for (const std::string& l : lines_) {
        if (l.find(needle) != std::string::npos) {
          found = l;
          return true;
        }
      }
      return closed_ == 2;
    });
    return found;
  }

  // The address from "listening on ADDR".
  std::string WaitForAddress() {
    std::optional<std::string> line = WaitForLine("out: listening on ");
    return line ? line->substr(std::strlen("out: listening on ")) : "";
  }

  void Signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }

  // The raw wait status. A child still running after `timeout` is killed
  // (a hung daemon fails its test instead of hanging the run).
  int Wait(std::chrono::milliseconds timeout = kWait) {
    int status = 0;
    if (pid_ > 0) {
      const testing::WaitResult waited = testing::WaitOrKill(pid_, timeout);
      if (waited.timed_out) ADD_FAILURE() << "child " << pid_ << " did not exit; killed";
      status = waited.status;
    }
    pid_ = -1;
    for (auto& t : readers_) t.join();
    readers_.clear();
    return status;
  }

  std::string Output() {
    std::lock_guard lock(mu_);
    std::string all;
    for (const std::string& l : lines_) all += l + "\n";
    return all;
  }

 private:
  void Collect(int fd, const std::string& prefix) {
    std::string partial;
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      partial.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = partial.find('\n')) != std::string::npos) {
        std::lock_guard lock(mu_);
        lines_.push_back(prefix + partial.substr(0, nl));
        partial.erase(0, nl + 1);
        cv_.notify_all();
      }
    }
    ::close(fd);
    std::lock_guard lock(mu_);
    if (!partial.empty()) lines_.push_back(prefix + partial);
    closed_++;
    cv_.notify_all();
  }

  pid_t pid_ = -1;
  std::vector<std::thread> readers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
  int closed_ = 0;
};

// The built CLI (the test binary is built with it; see tests/CMakeLists.txt).
inline std::string CliPath() { return std::string(DS_BINARY_DIR) + "/deltasync"; }

}  // namespace deltasync::testing
