#include "demo_bucket.h"

#include <algorithm>
#include <string>
#include <vector>

#include "deltasync/manifest.h"

namespace deltasync::cli {

bool IsDeltasyncObjectKey(std::string_view key) {
  if (key == kManifestKey) return true;
  constexpr std::string_view kFolders[] = {"anchors/", "deltas/", "ds/anchors/", "ds/deltas/", "ds/cumulative/"};
  constexpr std::string_view kStem = "step_", kSuffix = ".safetensors";
  for (std::string_view folder : kFolders) {
    if (key.substr(0, folder.size()) != folder) continue;
    std::string_view name = key.substr(folder.size());
    return name.find('/') == std::string_view::npos && name.size() > kStem.size() + kSuffix.size() &&
           name.substr(0, kStem.size()) == kStem && name.substr(name.size() - kSuffix.size()) == kSuffix;
  }
  return false;
}

Status PrepareDemoBucket(Store& store, bool force) {
  DS_ASSIGN_OR_RETURN(std::vector<std::string> keys, store.List(""));
  const bool marked = std::find(keys.begin(), keys.end(), std::string(kDemoMarkerKey)) != keys.end();
  if (!keys.empty() && !marked && !force) {
    return Status::FailedPrecondition(
        store.Describe() + " is not empty and was not created by 'deltasync demo'; refusing to touch it. "
        "Choose another --bucket (or an empty one), or pass --force to delete deltasync's own objects in it "
        "(manifest.json, anchors/ deltas/ ds/ step_*.safetensors) and keep every other file");
  }
  // The manifest first: a reader never sees a manifest whose objects are gone.
  if (std::find(keys.begin(), keys.end(), std::string(kManifestKey)) != keys.end()) {
    DS_RETURN_IF_ERROR(store.Delete(kManifestKey));
  }
  for (const std::string& key : keys) {
    if (key != kManifestKey && IsDeltasyncObjectKey(key)) DS_RETURN_IF_ERROR(store.Delete(key));
  }
  if (marked) return Status::OK();
  const std::string marker =
      "{\"format\":\"deltasync-demo-bucket\",\"note\":\"written by 'deltasync demo'. A later demo run on this bucket "
      "deletes manifest.json and the step_*.safetensors objects under anchors/, deltas/ and ds/, and keeps every "
      "other file.\"}\n";
  return store.Put(kDemoMarkerKey, ByteSpan(reinterpret_cast<const uint8_t*>(marker.data()), marker.size()));
}

}  // namespace deltasync::cli
