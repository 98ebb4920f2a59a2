// Settings and version rules shared by PartPublisher and PartCommitter
// (internal to src/sync/).
#pragma once

#include <string>

#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/status.h"

namespace deltasync {

// The bucket's settings for parted publishing: ResolveSettings, then refuses
// what parts do not support (kFailedPrecondition naming the setting).
Result<BucketSettings> PartedSettings(const PublisherOptions& options, const Manifest* manifest,
                                      const std::string& bucket);

// Whether `version` gets an anchor after `latest` (0: none) and the last
// anchor: the first version, or one reaching or crossing a multiple of N.
inline bool AnchorDue(const BucketSettings& s, uint64_t version, uint64_t latest, uint64_t last_anchor) {
  return latest == 0 || version / s.anchor_interval > last_anchor / s.anchor_interval;
}

// Publisher::Publish's rules for a new version after `latest`.
Status CheckNextVersion(uint64_t version, uint64_t latest, bool allow_jump, const std::string& bucket);

}  // namespace deltasync
