// demo: the main job. A synthetic Qwen3-0.6B-shaped model trains with AdamW;
// every version goes to the bucket; replica processes follow the bucket and
// report, per version, a full hash of their state, which must equal the hash
// the trainer computes from its own weights.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "children.h"
#include "commands.h"
#include "demo_bucket.h"
#include "demo_serve.h"
#include "output.h"
#include "deltasync/changes.h"
#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/state_hash.h"
#include "deltasync/store.h"
#include "synthetic_model.h"

namespace deltasync::cli {
namespace {

struct ReplicaProcess {
  pid_t pid = -1;
  FILE* out = nullptr;
};

Result<ReplicaProcess> SpawnReplica(const std::string& exe, const std::string& bucket, uint64_t until) {
  DS_ASSIGN_OR_RETURN(ChildProcess child,
                      SpawnWithStdoutPipe({exe, "follow", bucket, "--until", std::to_string(until), "--threads", "1"},
                                          /*quiet_stderr=*/false));
  return ReplicaProcess{child.pid, child.out};
}

// The replica's next report, or an error when it died.
Result<nlohmann::json> ReadReport(ReplicaProcess& r, int index) {
  char* line = nullptr;
  size_t cap = 0;
  ssize_t n = ::getline(&line, &cap, r.out);
  std::string text = n > 0 ? std::string(line, static_cast<size_t>(n)) : "";
  std::free(line);
  if (n <= 0) return Status::IOError("replica " + std::to_string(index) + " exited without reporting");
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::Internal("replica " + std::to_string(index) + " printed: " + text);
  return j;
}

// Drawn only on a terminal (output.h).
void Progress(const std::string& what) { DrawProgressLine(what); }
void ClearProgress() { EraseProgressLine(); }

}  // namespace

Status RunDemo(const DemoArgs& args, const std::string& self_exe) {
  DS_ASSIGN_OR_RETURN(IndexEncoding encoding, ParseEncoding(args.encoding));
  DS_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(args.bucket, /*create=*/true, args.create_bucket));
  DS_RETURN_IF_ERROR(PrepareDemoBucket(*store, args.force));

  SyntheticModelOptions model;
  model.layers = args.layers;
  model.lr = args.lr;
  model.seed = args.seed;
  Progress("initialising the model...");
  SyntheticTrainer trainer(model);
  const double full_mb = static_cast<double>(trainer.num_elements()) * 2 / 1e6;
  ClearProgress();
  std::printf("deltasync demo: Qwen3-0.6B-shaped model, %d layers, %.1fM parameters (%.1f MB bf16), "
              "AdamW lr %g, %llu versions, anchor every %llu, %s encoding, %d replica %s\n",
              args.layers, trainer.num_elements() / 1e6, full_mb, args.lr,
              static_cast<unsigned long long>(args.steps), static_cast<unsigned long long>(args.anchor_interval),
              args.encoding.c_str(), args.replicas, args.serve ? "daemons (serve, woken by /notify)" : "processes");
  std::printf("bucket: %s\n\n", store->Describe().c_str());

  PublisherOptions options;
  options.anchor_interval = args.anchor_interval;
  options.encoding = encoding;
  options.cumulative_interval = args.cumulative_interval;
  options.measure_gap_delta = true;  // TRL's size beside ours, per version
  // --serve: the daemons start first, so the publisher knows whom to notify.
  std::unique_ptr<ServeReplicas> daemons;
  if (args.serve) {
    DS_ASSIGN_OR_RETURN(daemons, ServeReplicas::Spawn(self_exe, store->Describe(), args.replicas));
    options.notify_urls = daemons->NotifyUrls();
  }
  DS_ASSIGN_OR_RETURN(auto publisher, Publisher::Open(store, options));

  std::vector<ReplicaProcess> replicas;
  auto stop_replicas = [&](bool kill_them) {
    for (ReplicaProcess& r : replicas) {
      if (kill_them) ::kill(r.pid, SIGTERM);
      if (r.out) std::fclose(r.out);
      WaitChild(r.pid);
    }
    replicas.clear();
  };
  for (int i = 0; i < args.replicas && !args.serve; ++i) {
    Result<ReplicaProcess> r = SpawnReplica(self_exe, store->Describe(), args.steps);
    if (!r.ok()) {
      stop_replicas(true);
      return r.status();
    }
    replicas.push_back(*r);
  }

