// Argument checking for the CLI parser, in the user's words: validators whose
// messages read "--version must be >= 1" (main.cc joins the flag and the
// text), and "did you mean" for a mistyped command.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace deltasync::cli {

// A whole number >= min (and <= max).
CLI::Validator WholeNumber(uint64_t min, uint64_t max = UINT64_MAX);
// A number >= min (or > min when exclusive); any decimal form strtod reads.
CLI::Validator Number(double min, bool exclusive = false);
// One of `choices`.
CLI::Validator OneOf(std::vector<std::string> choices);

// The entry of `candidates` closest to `typed` by edit distance (a swap of
// two neighbours counts as one edit), or "" when none is close enough to be
// a plausible typo.
std::string ClosestMatch(const std::string& typed, const std::vector<std::string>& candidates);

// Help text in our conventions: "deltasync publish" in the usage line, and
// "UINT:>= 1 (default: 10)" rather than CLI11's "UINT:>= 1=10"; no default
// shown for required options or empty values.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_opts(const CLI::Option* opt) const override;
  std::string make_usage(const CLI::App* app, std::string name) const override;
};

// A CLI11 error message as a user reads it: "--version: must be >= 1"
// becomes "--version must be >= 1".
std::string UsageMessage(const CLI::ParseError& e);

}  // namespace deltasync::cli
