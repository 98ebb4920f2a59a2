#include "output.h"

#include <cstdio>
#include <filesystem>

#include "deltasync/hf_folder.h"
#include "deltasync/store.h"

namespace deltasync::cli {

Status WritePatchFile(const std::string& path, const EncodedPatch& patch) {
  std::filesystem::path p = std::filesystem::absolute(path);
  if (!p.has_filename()) return Status::InvalidArgument(path + ": not a file path");
  // A LocalStore rooted at the parent directory gives the atomic write.
  DS_ASSIGN_OR_RETURN(auto dir, LocalStore::Open(p.parent_path().string(), /*create=*/true));
  return dir->Put(p.filename().string(), patch.parts).WithContext("writing " + path);
}

Status WriteStateFile(const std::string& path, const WeightState& state, uint64_t version) {
  std::vector<TensorView> views = state.views();
  return WriteSafetensorsFile(path, CheckpointMetadata(version), views).WithContext("writing " + path);
}

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

}  // namespace deltasync::cli