  const std::string delta_column = args.encoding + " MB";
  std::printf("%7s %5s %9s %12s %12s %7s %10s %14s %-22s %s\n", "version", "step", "changed", delta_column.c_str(),
              "gap_delta MB", "B/chg", "anchor MB", "detect+enc ms",
              args.serve ? "/status lag, held +ms" : "replica apply ms", "check");
  std::vector<uint16_t> bf16(trainer.num_elements());
  double shipped_mb = 0, delta_mb = 0, trl_mb = 0, changed_sum = 0, changed_elements = 0;
  uint64_t delta_versions = 0, exact_versions = 0;
  Status failure;
  for (uint64_t version = 1; version <= args.steps && failure.ok(); ++version) {
    // Version 1 is the initial model; version k+1 holds the weights after k steps.
    if (version > 1) {
      Progress("training step " + std::to_string(version - 1) + "...");
      trainer.Step();
    }
    std::vector<TensorView> masters = trainer.MasterViews();
    Progress("publishing version " + std::to_string(version) + "...");
    Result<PublishStats> published = publisher->Publish(version, masters);
    const auto published_at = std::chrono::steady_clock::now();
    if (!published.ok()) {
      failure = published.status();
      break;
    }
    // The trainer's own full hash: its fp32 masters rounded to bf16, hashed
    // independently of the publisher's incremental bookkeeping.
    Progress("hashing the trainer's weights...");
    std::vector<TensorView> rounded;
    size_t offset = 0;
    for (const TensorView& m : masters) {
      size_t n = m.num_elements();
      ConvertFp32ToBf16(reinterpret_cast<const float*>(m.data.data()), bf16.data() + offset, n);
      rounded.push_back(TensorView{m.name, DType::kBF16, m.shape,
                                   ByteSpan(reinterpret_cast<const uint8_t*>(bf16.data() + offset), n * 2)});
      offset += n;
    }
    StateHash trainer_hash = HashTensors(rounded);

    Progress("waiting for replicas...");
    std::string applies, check = "bit-exact";
    if (daemons) {
      // Each daemon's /status: lag right after publish, then its state hash.
      Status held = daemons->Check(version, published_at, trainer_hash, 120, applies);
      if (!held.ok()) {
        check = held.message();
        failure = held;
      }
    }
    for (size_t i = 0; i < replicas.size(); ++i) {
      Result<nlohmann::json> report = ReadReport(replicas[i], static_cast<int>(i + 1));
      if (!report.ok()) {
        check = report.status().message();
        failure = report.status();
        continue;
      }
      const nlohmann::json& j = *report;
      if (j.contains("error")) {
        check = "replica " + std::to_string(i + 1) + ": " + j["error"].get<std::string>();
        failure = Status::Integrity(check);
        continue;
      }
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%.1f", applies.empty() ? "" : ", ", j["apply_ms"].get<double>());
      applies += buf;
      if (j["version"].get<uint64_t>() != version || j["full_hash"] != trainer_hash.Hex() ||
          j["state_hash"] != trainer_hash.Hex()) {
        check = "MISMATCH on replica " + std::to_string(i + 1) + " (full hash " + j["full_hash"].get<std::string>() +
                ", trainer " + trainer_hash.Hex() + ")";
        failure = Status::Integrity("version " + std::to_string(version) + ": " + check);
      }
    }
    ClearProgress();
    const PublishStats& s = *published;
    // Known whenever a delta was written (unknown only for a recovered version).
    const uint64_t changed_n = s.changed_elements.value_or(0);
    double changed = s.total_elements ? 100.0 * changed_n / s.total_elements : 0.0;
    auto mb = [](uint64_t bytes, bool present) {
      char buf[32];
      if (present) {
        std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(bytes) / 1e6);
      } else {
        std::snprintf(buf, sizeof buf, "-");
      }
      return std::string(buf);
    };
    char per_changed[32] = "-";
    if (s.wrote_delta && changed_n) {
      std::snprintf(per_changed, sizeof per_changed, "%.3f",
                    static_cast<double>(s.delta_bytes) / static_cast<double>(changed_n));
    }
    std::printf("%7llu %5llu %8.3f%% %12s %12s %7s %10s %14.1f %-22s %s\n", static_cast<unsigned long long>(version),
                static_cast<unsigned long long>(version - 1), s.wrote_delta ? changed : 100.0,
                mb(s.delta_bytes, s.wrote_delta).c_str(), mb(s.gap_delta_bytes, s.wrote_delta).c_str(), per_changed,
                mb(s.anchor_bytes, s.wrote_anchor).c_str(), s.detect_encode_ms, applies.c_str(), check.c_str());
    std::fflush(stdout);
    if (s.wrote_delta) {
      delta_mb += static_cast<double>(s.delta_bytes) / 1e6;
      trl_mb += static_cast<double>(s.gap_delta_bytes) / 1e6;
      changed_sum += changed;
      changed_elements += static_cast<double>(changed_n);
      ++delta_versions;
    }
    shipped_mb += static_cast<double>(s.delta_bytes + s.anchor_bytes + s.cumulative_bytes) / 1e6;
    if (check == "bit-exact") ++exact_versions;
  }
  stop_replicas(!failure.ok());
  if (daemons) {
    Status stopped = daemons->Stop();
    if (failure.ok()) failure = stopped;
  }
  if (!failure.ok()) return failure;

  std::printf("\n%llu versions, all bit-exact on %d replicas. Deltas: mean %.3f%% changed, mean %.2f MB %s "
              "(%.1fx smaller than the %.1f MB bf16 model) vs %.2f MB as TRL gap_delta; %.3f vs %.3f bytes per "
              "changed element (%.2fx smaller). Bucket holds %.1f MB in all.\n",
              static_cast<unsigned long long>(exact_versions), args.replicas,
              delta_versions ? changed_sum / delta_versions : 0.0, delta_versions ? delta_mb / delta_versions : 0.0,
              args.encoding.c_str(), delta_mb > 0 ? full_mb / (delta_mb / delta_versions) : 0.0, full_mb,
              delta_versions ? trl_mb / delta_versions : 0.0, changed_elements > 0 ? delta_mb * 1e6 / changed_elements : 0.0,
              changed_elements > 0 ? trl_mb * 1e6 / changed_elements : 0.0, delta_mb > 0 ? trl_mb / delta_mb : 0.0,
              shipped_mb);
  std::printf("A version with an anchor (a full snapshot) also has a delta; replicas that follow apply the delta.\n");
  return Status::OK();
}

}  // namespace deltasync::cli
