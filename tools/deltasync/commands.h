// The deltasync CLI's subcommands. Each Run* function does one command and
// returns a Status; main.cc turns a non-OK one into "deltasync: error: ..."
// and exit code 1. The CLI uses only the public headers in include/deltasync/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "deltasync/status.h"

namespace deltasync::cli {

struct DiffArgs {
  std::string old_path, new_path, out_path;
  std::string encoding = "gap_delta";
  uint64_t version = 1;
  std::optional<uint64_t> base_version;  // compact only; default version - 1
  std::optional<uint64_t> stream_version;  // compact only; default kCompactStreamAuto
  std::optional<uint64_t> container;       // compact only; default kDefaultCompactContainer
  bool allow_nonfinite = false;
  bool json = false;
};
Status RunDiff(const DiffArgs& args);

struct ApplyArgs {
  std::string base_path;
  std::vector<std::string> patch_paths;
  std::string out_path;
};
Status RunApply(const ApplyArgs& args);

struct InspectArgs {
  std::string path;
  std::string base_path;  // compact container 2: names the changed tensors
  bool json = false;
};
Status RunInspect(const InspectArgs& args);

struct PublishArgs {
  std::string bucket, file;
  uint64_t version = 0;
  // Unset unless given: the bucket's stored settings, or the defaults for a
  // new bucket (PublisherOptions).
  std::optional<uint64_t> anchor_interval;
  std::optional<std::string> encoding;
  std::optional<uint64_t> cumulative_interval;
  std::optional<double> anchor_max_fraction;
  bool change_settings = false;
  bool allow_version_jump = false;
  bool allow_nonfinite = false;
  std::string parts = "one";  // "per-file": a model folder as one part per weight file
  std::vector<std::string> notify;  // replica daemon URLs to wake after the commit
  std::string notify_token_file;
  bool create_bucket = false;
  bool json = false;   // one JSON object on stdout instead of the text line
  bool quiet = false;  // nothing on stdout on success
};
Status RunPublish(const PublishArgs& args);

struct PullArgs {
  std::string bucket, out_path;
  std::optional<uint64_t> version;
  std::string hf_dir;          // a model folder instead of out_path
  std::string max_shard_size;  // with hf_dir: "5GB", "500MB", "2GiB", bytes
  bool force = false;          // with hf_dir: replace a non-empty folder
  bool json = false;
  bool quiet = false;
};

// "5GB" -> 5e9, "2GiB" -> 2^31, "123" -> 123 (B, KB, MB, GB, TB decimal;
// KiB, MiB, GiB, TiB binary; case-insensitive). kInvalidArgument naming
// `flag` otherwise.
Result<uint64_t> ParseByteSize(const std::string& text, const std::string& flag);
Status RunPull(const PullArgs& args);

// Hidden: a replica process for the demo. Follows the bucket one version at a
// time up to `until`, printing one JSON line per version on stdout.
struct FollowArgs {
  std::string bucket;
  uint64_t until = 0;
  int poll_ms = 20;
  int timeout_s = 600;
  int threads = 1;
};
Status RunFollow(const FollowArgs& args);

// Bucket maintenance: with keep_anchors, prune versions no catch-up path to
// the newest `keep_anchors` anchors needs (include/deltasync/retention.h);
// on S3, abort multipart uploads older than `abort_uploads_older_than_h`
// hours that a crashed publisher left behind.
struct GcArgs {
  std::string bucket;
  std::optional<uint64_t> keep_anchors;
  bool dry_run = false;
  bool anchor_check_size = false;  // --anchor-check size
  double abort_uploads_older_than_h = 24;
  double temp_older_than_h = 1;
  bool json = false;
  bool quiet = false;
};
Status RunGc(const GcArgs& args);

// log (alias ls): one line per version of the bucket's manifest (its
// objects, changed %, bytes per changed element, time, encoding), totals.
struct LogArgs {
  std::string bucket;
  bool json = false;
};
Status RunLog(const LogArgs& args);

// verify: checks the objects a version needs (default: the newest), or with
// `all` every object, and replays them against the manifest's state hashes
// (include/deltasync/verify.h). A non-OK Status (exit 1) after the report
// when anything is bad or unreachable.
struct VerifyArgs {
  std::string bucket;
  std::optional<uint64_t> version;
  bool all = false;
  bool json = false;
  int threads = 0;
};
Status RunVerify(const VerifyArgs& args);

struct BenchArgs {
  bool quick = false;
  bool json = false;
  int threads = 2;
  // --sweep: the replica's compact apply over model sizes x change rates.
  bool sweep = false;
  std::vector<double> scales{0.25, 1.0, 2.0};
  std::vector<double> rates{0.005, 0.03, 0.10};
};
Status RunBench(const BenchArgs& args);

struct DemoArgs {
  std::string bucket = "./deltasync-demo";
  uint64_t steps = 20;
  double lr = 3e-6;
  int layers = 28;
  uint64_t anchor_interval = 10;
  uint64_t seed = 1234;
  int replicas = 2;
  std::string encoding = "compact";
  uint64_t cumulative_interval = 0;
  bool serve = false;  // replicas as `serve` daemons, woken by /notify
  bool create_bucket = false;
  bool force = false;  // reuse a bucket the demo did not create (demo_bucket.h)
};
Status RunDemo(const DemoArgs& args, const std::string& self_exe);

// serve: a replica daemon (include/deltasync/server.h, docs/serve.md). Runs
// until SIGTERM or SIGINT; prints "listening on ADDR" once it accepts requests.
struct ServeArgs {
  std::string bucket;
  std::string listen = "127.0.0.1:8470";
  std::string out_dir;
  int keep = 2;
  std::string out_layout = "folder";  // "folder" or "file"
  std::string shm;
  std::string token_file;
  double poll = 1.0;
  std::string tls_cert, tls_key;
  int threads = 0;
  std::string log_level;  // debug|info|warn|error; empty: $DELTASYNC_LOG_LEVEL, else info
};
Status RunServe(const ServeArgs& args);

// A bearer token from a file: its contents without surrounding whitespace;
// an error for an empty file or one that is not a single printable token.
Result<std::string> ReadTokenFile(const std::string& path);

}  // namespace deltasync::cli
