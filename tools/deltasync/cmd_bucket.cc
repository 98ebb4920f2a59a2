// publish, pull, follow: commands on a bucket.
#include <cctype>
#include <chrono>
#include <filesystem>
#include <optional>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "deltasync/folder_parts.h"
#include "deltasync/hf_folder.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/retention.h"
#include "deltasync/s3_store.h"
#include "deltasync/safetensors.h"
#include "deltasync/side_files.h"
#include "deltasync/store.h"
#include "deltasync/temp_file.h"
#include "output.h"
#include "publish_parts.h"

namespace deltasync::cli {

Status RunPublish(const PublishArgs& args) {
  PublisherOptions options;
  if (args.encoding) {
    DS_ASSIGN_OR_RETURN(options.encoding, ParseEncoding(*args.encoding));
  }
  // A model folder (shards + side files), or one checkpoint file that is not
  // part of a sharded one.
  std::error_code ec;
  const bool folder = std::filesystem::is_directory(args.file, ec);
  std::optional<HfFolder> dir;
  std::optional<SafetensorsFile> file;
  if (folder) {
    DS_ASSIGN_OR_RETURN(dir, ReadHfFolder(args.file));
  } else {
    DS_RETURN_IF_ERROR(CheckCheckpointFile(args.file));
    DS_ASSIGN_OR_RETURN(file, SafetensorsFile::Open(args.file));
  }
  if (args.parts == "per-file" && !folder) {
    return Status::InvalidArgument("--parts per-file publishes a model folder one part per weight file; " + args.file +
                                   " is one file: pass its folder, or leave out --parts");
  }
  DS_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(args.bucket, /*create=*/true, args.create_bucket));
  if (args.parts == "per-file") DS_RETURN_IF_ERROR(CheckPerFileParts(args, *store));
  options.anchor_interval = args.anchor_interval;
  options.cumulative_interval = args.cumulative_interval;
  options.anchor_max_fraction = args.anchor_max_fraction;
  options.change_settings = args.change_settings;
  options.allow_version_jump = args.allow_version_jump;
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
  // One part per weight file (folder_parts.h); a folder of one file is one
  // unparted version, as without --parts.
  const bool parted = folder && args.parts == "per-file" && dir->shards.size() > 1;
  FolderPartsStats parts;
  std::unique_ptr<Publisher> publisher;
  PublishStats stats;
  if (parted) {
    DS_ASSIGN_OR_RETURN(parts, PublishFolderParts(store, args.version, *dir, options));
    stats = parts.stats;
  } else {
    auto opened = Publisher::Open(store, options);
    EraseProgressLine();
    DS_ASSIGN_OR_RETURN(publisher, std::move(opened));
    if (publisher->degraded()) std::fprintf(stderr, "deltasync: warning: %s\n", publisher->degraded_reason().c_str());
    phase = "uploading";
    started = std::chrono::steady_clock::now();
    Result<PublishStats> published = folder ? publisher->PublishFolder(args.version, *dir)
                                            : publisher->Publish(args.version, file->tensors(), std::nullopt,
                                                                  [&] { return file->CheckUnchanged(); });
    EraseProgressLine();
    DS_ASSIGN_OR_RETURN(stats, std::move(published));
  }
  const std::vector<std::string> changed = publisher ? publisher->changed_settings() : parts.changed_settings;
  nlohmann::ordered_json changed_settings = changed;
  if (!changed.empty() && !args.json) {
    std::string list;
    for (const std::string& c : changed) list += (list.empty() ? "" : ", ") + c;
    std::fprintf(stderr, "deltasync: changed the settings of %s from version %llu on: %s\n",
                 store->Describe().c_str(), static_cast<unsigned long long>(stats.version), list.c_str());
  }
  if (args.quiet) return Status::OK();
  if (args.json) {
    nlohmann::ordered_json out = {{"version", stats.version},
                                  {"bucket", store->Describe()},
                                  {"total_elements", stats.total_elements},
                                  {"changed_elements", stats.changed_elements ? nlohmann::ordered_json(*stats.changed_elements)
                                                                              : nlohmann::ordered_json(nullptr)},
                                  {"recovered", stats.recovered},
                                  {"wrote_delta", stats.wrote_delta},
                                  {"delta_bytes", stats.delta_bytes},
                                  {"cumulative_bytes", stats.cumulative_bytes},
                                  {"wrote_anchor", stats.wrote_anchor},
                                  {"anchor_bytes", stats.anchor_bytes},
                                  {"state_hash", stats.state_hash.Hex()},
                                  {"detect_encode_ms", stats.detect_encode_ms},
                                  {"upload_ms", stats.upload_ms},
                                  {"changed_settings", changed_settings},
                                  {"parts", parted ? parts.parts : 1}};
    if (folder) {
      nlohmann::ordered_json side = nlohmann::ordered_json::array();
      for (const SideFile& f : dir->side_files) side.push_back(f.name);
      out["weight_files"] = dir->shards.size();
      out["side_files"] = side;
      out["not_carried"] = dir->left_out;
    }
    PrintJson(out);
    return Status::OK();
  }
  if (stats.recovered) {
    std::printf("published version %llu to %s as a recovered version: the full weights as an anchor, no delta "
                "(the previous version could not be rebuilt)",
                static_cast<unsigned long long>(stats.version), store->Describe().c_str());
  } else {
    std::printf("published version %llu to %s%s: %.3f%% changed", static_cast<unsigned long long>(stats.version),
                store->Describe().c_str(),
                parted ? (" in " + std::to_string(parts.parts) + " parts (one per weight file)").c_str() : "",
                stats.total_elements ? 100.0 * *stats.changed_elements / stats.total_elements : 0.0);
  }
  if (stats.wrote_delta) std::printf(", delta %s", HumanBytes(static_cast<double>(stats.delta_bytes)).c_str());
  if (stats.cumulative_bytes) {
    std::printf(", cumulative delta %s", HumanBytes(static_cast<double>(stats.cumulative_bytes)).c_str());
  }
  if (stats.wrote_anchor) std::printf(", anchor %s", HumanBytes(static_cast<double>(stats.anchor_bytes)).c_str());
  std::printf(", state hash %s\n", stats.state_hash.Hex().c_str());
  if (folder) {
    std::string carried, left;
    for (const SideFile& f : dir->side_files) carried += (carried.empty() ? "" : ", ") + f.name;
    for (const std::string& n : dir->left_out) left += (left.empty() ? "" : ", ") + n;
    std::printf("%zu weight file(s); side files: %s%s%s\n", dir->shards.size(), carried.empty() ? "none" : carried.c_str(),
                left.empty() ? "" : "; not carried: ", left.c_str());
  }
  return Status::OK();
}

