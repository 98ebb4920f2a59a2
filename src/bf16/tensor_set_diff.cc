// DescribeTensorSetDiff: the message for a checkpoint whose tensor names are
// not the base's, e.g. the 'module.' prefix a DDP/FSDP wrapper adds.
#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "deltasync/changes.h"

namespace deltasync {
namespace {

// The prefix p with long == p + short for every pair of the two sorted,
// equally long lists (matched through the set `longs`), or nullopt.
std::optional<std::string> CommonPrefix(const std::vector<std::string>& shorts, const std::set<std::string>& longs) {
  if (shorts.empty() || shorts.size() != longs.size()) return std::nullopt;
  const std::string& first = shorts.front();
  for (const std::string& candidate : longs) {
    if (candidate.size() <= first.size() || !candidate.ends_with(first)) continue;
    std::string prefix = candidate.substr(0, candidate.size() - first.size());
    bool all = std::all_of(shorts.begin(), shorts.end(),
                           [&](const std::string& s) { return longs.count(prefix + s) == 1; });
    if (all) return prefix;
  }
  return std::nullopt;
}

std::string Count(size_t n, const char* what) {
  return std::to_string(n) + (n == 1 ? " tensor " : " tensors ") + what;
}

}  // namespace

std::string DescribeTensorSetDiff(std::span<const std::string> base, std::span<const std::string> current) {
  const std::set<std::string> base_set(base.begin(), base.end());
  const std::set<std::string> current_set(current.begin(), current.end());
  std::vector<std::string> missing, added;
  std::set_difference(base_set.begin(), base_set.end(), current_set.begin(), current_set.end(),
                      std::back_inserter(missing));
  std::set_difference(current_set.begin(), current_set.end(), base_set.begin(), base_set.end(),
                      std::back_inserter(added));
  if (missing.empty() && added.empty()) return "";
  const std::string missing_text =
      missing.size() == base_set.size() && missing.size() > 1 ? "all " + Count(missing.size(), "missing")
                                                              : Count(missing.size(), "missing");
  std::optional<std::string> prefix = CommonPrefix(missing, {added.begin(), added.end()});
  if (!prefix) prefix = CommonPrefix(added, {missing.begin(), missing.end()});
  if (prefix) {
    return missing_text + ", " + std::to_string(added.size()) + " new; they differ by the prefix '" + *prefix + "'";
  }
  std::string out;
  if (!missing.empty()) out = missing_text + " (first: '" + missing.front() + "')";
  if (!added.empty()) {
    out += out.empty() ? std::to_string(added.size()) + (added.size() == 1 ? " new tensor" : " new tensors")
                       : ", " + std::to_string(added.size()) + " new";
    out += " (first: '" + added.front() + "')";
  }
  return out;
}

}  // namespace deltasync
