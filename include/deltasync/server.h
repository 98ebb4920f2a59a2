// Server: `deltasync serve`, a replica daemon. It keeps a verified replica of
// the newest version in a bucket (a Replica driven by a watcher thread that
// polls manifest.json), hands the weights to an inference engine on the same
// host (--out: a model folder per version; --shm: a shared-memory region,
// docs/shm.md), and speaks HTTP: TRL's weight-update control plane plus
// /notify, /status, /healthz and /metrics (docs/serve.md has every schema).
//
// A replica follows the bucket by itself; a POST only wakes it early or moves
// it explicitly. Whatever goes wrong (a missing or corrupt object, a hash
// mismatch, an unreachable bucket), it keeps its last verified version and
// reports the failure in /status, /healthz and /metrics.
//
// Thread safety: Start, Stop and the accessors may be called from any thread.
// No call throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "deltasync/status.h"
#include "deltasync/store.h"

namespace deltasync {

// How --out lays out each version (docs/serve.md, "--out").
enum class OutLayout {
  kFolder,  // OUT/step_000012/: a Hugging Face model folder, plus the OUT/latest link
  kFile,    // OUT/step_000012.safetensors: one plain checkpoint
};

// The weight of a log line: kDebug for every poll, kInfo for events (a
// version reached, waiting for the first one, a pause), kWarn and kError for
// failures the daemon survives by retrying and holding its version.
enum class LogLevel { kDebug, kInfo, kWarn, kError };

struct ServerOptions {
  // The bucket URL (as for OpenStore). Not created when missing.
  std::string bucket;
  // When set, used instead of opening `bucket` (tests wrap a store to inject
  // faults).
  std::shared_ptr<Store> store;

  // HOST:PORT ("[::1]:PORT" for IPv6). Port 0 picks a free port; address()
  // tells which. Loopback by default: binding anything else exposes the
  // control routes to the network, so use a token (and TLS) when you do.
  std::string listen = "127.0.0.1:8470";

  // --out: when non-empty, every version held is written to this directory,
  // atomically, as a model folder with its side files (or, with
  // OutLayout::kFile, one safetensors file), keeping the newest `keep`
  // (docs/serve.md, "--out").
  std::string out_dir;
  int keep = 2;
  OutLayout out_layout = OutLayout::kFolder;
  // --shm: when non-empty, the POSIX shared-memory object of this name
  // ("/name" or "name") holds the state (docs/shm.md).
  std::string shm_name;

  // The bearer token mutating routes require. Empty: no authentication.
  // Compared in constant time; never logged.
  std::string token;

  // Seconds between manifest reads while nothing happens (jittered +-20%;
  // backs off exponentially, up to 30 s or the interval if larger, while
  // reads or updates fail). /notify, /resume and /update_weights do not wait
  // for it.
  double poll_seconds = 1.0;
  // /healthz turns 503 when no manifest read has succeeded for this long.
  // 0: max(10 s, 5 x poll_seconds).
  double stale_after_seconds = 0;
  // How long POST /update_weights waits for the version before answering 504.
  double update_timeout_seconds = 600;

  // Both or neither: PEM files for HTTPS.
  std::string tls_cert;
  std::string tls_key;

  // Request bodies larger than this are refused with 413.
  size_t max_body_bytes = 64 * 1024;
  // Threads a replica uses to apply and hash (0 = hardware concurrency).
  int threads = 0;

  // Receives one line per event (a version reached, a failure, a pause)
  // with its level. Lines never contain the token. Called from the daemon's
  // threads.
  std::function<void(LogLevel level, std::string_view line)> log;
};

class Server {
 public:
  // Opens the bucket, binds the listening socket and starts the watcher and
  // the HTTP threads. Returns once requests are accepted (the watcher may
  // still be catching up: /healthz answers 503 until a version is held).
  // Errors: bad options (kInvalidArgument), the bucket cannot be opened, the
  // address cannot be bound or the TLS files cannot be loaded (kIOError).
  static Result<std::unique_ptr<Server>> Start(ServerOptions options);

  // Stops (see Stop()).
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // "127.0.0.1:43127": the bound address with the real port.
  const std::string& address() const;
  int port() const;

  // Stops accepting requests, answers queued /update_weights with 503, waits
  // for an update in progress to finish (an update is never cut in half),
  // and removes the --shm object. Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  static Result<std::unique_ptr<Server>> StartOrThrow(ServerOptions options);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltasync
