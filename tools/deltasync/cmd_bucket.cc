// publish, pull, follow: commands on a bucket.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/retention.h"
#include "deltasync/s3_store.h"
#include "deltasync/safetensors.h"
#include "deltasync/store.h"
#include "output.h"

namespace deltasync::cli {

Status RunPublish(const PublishArgs& args) {
  DS_ASSIGN_OR_RETURN(IndexEncoding encoding, ParseEncoding(args.encoding));
  DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(args.file));
  DS_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(args.bucket, /*create=*/true, args.create_bucket));
  PublisherOptions options;
  options.anchor_interval = args.anchor_interval;
  options.encoding = encoding;
  options.cumulative_interval = args.cumulative_interval;
  options.anchor_max_fraction = args.anchor_max_fraction;
  options.allow_nonfinite = args.allow_nonfinite;
  options.notify_urls = args.notify;
  auto started = std::chrono::steady_clock::now();
  const char* phase = "reading the bucket";
  options.progress = [&](uint64_t done, uint64_t total) {
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    DrawProgressLine(TransferText(phase, done, total, elapsed));
  };
  if (!args.notify_token_file.empty()) {
    DS_ASSIGN_OR_RETURN(options.notify_token, ReadTokenFile(args.notify_token_file));
  }
  auto opened = Publisher::Open(store, options);
  EraseProgressLine();
  DS_ASSIGN_OR_RETURN(auto publisher, std::move(opened));
  phase = "uploading";
  started = std::chrono::steady_clock::now();
  Result<PublishStats> published = publisher->Publish(args.version, file.tensors());
  EraseProgressLine();
  DS_ASSIGN_OR_RETURN(PublishStats stats, std::move(published));
  if (args.quiet) return Status::OK();
  if (args.json) {
    PrintJson({{"version", stats.version},
               {"bucket", store->Describe()},
               {"total_elements", stats.total_elements},
               {"changed_elements", stats.changed_elements},
               {"wrote_delta", stats.wrote_delta},
               {"delta_bytes", stats.delta_bytes},
               {"cumulative_bytes", stats.cumulative_bytes},
               {"wrote_anchor", stats.wrote_anchor},
               {"anchor_bytes", stats.anchor_bytes},
               {"state_hash", stats.state_hash.Hex()},
               {"detect_encode_ms", stats.detect_encode_ms},
               {"upload_ms", stats.upload_ms}});
    return Status::OK();
  }
  std::printf("published version %llu to %s: %.3f%% changed", static_cast<unsigned long long>(stats.version),
              store->Describe().c_str(),
              stats.total_elements ? 100.0 * stats.changed_elements / stats.total_elements : 0.0);
  if (stats.wrote_delta) std::printf(", delta %s", HumanBytes(static_cast<double>(stats.delta_bytes)).c_str());
  if (stats.cumulative_bytes) {
    std::printf(", cumulative delta %s", HumanBytes(static_cast<double>(stats.cumulative_bytes)).c_str());
  }
  if (stats.wrote_anchor) std::printf(", anchor %s", HumanBytes(static_cast<double>(stats.anchor_bytes)).c_str());
  std::printf(", state hash %s\n", stats.state_hash.Hex().c_str());
  return Status::OK();
}

Status RunPull(const PullArgs& args) {
  DS_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(args.bucket, /*create=*/false));
  ReplicaOptions options;
  const auto started = std::chrono::steady_clock::now();
  options.progress = [&](uint64_t done, uint64_t total) {
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    DrawProgressLine(TransferText("downloading", done, total, elapsed));
  };
  std::unique_ptr<Replica> replica = Replica::Create(store, std::move(options));
  Result<UpdateStats> updated = replica->Update(args.version);
  EraseProgressLine();
  DS_ASSIGN_OR_RETURN(UpdateStats stats, std::move(updated));
  DS_RETURN_IF_ERROR(WriteStateFile(args.out_path, replica->state(), replica->version()));
  if (args.quiet) return Status::OK();
  if (args.json) {
    PrintJson({{"version", replica->version()},
               {"bucket", store->Describe()},
               {"output", args.out_path},
               {"anchors_applied", stats.anchors_applied},
               {"deltas_applied", stats.deltas_applied},
               {"bytes_downloaded", stats.bytes_downloaded},
               {"download_ms", stats.download_ms},
               {"apply_ms", stats.apply_ms},
               {"state_hash", replica->state_hash().Hex()}});
    return Status::OK();
  }
  std::printf("pulled version %llu from %s into %s: %llu anchor(s) + %llu delta(s), %s downloaded, state hash %s\n",
              static_cast<unsigned long long>(replica->version()), store->Describe().c_str(), args.out_path.c_str(),
              static_cast<unsigned long long>(stats.anchors_applied),
              static_cast<unsigned long long>(stats.deltas_applied),
              HumanBytes(static_cast<double>(stats.bytes_downloaded)).c_str(), replica->state_hash().Hex().c_str());
  return Status::OK();
}

