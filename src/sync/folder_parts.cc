// PublishFolderParts (folder_parts.h): a model folder, one part per weight file.
#include "deltasync/folder_parts.h"

#include <algorithm>
#include <map>
#include <thread>

#include "common/clock.h"
#include "common/thread_start.h"
#include "deltasync/part_publisher.h"
#include "sync/bucket_settings.h"
#include "sync/part_settings.h"

namespace deltasync {

Result<FolderLayout> MakeFolderLayout(const HfFolder& folder, const PublisherOptions& options) {
  // Tensors ascending by name; ReadHfFolder put each name in one file only.
  std::map<std::string, std::pair<size_t, const TensorView*>> by_name;  // name -> (file, view)
  for (size_t f = 0; f < folder.shards.size(); ++f) {
    for (const TensorView& t : folder.shards[f].tensors()) by_name.emplace(t.name, std::make_pair(f, &t));
  }
  FolderLayout out;
  std::vector<std::vector<Block>> per_file(folder.shards.size());
  uint32_t index = 0;
  for (const auto& [name, where] : by_name) {
    const TensorView& t = *where.second;
    out.layout.tensors.push_back({name, PublishedDType(name, t.dtype, options), t.shape});
    if (t.num_elements() > 0) {
      per_file[where.first].push_back(Block{index, std::vector<uint64_t>(t.shape.size(), 0), t.shape});
    }
    ++index;
  }
  for (size_t f = 0; f < per_file.size(); ++f) {
    if (per_file[f].empty()) continue;
    out.layout.parts.push_back(std::move(per_file[f]));
    out.part_files.push_back(f);
  }
  DS_RETURN_IF_ERROR(out.layout.Validate().WithContext(folder.dir));
  return out;
}

Result<FolderPartsStats> PublishFolderParts(std::shared_ptr<Store> store, uint64_t version, const HfFolder& folder,
                                            PublisherOptions options) {
  DS_ASSIGN_OR_RETURN(FolderLayout fl, MakeFolderLayout(folder, options));
  const size_t n = fl.layout.parts.size();
  if (n < 2) {
    return Status::FailedPrecondition(folder.dir + " has " + std::to_string(n) +
                                      " weight file(s) holding weights; one part per file needs two or more "
                                      "(a single file publishes as one unparted version: leave out --parts)");
  }
  DS_ASSIGN_OR_RETURN(std::unique_ptr<PartCommitter> committer, PartCommitter::Open(store, fl.layout, options));
  DS_RETURN_IF_ERROR(CheckNextVersion(version, committer->latest_version(), options.allow_version_jump,
                                      store->Describe()));
  // What --change-settings changes (PartCommitter::Open checked the settings).
  const Manifest& manifest = committer->manifest();
  DS_ASSIGN_OR_RETURN(ResolvedSettings resolved, ResolveSettings(options, manifest.versions.empty() ? nullptr : &manifest,
                                                                 store->Describe()));
  DS_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<PartPublisher>> pubs,
                      PartPublisher::OpenAll(store, fl.layout, options));
  if (pubs.front()->latest_version() != committer->latest_version()) {
    return Status::Conflict("the newest version of " + store->Describe() +
                            " changed while opening it (another publisher?); publish again");
  }

  // Each part's blocks: the whole tensors of its file that hold elements.
  Stopwatch encode_clock;
  std::vector<Result<PartReceipt>> receipts(n, Status::Internal("part not run"));
  {
    std::vector<std::thread> workers;
    workers.reserve(n);
    for (size_t p = 0; p < n; ++p) {
      auto part = [&, p] {
        std::vector<TensorView> blocks;
        for (const TensorView& t : folder.shards[fl.part_files[p]].tensors()) {
          if (t.num_elements() > 0) blocks.push_back(t);
        }
        receipts[p] = pubs[p]->Publish(version, blocks);
      };
      // A part whose thread the system refuses runs here (thread_start.h).
      if (!TryStartThread(workers, part)) part();
    }
    for (std::thread& w : workers) w.join();
  }
  const double encode_ms = encode_clock.ElapsedMs();
  std::vector<PartReceipt> ok;
  Status failed = Status::OK();
  for (size_t p = 0; p < n; ++p) {
    if (receipts[p].ok()) {
      ok.push_back(std::move(*receipts[p]));
    } else if (failed.ok()) {
      failed = receipts[p].status().WithContext("part " + std::to_string(p) + " (" +
                                                folder.shards[fl.part_files[p]].label() + ")");
    }
  }
  // The weights read must be one checkpoint: a save into the folder while
  // the parts read it would commit a mix of two.
  if (failed.ok()) {
    failed = CheckHfFolderUnchanged(folder).WithContext("version " + std::to_string(version) + " not committed to " + store->Describe());
  }
  Result<PublishStats> committed = failed.ok()
                                       ? committer->Commit(version, ok, std::span<const SideFile>(folder.side_files))
                                       : Result<PublishStats>(failed);
  for (std::unique_ptr<PartPublisher>& pub : pubs) pub->Finish(committed.ok(), committer->manifest_token());
  DS_ASSIGN_OR_RETURN(PublishStats stats, std::move(committed));
  stats.detect_encode_ms = encode_ms;
  return FolderPartsStats{stats, static_cast<uint32_t>(n), std::move(resolved.changed)};
}

}  // namespace deltasync