Result<uint64_t> ParseByteSize(const std::string& text, const std::string& flag) {
  size_t i = 0;
  uint64_t n = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    if (n > (UINT64_MAX - 9) / 10) return Status::InvalidArgument(flag + " " + text + " is too large");
    n = n * 10 + static_cast<uint64_t>(text[i++] - '0');
  }
  std::string unit;
  for (char c : text.substr(i)) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"", 1}, {"b", 1}, {"kb", 1000}, {"mb", 1000'000}, {"gb", 1000'000'000}, {"tb", 1000'000'000'000},
      {"kib", uint64_t{1} << 10}, {"mib", uint64_t{1} << 20}, {"gib", uint64_t{1} << 30}, {"tib", uint64_t{1} << 40}};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name && i > 0) {
      if (n == 0) return Status::InvalidArgument(flag + " must be positive, got " + text);
      if (n > UINT64_MAX / scale) return Status::InvalidArgument(flag + " " + text + " is too large");
      return n * scale;
    }
  }
  return Status::InvalidArgument(flag + " takes a size such as 5GB, 500MB, 2GiB or a byte count, got \"" + text + "\"");
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
  HfWriteOptions folder;
  if (!args.max_shard_size.empty()) {
    DS_ASSIGN_OR_RETURN(folder.max_shard_bytes, ParseByteSize(args.max_shard_size, "--max-shard-size"));
  }
  folder.replace = args.force;
  DS_RETURN_IF_ERROR(args.hf_dir.empty() ? CheckOutsideBucket(store.get(), args.out_path, "-o")
                                         : CheckOutsideBucket(store.get(), args.hf_dir, "--hf-dir"));
  if (!args.hf_dir.empty()) DS_RETURN_IF_ERROR(CheckHfFolderTarget(args.hf_dir, args.force));
  // What an earlier pull to the same path left when it was SIGKILLed mid-write.
  RemoveDeadWritersTemporaries(args.hf_dir.empty() ? args.out_path : args.hf_dir);
  Result<UpdateStats> updated = replica->Update(args.version);
  EraseProgressLine();
  DS_ASSIGN_OR_RETURN(UpdateStats stats, std::move(updated));
  if (args.hf_dir.empty()) {
    DS_RETURN_IF_ERROR(WriteStateFile(args.out_path, replica->state(), replica->version()));
  } else {
    DS_RETURN_IF_ERROR(WriteReplicaFolder(*store, *replica, args.hf_dir, folder));
  }
  const std::string& out = args.hf_dir.empty() ? args.out_path : args.hf_dir;
  if (args.quiet) return Status::OK();
  // Damaged or missing objects the replica routed around: the bucket needs a look.
  nlohmann::ordered_json bad = nlohmann::ordered_json::array();
  for (const BadObject& b : replica->bad_objects()) {
    bad.push_back({{"key", b.key}, {"version", b.version}, {"reason", b.reason}});
    if (!args.json) {
      std::fprintf(stderr, "warning: routed around %s (version %llu): %s\n", b.key.c_str(),
                   static_cast<unsigned long long>(b.version), b.reason.c_str());
    }
  }
  if (args.json) {
    PrintJson({{"version", replica->version()},
               {"bucket", store->Describe()},
               {"output", out},
               {"hf_dir", !args.hf_dir.empty()},
               {"anchors_applied", stats.anchors_applied},
               {"deltas_applied", stats.deltas_applied},
               {"bytes_downloaded", stats.bytes_downloaded},
               {"download_ms", stats.download_ms},
               {"apply_ms", stats.apply_ms},
               {"compact_applies", stats.compact_applies},
               {"held_applies", stats.held_applies},
               {"stale_applies", stats.stale_applies},
               {"state_hash", replica->state_hash().Hex()},
               {"bad_objects", std::move(bad)}});
    return Status::OK();
  }
  std::printf("pulled version %llu from %s into %s: %llu anchor(s) + %llu delta(s), %s downloaded, state hash %s\n",
              static_cast<unsigned long long>(replica->version()), store->Describe().c_str(), out.c_str(),
              static_cast<unsigned long long>(stats.anchors_applied),
              static_cast<unsigned long long>(stats.deltas_applied),
              HumanBytes(static_cast<double>(stats.bytes_downloaded)).c_str(), replica->state_hash().Hex().c_str());
  return Status::OK();
}

