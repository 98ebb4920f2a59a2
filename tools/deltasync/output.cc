#include "output.h"

#include <cstdio>
#include <filesystem>

#include "children.h"
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

Status CheckOutputIsNotInput(const std::string& out_path,
                             const std::vector<std::pair<std::string, std::string>>& inputs) {
  for (const auto& [what, path] : inputs) {
    std::error_code ec;
    if (std::filesystem::equivalent(out_path, path, ec) && !ec) {
      return Status::InvalidArgument("-o " + out_path + " is " + what + " (" + path +
                                     "): writing it would replace that input; choose another output path");
    }
  }
  return Status::OK();
}

namespace {
bool StderrIsTerminal() {
  static const bool tty = ::isatty(STDERR_FILENO) == 1;
  return tty;
}
}  // namespace

void DrawProgressLine(const std::string& text) {
  if (!StderrIsTerminal()) return;
  std::fprintf(stderr, "\r\033[K  %s", text.c_str());
  std::fflush(stderr);
  SetProgressLineLive(true);  // an interrupted demo ends the line first
}

void EraseProgressLine() {
  if (!StderrIsTerminal()) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  SetProgressLineLive(false);
}

std::string TransferText(const std::string& what, uint64_t done, uint64_t total, double elapsed_s) {
  std::string text = what + ": " + HumanBytes(static_cast<double>(done)) + " of " +
                     HumanBytes(static_cast<double>(total));
  if (elapsed_s > 0.05 && done > 0) text += ", " + HumanBytes(static_cast<double>(done) / elapsed_s) + "/s";
  return text;
}

void PrintJson(const nlohmann::ordered_json& value) {
  std::printf("%s\n", value.dump().c_str());
  std::fflush(stdout);
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
