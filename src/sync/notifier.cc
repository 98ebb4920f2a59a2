// One thread per replica URL, each with its own keep-alive connection, so a
// dead replica's timeouts never delay the others. The publisher only sets a
// number and signals a condition variable.
#include "sync/notifier.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

namespace deltasync {

struct Notifier::Target {
  std::string url;          // as given, for messages (never holds the token)
  std::string origin;       // "http://host:port"
  std::string path;         // "/notify" or "/prefix/notify"
  std::string bad_url;      // why `url` cannot be used; empty when fine
  std::mutex mu;
  std::condition_variable cv;
  uint64_t pending = 0;     // the newest version handed over
  uint64_t handled = 0;     // the newest version posted or given up on
  bool stop = false;
  bool logged = false;      // one stderr line per URL at most
  std::thread thread;
};

namespace {

// Splits "http(s)://host[:port][/prefix]" into origin and the /notify path.
bool SplitUrl(const std::string& url, std::string& origin, std::string& path, std::string& why) {
  size_t scheme_end = url.find("://");
  std::string scheme = scheme_end == std::string::npos ? "" : url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") {
    why = "must start with http:// or https://";
    return false;
  }
  size_t slash = url.find('/', scheme_end + 3);
  origin = url.substr(0, slash);
  if (origin.size() == scheme_end + 3) {
    why = "has no host";
    return false;
  }
  path = slash == std::string::npos ? "" : url.substr(slash);
  while (!path.empty() && path.back() == '/') path.pop_back();
  constexpr std::string_view kRoute = "/notify";
  if (path.size() < kRoute.size() || path.substr(path.size() - kRoute.size()) != kRoute) path += kRoute;
  return true;
}

}  // namespace

Notifier::Notifier(const std::vector<std::string>& urls, std::string token) {
  for (const std::string& url : urls) {
    auto t = std::make_unique<Target>();
    t->url = url;
    if (!SplitUrl(url, t->origin, t->path, t->bad_url)) t->bad_url = "notify URL '" + url + "' " + t->bad_url;
    targets_.push_back(std::move(t));
  }
  try {
    for (auto& t : targets_) t->thread = std::thread([this, target = t.get(), token] { Run(*target, token); });
  } catch (...) {
    Stop();  // join the threads that did start, then report
    throw;
  }
}

void Notifier::Run(Target& target, const std::string& token) {
  std::unique_ptr<httplib::Client> client;
  if (target.bad_url.empty()) {
    client = std::make_unique<httplib::Client>(target.origin);
    // Short: a replica that does not answer quickly is polled anyway.
    client->set_connection_timeout(1, 0);
    client->set_read_timeout(2, 0);
    client->set_write_timeout(2, 0);
    client->set_keep_alive(true);
    if (!token.empty()) client->set_bearer_token_auth(token);
    // https: the replica's certificate must verify (system CA store); the
    // token must not go to whoever answers.
    client->enable_server_certificate_verification(true);
  }
  std::unique_lock lock(target.mu);
  for (;;) {
    target.cv.wait(lock, [&] { return target.pending > target.handled || target.stop; });
    if (target.pending <= target.handled) break;  // stopping, nothing left to send
    const uint64_t version = target.pending;
    lock.unlock();
    std::string error = target.bad_url;
    if (client) {
      std::string body = "{\"version\":" + std::to_string(version) + "}";
      httplib::Result res = client->Post(target.path.c_str(), body, "application/json");
      if (!res) {
        error = "POST " + target.url + ": " + httplib::to_string(res.error());
      } else if (res->status / 100 != 2) {
        error = "POST " + target.url + ": HTTP " + std::to_string(res->status) + " " + res->body;
        while (!error.empty() && (error.back() == '\n' || error.back() == ' ')) error.pop_back();
      }
    }
    (error.empty() ? delivered_ : failed_)++;
    lock.lock();
    if (!error.empty() && !target.logged) {
      target.logged = true;
      std::fprintf(stderr,
                   "deltasync: notify failed: %s (the replica still polls; later failures for this URL are not "
                   "logged)\n",
                   error.c_str());
    }
    target.handled = version;
    target.cv.notify_all();  // Flush waits on it
  }
}

void Notifier::Stop() {
  for (auto& t : targets_) {
    {
      std::lock_guard lock(t->mu);
      t->stop = true;
    }
    t->cv.notify_all();
  }
  for (auto& t : targets_) {
    if (t->thread.joinable()) t->thread.join();
  }
}

Notifier::~Notifier() { Stop(); }

void Notifier::Notify(uint64_t version) {
  for (auto& t : targets_) {
    {
      std::lock_guard lock(t->mu);
      if (version <= t->pending) continue;
      t->pending = version;
    }
    t->cv.notify_all();
  }
}

bool Notifier::Flush(double timeout_seconds) const {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                          std::chrono::duration<double>(timeout_seconds));
  for (const auto& t : targets_) {
    std::unique_lock lock(t->mu);
    if (!t->cv.wait_until(lock, deadline, [&] { return t->handled >= t->pending; })) return false;
  }
  return true;
}

void NotifyAfterCommit(std::shared_ptr<Notifier>& notifier, const PublisherOptions& options, uint64_t version) {
  if (options.notify_urls.empty()) return;
  // Never fails the publish: without threads (std::system_error) or memory,
  // replicas simply find the version by polling.
  try {
    if (!notifier) notifier = std::make_shared<Notifier>(options.notify_urls, options.notify_token);
    notifier->Notify(version);
  } catch (const std::exception& e) {
    static std::once_flag logged;
    std::call_once(logged, [&] { std::fprintf(stderr, "deltasync: cannot notify replicas: %s\n", e.what()); });
  }
}

}  // namespace deltasync
