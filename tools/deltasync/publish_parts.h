// `publish BUCKET DIR --parts per-file`: the checks in the user's words
// (flags as typed) before a model folder is published one part per weight
// file (deltasync/folder_parts.h).
#pragma once

#include "commands.h"
#include "deltasync/store.h"

namespace deltasync::cli {

// kFailedPrecondition naming the flag or the bucket's setting when `args`
// (with the bucket's stored settings, unless --change-settings replaces them)
// ask for what parted publishing does not support: an encoding other than
// compact, cumulative deltas, adaptive anchors.
Status CheckPerFileParts(const PublishArgs& args, Store& store);

}  // namespace deltasync::cli