Status RunGc(const GcArgs& args) {
  DS_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(args.bucket, /*create=*/false));
  const bool text = !args.json && !args.quiet;
  nlohmann::ordered_json out = {{"bucket", store->Describe()}, {"dry_run", args.dry_run}, {"pruned", nullptr},
                                {"aborted_uploads", nullptr}};
  if (args.keep_anchors) {
    DS_ASSIGN_OR_RETURN(PruneStats pruned, PruneVersions(*store, *args.keep_anchors, args.dry_run));
    out["pruned"] = {{"removed_versions", pruned.removed_versions},
                     {"objects_deleted", pruned.objects_deleted},
                     {"bytes_deleted", pruned.bytes_deleted},
                     {"kept_versions", pruned.kept_versions},
                     {"kept_anchors", pruned.kept_anchors}};
    std::string kept;
    for (uint64_t v : pruned.kept_anchors) kept += (kept.empty() ? "" : ", ") + std::to_string(v);
    if (text) {
      std::printf("%s: %s %zu version(s) (%s%llu object(s), %s); kept %llu version(s), anchors %s\n",
                  store->Describe().c_str(), args.dry_run ? "would remove" : "removed",
                  pruned.removed_versions.size(),
                  pruned.removed_versions.empty()
                      ? ""
                      : (std::to_string(pruned.removed_versions.front()) + "-" +
                         std::to_string(pruned.removed_versions.back()) + ": ")
                            .c_str(),
                  static_cast<unsigned long long>(pruned.objects_deleted),
                  HumanBytes(static_cast<double>(pruned.bytes_deleted)).c_str(),
                  static_cast<unsigned long long>(pruned.kept_versions), kept.empty() ? "none" : kept.c_str());
    }
  }
  auto* s3 = dynamic_cast<S3Store*>(store.get());
  if (s3 == nullptr) {
    if (!args.keep_anchors && text) {
      std::printf("%s: a local bucket has no multipart uploads to abort; nothing to do (--keep-anchors K prunes "
                  "old versions)\n",
                  store->Describe().c_str());
    }
  } else if (!args.dry_run) {
    size_t aborted = 0;
    auto older_than = std::chrono::seconds(static_cast<int64_t>(args.abort_uploads_older_than_h * 3600));
    DS_RETURN_IF_ERROR(s3->AbortStaleUploads(older_than, &aborted));
    out["aborted_uploads"] = aborted;
    if (text) {
      std::printf("%s: aborted %zu multipart upload(s) older than %g h\n", store->Describe().c_str(), aborted,
                  args.abort_uploads_older_than_h);
    }
  }
  if (args.json) PrintJson(out);
  return Status::OK();
}

// One JSON line per version reached; the demo reads them. An error is
// reported as a line too (then the process exits 1).
Status RunFollow(const FollowArgs& args) {
  DS_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(args.bucket, /*create=*/false));
  std::unique_ptr<Replica> replica = Replica::Create(store, ReplicaOptions{args.threads});
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(args.timeout_s);
  auto emit = [](const nlohmann::json& line) {
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
  };
  while (replica->version() < args.until) {
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::IOError("timed out waiting for version " + std::to_string(args.until));
    }
    Status refreshed = replica->Refresh();
    std::optional<uint64_t> next;
    if (refreshed.ok()) {
      for (const VersionEntry& v : replica->manifest().versions) {
        if (v.version > replica->version()) {
          next = v.version;
          break;
        }
      }
    } else if (refreshed.code() != ErrorCode::kNotFound) {
      emit({{"error", refreshed.message()}});
      return refreshed;
    }
    if (!next) {
      std::this_thread::sleep_for(std::chrono::milliseconds(args.poll_ms));
      continue;
    }
    Result<UpdateStats> stats = replica->Update(*next);
    if (!stats.ok()) {
      emit({{"version", *next}, {"held", replica->version()}, {"error", stats.status().message()}});
      return stats.status();
    }
    // An independent full recomputation, to compare with the trainer's own.
    StateHash full = HashState(replica->state(), args.threads);
    emit({{"version", replica->version()},
          {"apply_ms", stats->apply_ms},
          {"download_ms", stats->download_ms},
          {"bytes", stats->bytes_downloaded},
          {"anchors", stats->anchors_applied},
          {"deltas", stats->deltas_applied},
          {"state_hash", replica->state_hash().Hex()},
          {"full_hash", full.Hex()}});
  }
  return Status::OK();
}

}  // namespace deltasync::cli