Status RunGc(const GcArgs& args) {
  DS_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(args.bucket, /*create=*/false));
  const bool text = !args.json && !args.quiet;
  nlohmann::ordered_json out = {{"bucket", store->Describe()}, {"dry_run", args.dry_run}, {"pruned", nullptr},
                                {"aborted_uploads", nullptr}, {"temporaries", nullptr}};
  if (args.keep_anchors) {
    DS_ASSIGN_OR_RETURN(PruneStats pruned,
                        PruneVersions(*store, *args.keep_anchors, args.dry_run,
                                      args.anchor_check_size ? AnchorCheck::kSize : AnchorCheck::kFull));
    out["pruned"] = {{"removed_versions", pruned.removed_versions},
                     {"objects_deleted", pruned.objects_deleted},
                     {"bytes_deleted", pruned.bytes_deleted},
                     {"kept_versions", pruned.kept_versions},
                     {"kept_anchors", pruned.kept_anchors},
                     {"anchor_checked", pruned.anchor_checked == 0 ? nlohmann::ordered_json(nullptr)
                                                                   : nlohmann::ordered_json(pruned.anchor_checked)},
                     {"anchor_check", args.anchor_check_size ? "size" : "full"},
                     {"anchor_bytes_read", pruned.anchor_bytes_read},
                     {"routes_checked", pruned.routes_checked},
                     {"check_objects", pruned.check_objects},
                     {"check_bytes_read", pruned.check_bytes_read}};
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
      if (pruned.anchor_checked != 0) {
        const std::string how = args.anchor_check_size
                                    ? "its objects and sizes only (--anchor-check size)"
                                    : "read and hashed, " + HumanBytes(static_cast<double>(pruned.anchor_bytes_read));
        std::printf("%s: checked the oldest kept anchor (version %llu) first: %s\n", store->Describe().c_str(),
                    static_cast<unsigned long long>(pruned.anchor_checked), how.c_str());
      }
      if (pruned.routes_checked.size() > 1) {
        // Kept versions that a removed version's delta leads into (retention.h).
        std::string routes;
        for (uint64_t v : pruned.routes_checked) {
          if (v != pruned.anchor_checked) routes += (routes.empty() ? "" : ", ") + std::to_string(v);
        }
        std::printf("%s: and the routes to version(s) %s, which deltas from removed versions lead into: %llu "
                    "object(s) in all, %s read\n",
                    store->Describe().c_str(), routes.c_str(), static_cast<unsigned long long>(pruned.check_objects),
                    HumanBytes(static_cast<double>(pruned.check_bytes_read)).c_str());
      }
    }
  }
  auto* s3 = dynamic_cast<S3Store*>(store.get());
  if (auto* local = dynamic_cast<LocalStore*>(store.get())) {
    auto older_than = std::chrono::seconds(static_cast<int64_t>(args.temp_older_than_h * 3600));
    DS_ASSIGN_OR_RETURN(LocalStore::TempCleanup temps, local->RemoveStaleTemporaries(older_than, args.dry_run));
    out["temporaries"] = {{"removed_files", temps.removed_files},
                          {"removed_bytes", temps.removed_bytes},
                          {"kept_files", temps.kept_files}};
    if (text) {
      std::printf("%s: %s %llu stale temporary file(s) (%s) older than %g h; kept %llu (younger, or written by a "
                  "running process)\n",
                  store->Describe().c_str(), args.dry_run ? "would remove" : "removed",
                  static_cast<unsigned long long>(temps.removed_files),
                  HumanBytes(static_cast<double>(temps.removed_bytes)).c_str(), args.temp_older_than_h,
                  static_cast<unsigned long long>(temps.kept_files));
    }
  } else if (s3 != nullptr && !args.dry_run) {
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
  std::unique_ptr<Replica> replica = Replica::Create(store, ReplicaWithThreads(args.threads));
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
          {"compact_applies", stats->compact_applies},
          {"held_applies", stats->held_applies},
          {"stale_applies", stats->stale_applies},
          {"state_hash", replica->state_hash().Hex()},
          {"full_hash", full.Hex()}});
  }
  return Status::OK();
}

}  // namespace deltasync::cli
