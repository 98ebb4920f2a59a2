// Strict decimal integers (internal): digits only, as Python's str(int) and
// HTTP's Content-Length write them. No sign, space, '+' or trailing text;
// nullopt on overflow. (strtoull would read "-1" as 2^64-1 and "abc" as 0.)
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

namespace deltasync {

inline std::optional<uint64_t> ParseDecimal(std::string_view text) {
  if (text.empty() || !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace deltasync
