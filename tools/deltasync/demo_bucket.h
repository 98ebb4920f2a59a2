// The demo's bucket. The demo writes a marker object first in every bucket it
// creates; a later run reuses a marked bucket and deletes only deltasync's own
// objects in it, never anything else (a user's NOTES.txt). A non-empty bucket
// without the marker (a real bucket, someone's directory) is refused unless
// --force. Works the same for a directory and an s3:// prefix (Store).
#pragma once

#include <string_view>

#include "deltasync/status.h"
#include "deltasync/store.h"

namespace deltasync::cli {

// The marker: a small JSON object saying who wrote the bucket.
inline constexpr std::string_view kDemoMarkerKey = "ds/demo-bucket.json";

// deltasync's own objects: manifest.json and the step objects the publisher
// writes (anchors/step_*.safetensors, deltas/step_*.safetensors and
// ds/{anchors,deltas,cumulative}/step_*.safetensors, directly in those folders).
bool IsDeltasyncObjectKey(std::string_view key);

// Readies `store` for a new demo run: an empty bucket gets the marker; a
// marked one (or any non-empty one with `force`) loses manifest.json first
// (so no reader sees a manifest whose objects are gone), then its other
// deltasync objects, and keeps everything else. Refuses a non-empty bucket
// without the marker when !force, with a message naming --force.
Status PrepareDemoBucket(Store& store, bool force);

}  // namespace deltasync::cli
