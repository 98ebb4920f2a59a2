// Spawning, polling and stopping the demo's serve daemons. Their stderr (the
// event log) goes to /dev/null to keep the demo's table readable; failures
// reach the demo through /status (last_error) instead.
#include "demo_serve.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "children.h"

namespace deltasync::cli {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// The daemon's /status, or a discarded JSON when it does not answer.
nlohmann::json GetStatus(httplib::Client& client) {
  httplib::Result r = client.Get("/status");
  if (!r || r->status != 200) return nlohmann::json(nlohmann::json::value_t::discarded);
  return nlohmann::json::parse(r->body, nullptr, false);
}

}  // namespace

Result<std::unique_ptr<ServeReplicas>> ServeReplicas::Spawn(const std::string& exe, const std::string& bucket,
                                                            int count) {
  auto replicas = std::make_unique<ServeReplicas>();
  for (int i = 0; i < count; ++i) {
    DS_ASSIGN_OR_RETURN(ChildProcess child,
                        SpawnWithStdoutPipe({exe, "serve", "--bucket", bucket, "--listen", "127.0.0.1:0", "--poll",
                                             "1", "--threads", "1"},
                                            /*quiet_stderr=*/true));
    pid_t pid = child.pid;
    replicas->daemons_.push_back(Daemon{pid, ""});
    // The one line the daemon prints on stdout.
    FILE* out = child.out;
    char line[256] = {};
    bool got = out && std::fgets(line, sizeof line, out);
    if (out) std::fclose(out);
    constexpr std::string_view kPrefix = "listening on ";
    std::string text = got ? std::string(line) : "";
    if (text.rfind(kPrefix, 0) != 0) {
      return Status::IOError("serve daemon " + std::to_string(i + 1) + " did not start (printed '" + text + "')");
    }
    text = text.substr(kPrefix.size());
    while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
    replicas->daemons_.back().address = text;
  }
  return replicas;
}

ServeReplicas::~ServeReplicas() {
  for (Daemon& d : daemons_) {
    if (d.pid <= 0) continue;
    ::kill(d.pid, SIGKILL);
    WaitChild(d.pid);
  }
}

std::vector<std::string> ServeReplicas::NotifyUrls() const {
  std::vector<std::string> urls;
  for (const Daemon& d : daemons_) urls.push_back("http://" + d.address);
  return urls;
}

Status ServeReplicas::Check(uint64_t version, Clock::time_point published, const StateHash& trainer_hash,
                            double timeout_s, std::string& cells) {
  std::vector<std::unique_ptr<httplib::Client>> clients;
  for (const Daemon& d : daemons_) {
    clients.push_back(std::make_unique<httplib::Client>("http://" + d.address));
    clients.back()->set_connection_timeout(5, 0);
    clients.back()->set_read_timeout(30, 0);
    clients.back()->set_keep_alive(true);
  }
  // First every daemon's lag as /status reports it now (the /notify may or
  // may not have landed yet), then the wait until each holds the version.
  std::vector<uint64_t> lag;
  for (auto& c : clients) {
    nlohmann::json s = GetStatus(*c);
    lag.push_back(s.is_object() && s["lag_versions"].is_number_unsigned() ? s["lag_versions"].get<uint64_t>() : 0);
  }
  std::vector<double> held_ms(clients.size(), -1);
  std::vector<nlohmann::json> final_status(clients.size());
  for (size_t done = 0; done < clients.size();) {
    for (size_t i = 0; i < clients.size(); ++i) {
      if (held_ms[i] >= 0) continue;
      nlohmann::json s = GetStatus(*clients[i]);
      if (s.is_object() && s["version"].is_number_unsigned() && s["version"].get<uint64_t>() >= version) {
        held_ms[i] = MsSince(published);
        final_status[i] = s;
        ++done;
      } else if (MsSince(published) > timeout_s * 1000) {
        std::string why = s.is_object() && s["last_error"].is_object()
                              ? s["last_error"]["message"].get<std::string>()
                              : "no answer or still behind";
        return Status::IOError("serve daemon " + std::to_string(i + 1) + " did not reach version " +
                               std::to_string(version) + ": " + why);
      }
    }
    if (done < clients.size()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Status failure;
  for (size_t i = 0; i < clients.size(); ++i) {
    char cell[96];
    std::snprintf(cell, sizeof cell, "%slag %llu, held +%.0f", cells.empty() ? "" : "; ",
                  static_cast<unsigned long long>(lag[i]), held_ms[i]);
    cells += cell;
    const nlohmann::json& s = final_status[i];
    if (s["version"].get<uint64_t>() != version || s["state_hash"] != trainer_hash.Hex()) {
      failure = Status::Integrity("version " + std::to_string(version) + ": MISMATCH on serve daemon " +
                                  std::to_string(i + 1) + " (holds " + s["version"].dump() + " with state hash " +
                                  s["state_hash"].dump() + ", trainer " + trainer_hash.Hex() + ")");
    }
  }
  return failure;
}

Status ServeReplicas::Stop() {
  for (Daemon& d : daemons_) ::kill(d.pid, SIGTERM);
  Status failure;
  for (size_t i = 0; i < daemons_.size(); ++i) {
    int status = WaitChild(daemons_[i].pid);
    daemons_[i].pid = -1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failure = Status::Internal("serve daemon " + std::to_string(i + 1) + " did not stop cleanly");
    }
  }
  return failure;
}

}  // namespace deltasync::cli
