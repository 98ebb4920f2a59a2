// verify: download and check a bucket's objects and replay them against the
// manifest's state hashes, writing nothing (include/deltasync/verify.h).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "deltasync/store.h"
#include "deltasync/verify.h"
#include "output.h"

namespace deltasync::cli {
namespace {

// "1-4, 6, 8-9"; "none" when empty. `versions` ascending.
std::string Ranges(const std::vector<uint64_t>& versions) {
  std::string out;
  for (size_t i = 0; i < versions.size();) {
    size_t j = i;
    while (j + 1 < versions.size() && versions[j + 1] == versions[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += std::to_string(versions[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(versions[j]);
    }
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

nlohmann::ordered_json ProblemsJson(const std::vector<ObjectProblem>& problems) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const ObjectProblem& p : problems) {
    out.push_back({{"version", p.version}, {"key", p.key}, {"error", ErrorCodeName(p.code)}, {"reason", p.reason}});
  }
  return out;
}

void PrintReport(const VerifyReport& r, bool all) {
  std::printf("%s: checked %llu object(s) (%s downloaded) for %s\n", r.bucket.c_str(),
              static_cast<unsigned long long>(r.objects_checked),
              HumanBytes(static_cast<double>(r.bytes_downloaded)).c_str(),
              all ? "every version" : ("version " + std::to_string(r.targets.front())).c_str());
  std::printf("verified versions: %s\n", Ranges(r.verified).c_str());
  for (const ObjectProblem& p : r.bad_objects) {
    std::printf("bad object: %s (version %llu): %s\n", p.key.c_str(), static_cast<unsigned long long>(p.version),
                p.reason.c_str());
  }
  for (const ObjectProblem& p : r.unchecked) {
    std::printf("not replayed: %s (version %llu): %s\n", p.key.c_str(), static_cast<unsigned long long>(p.version),
                p.reason.c_str());
  }
  if (!r.unreachable.empty()) std::printf("unreachable versions: %s\n", Ranges(r.unreachable).c_str());
  if (!r.recovered.empty()) {
    std::printf("recovered versions: %s (anchor only, published when the version before could not be rebuilt)\n",
                Ranges(r.recovered).c_str());
  }
  if (r.ok()) std::printf("ok\n");
}

}  // namespace

Status RunVerify(const VerifyArgs& args) {
  DS_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(args.bucket, /*create=*/false));
  VerifyOptions options;
  options.version = args.version;
  options.all = args.all;
  options.threads = args.threads;
  DS_ASSIGN_OR_RETURN(VerifyReport report, VerifyBucket(*store, options));
  if (args.json) {
    nlohmann::ordered_json out = {{"bucket", report.bucket},
                                  {"ok", report.ok()},
                                  {"all", args.all},
                                  {"targets", report.targets},
                                  {"verified", report.verified},
                                  {"unreachable", report.unreachable},
                                  {"bad_objects", ProblemsJson(report.bad_objects)},
                                  {"unchecked", ProblemsJson(report.unchecked)},
                                  {"recovered", report.recovered},
                                  {"objects_checked", report.objects_checked},
                                  {"bytes_downloaded", report.bytes_downloaded}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    PrintReport(report, args.all);
  }
  if (report.ok()) return Status::OK();
  std::string what = std::to_string(report.bad_objects.size()) + " bad object(s)";
  if (!report.unreachable.empty()) what += ", unreachable version(s) " + Ranges(report.unreachable);
  if (!report.bad_objects.empty()) {
    what += "; first: " + report.bad_objects.front().key + " (version " +
            std::to_string(report.bad_objects.front().version) + "): " + report.bad_objects.front().reason;
  }
  return Status::Integrity(report.bucket + " failed verification: " + what);
}

}  // namespace deltasync::cli
