#include "cli_args.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace deltasync::cli {
namespace {

std::string NumberText(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

CLI::Validator WholeNumber(uint64_t min, uint64_t max) {
  std::string range = max == UINT64_MAX ? ">= " + std::to_string(min)
                                        : "from " + std::to_string(min) + " to " + std::to_string(max);
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        bool digits =
            !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
        if (!digits) return "must be a whole number " + range + ", not '" + text + "'";
        errno = 0;
        unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
        if (errno == ERANGE || v < min || v > max) return "must be " + range + ", not " + text;
        return "";
      },
      range);
}

CLI::Validator Number(double min, bool exclusive) {
  std::string range = (exclusive ? "> " : ">= ") + NumberText(min);
  return CLI::Validator(
      [min, exclusive, range](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || errno == ERANGE || !std::isfinite(v)) {
          return "must be a number " + range + ", not '" + text + "'";
        }
        if (exclusive ? !(v > min) : !(v >= min)) return "must be " + range + ", not " + text;
        return "";
      },
      range);
}

CLI::Validator OneOf(std::vector<std::string> choices) {
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i) {
    list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  }
  return CLI::Validator(
      [choices, list](std::string& text) -> std::string {
        if (std::find(choices.begin(), choices.end(), text) != choices.end()) return "";
        std::string hint = ClosestMatch(text, choices);
        return "must be " + list + ", not '" + text + "'" + (hint.empty() ? "" : " (did you mean '" + hint + "'?)");
      },
      list);
}

std::string ClosestMatch(const std::string& typed, const std::vector<std::string>& candidates) {
  // Optimal string alignment distance: insert, delete, substitute, swap.
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      for (size_t j = 1; j <= b.size(); ++j) {
        size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
      }
    }
    return d[a.size()][b.size()];
  };
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const std::string& c : candidates) {
    size_t dist = distance(typed, c);
    if (dist < best_distance) {
      best = c;
      best_distance = dist;
    }
  }
  // Up to a third of the word wrong (at least one edit): "pubish", "pul".
  size_t allowed = std::max<size_t>(1, std::max(typed.size(), best.size()) / 3);
  return best_distance <= allowed ? best : "";
}

std::string HelpFormatter::make_option_opts(const CLI::Option* opt) const {
  std::string out;
  if (opt->get_type_size() != 0) {
    if (!opt->get_type_name().empty()) out += " " + opt->get_type_name();
    const std::string& def = opt->get_default_str();
    if (!opt->get_required() && !def.empty() && def != "[]") out += " (default: " + def + ")";
    if (opt->get_expected_max() == CLI::detail::expected_max_vector_size) out += " ...";
    if (opt->get_required()) out += " REQUIRED";
  }
  if (!opt->get_needs().empty()) {
    out += " (needs";
    for (const CLI::Option* other : opt->get_needs()) out += " " + other->get_name();
    out += ")";
  }
  // CLI11 starts the description on the same line when "  " + name + opts
  // is narrower than the column, so a signature one short of it would be
  // followed by a single space: pad it over the column, onto its own line.
  if (2 + make_option_name(opt, opt->get_positional()).size() + out.size() + 1 == get_column_width()) out += " ";
  return out;
}

std::string HelpFormatter::make_usage(const CLI::App* app, std::string) const {
  // CLI11 passes argv[0] and the parents' names; users type "deltasync CMD".
  std::string full = app->get_parent() == nullptr ? "deltasync" : "deltasync " + app->get_name();
  return CLI::Formatter::make_usage(app, full);
}

std::string UsageMessage(const CLI::ParseError& e) {
  std::string what = e.what();
  if (dynamic_cast<const CLI::ValidationError*>(&e) != nullptr) {
    // "--version: must be ..." -> "--version must be ...".
    size_t colon = what.find(": must be ");
    if (colon != std::string::npos) what.erase(colon, 1);
  }
  return what;
}

}  // namespace deltasync::cli
