// ResolveSettings (bucket_settings.h): options -> the bucket's settings.
#include "sync/bucket_settings.h"

#include <optional>
#include <sstream>

namespace deltasync {
namespace {

std::string Show(IndexEncoding e) { return std::string(EncodingName(e)); }
std::string Show(uint64_t v) { return std::to_string(v); }
std::string Show(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// What an older manifest (no "settings") says: its anchor_interval, and the
// encoding of its newest delta.
std::optional<IndexEncoding> NewestDeltaEncoding(const Manifest& m) {
  for (auto v = m.versions.rbegin(); v != m.versions.rend(); ++v) {
    if (const ObjectEntry* d = v->delta()) return d->encoding;
  }
  return std::nullopt;
}

class Resolver {
 public:
  Resolver(const PublisherOptions& options, const std::string& bucket) : options_(options), bucket_(bucket) {}

  // `name`: the setting's name (the Python keyword and the manifest's field);
  // `flag`: the CLI option that sets it.
  template <typename T>
  Status Resolve(const char* name, const char* flag, const std::optional<T>& given, const std::optional<T>& stored,
                 T fallback, T& out) {
    out = given.value_or(stored.value_or(fallback));
    if (!given || !stored || *given == *stored) return Status::OK();
    if (!options_.change_settings) {
      return Status::FailedPrecondition("bucket " + bucket_ + " uses " + name + " " + Show(*stored) + ", not " +
                                        Show(*given) + "; leave out " + flag + " (Python: " + name +
                                        "=) to keep it, or pass --change-settings (Python: change_settings=True) "
                                        "to change it");
    }
    changed_.push_back(std::string(name) + " " + Show(*stored) + " -> " + Show(*given));
    return Status::OK();
  }

  std::vector<std::string> changed() && { return std::move(changed_); }

 private:
  const PublisherOptions& options_;
  const std::string& bucket_;
  std::vector<std::string> changed_;
};

}  // namespace

Result<ResolvedSettings> ResolveSettings(const PublisherOptions& options, const Manifest* manifest,
                                         const std::string& bucket) {
  if (options.anchor_interval && *options.anchor_interval == 0) {
    return Status::InvalidArgument("anchor interval must be at least 1");
  }
  if (options.anchor_max_fraction && !(*options.anchor_max_fraction >= 0)) {
    return Status::InvalidArgument("anchor_max_fraction must be 0 (off) or positive");
  }
  // What the bucket stores; nothing for a new bucket.
  std::optional<IndexEncoding> encoding;
  std::optional<uint64_t> anchor_interval, cumulative_interval;
  std::optional<double> anchor_max_fraction;
  if (manifest != nullptr && manifest->settings) {
    encoding = manifest->settings->encoding;
    anchor_interval = manifest->settings->anchor_interval;
    cumulative_interval = manifest->settings->cumulative_interval;
    anchor_max_fraction = manifest->settings->anchor_max_fraction;
  } else if (manifest != nullptr) {
    anchor_interval = manifest->anchor_interval;
    encoding = NewestDeltaEncoding(*manifest);
  }
  const BucketSettings defaults;
  ResolvedSettings out;
  Resolver r(options, bucket);
  DS_RETURN_IF_ERROR(r.Resolve("encoding", "--encoding", options.encoding, encoding, defaults.encoding, out.settings.encoding));
  DS_RETURN_IF_ERROR(r.Resolve("anchor_interval", "--anchor-interval", options.anchor_interval, anchor_interval, defaults.anchor_interval,
                               out.settings.anchor_interval));
  DS_RETURN_IF_ERROR(r.Resolve("cumulative_interval", "--cumulative-every", options.cumulative_interval, cumulative_interval,
                               defaults.cumulative_interval, out.settings.cumulative_interval));
  DS_RETURN_IF_ERROR(r.Resolve("anchor_max_fraction", "--anchor-max-fraction", options.anchor_max_fraction, anchor_max_fraction,
                               defaults.anchor_max_fraction, out.settings.anchor_max_fraction));
  out.changed = std::move(r).changed();
  return out;
}

}  // namespace deltasync
