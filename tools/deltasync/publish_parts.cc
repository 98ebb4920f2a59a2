// publish --parts per-file (publish_parts.h).
#include "publish_parts.h"

#include <string>

#include "deltasync/manifest.h"
#include "deltasync/patch.h"

namespace deltasync::cli {

Status CheckPerFileParts(const PublishArgs& args, Store& store) {
  const std::string flag = "--parts per-file";
  // What the flags ask for first: they win over the bucket's settings.
  if (args.encoding && *args.encoding != "compact") {
    return Status::FailedPrecondition(flag + " needs --encoding compact, not --encoding " + *args.encoding +
                                      " (parts are compact only; TRL encodings stay single-part): leave out one "
                                      "of them");
  }
  if (args.cumulative_interval.value_or(0) > 0) {
    return Status::FailedPrecondition(flag + " cannot be combined with --cumulative-every " +
                                      std::to_string(*args.cumulative_interval) +
                                      " (parted publishing keeps no anchor state): leave out one of them");
  }
  if (args.anchor_max_fraction.value_or(0) > 0) {
    return Status::FailedPrecondition(flag + " cannot be combined with --anchor-max-fraction (adaptive anchors; "
                                      "parted publishing keeps no anchor state and uses --anchor-interval): leave "
                                      "out one of them");
  }
  Result<Manifest> manifest = FetchManifest(store);
  if (!manifest.ok()) {
    return manifest.status().code() == ErrorCode::kNotFound ? Status::OK() : manifest.status();
  }
  if (!manifest->settings) return Status::OK();
  const BucketSettings& s = *manifest->settings;
  // A flag given with --change-settings replaces the stored setting (checked above).
  const std::string bucket = store.Describe();
  if (s.encoding != IndexEncoding::kCompact && !(args.encoding && args.change_settings)) {
    return Status::FailedPrecondition(flag + ": " + bucket + " is published as " +
                                      std::string(EncodingName(s.encoding)) +
                                      "; parts are compact only (TRL encodings stay single-part): leave out --parts");
  }
  if (s.cumulative_interval > 0 && !(args.cumulative_interval && args.change_settings)) {
    return Status::FailedPrecondition(flag + ": " + bucket + " writes cumulative deltas (every " +
                                      std::to_string(s.cumulative_interval) +
                                      " versions), which parted publishing does not support: leave out --parts, or "
                                      "pass --change-settings --cumulative-every 0");
  }
  if (s.anchor_max_fraction > 0 && !(args.anchor_max_fraction && args.change_settings)) {
    return Status::FailedPrecondition(flag + ": " + bucket +
                                      " uses adaptive anchors, which parted publishing does not support: leave "
                                      "out --parts, or pass --change-settings --anchor-max-fraction 0");
  }
  return Status::OK();
}

}  // namespace deltasync::cli
