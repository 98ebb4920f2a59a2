// Resolving a Publisher's settings (encoding, anchor cadence, cumulative
// deltas, adaptive anchors) against the ones a bucket already stores
// (internal to src/sync).
#pragma once

#include <string>
#include <vector>

#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/status.h"

namespace deltasync {

struct ResolvedSettings {
  BucketSettings settings;
  std::vector<std::string> changed;  // "encoding compact -> gap_delta", with change_settings
};

// `manifest`: the bucket's, nullptr for a new bucket. Each setting is the
// option when given, else the stored one, else the default. A given option
// that differs from a stored one is kFailedPrecondition naming `bucket`,
// unless options.change_settings. A manifest from before "settings" existed
// stores only anchor_interval; its encoding is taken from its newest delta.
// kInvalidArgument for an anchor_interval of 0 or a negative/NaN fraction.
Result<ResolvedSettings> ResolveSettings(const PublisherOptions& options, const Manifest* manifest,
                                         const std::string& bucket);

}  // namespace deltasync
