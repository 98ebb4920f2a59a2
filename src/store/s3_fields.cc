#include "store/s3_fields.h"

#include <ctime>

#include "common/decimal.h"

namespace deltasync::s3 {
namespace {

// A fixed-width run of `width` digits at text[at]; nullopt otherwise.
std::optional<int> Digits(std::string_view text, size_t at, size_t width) {
  if (at + width > text.size()) return std::nullopt;
  std::optional<uint64_t> v = ParseDecimal(text.substr(at, width));
  if (!v) return std::nullopt;
  return static_cast<int>(*v);
}

bool IsLeapYear(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

}  // namespace

std::optional<uint64_t> ParseContentLength(std::string_view value) { return ParseDecimal(value); }

std::optional<ContentRange> ParseContentRange(std::string_view value) {
  constexpr std::string_view kUnit = "bytes ";
  if (value.substr(0, kUnit.size()) != kUnit) return std::nullopt;
  value.remove_prefix(kUnit.size());
  const size_t dash = value.find('-'), slash = value.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || slash < dash) return std::nullopt;
  std::optional<uint64_t> first = ParseDecimal(value.substr(0, dash));
  std::optional<uint64_t> last = ParseDecimal(value.substr(dash + 1, slash - dash - 1));
  std::optional<uint64_t> total = ParseDecimal(value.substr(slash + 1));
  if (!first || !last || !total || *last < *first || *last >= *total) return std::nullopt;
  return ContentRange{*first, *last, *total};
}

std::optional<uint64_t> ParseUnsatisfiedRange(std::string_view value) {
  constexpr std::string_view kPrefix = "bytes */";
  if (value.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  return ParseDecimal(value.substr(kPrefix.size()));
}

std::string FormatContentRange(const ContentRange& range) {
  return "bytes " + std::to_string(range.first) + "-" + std::to_string(range.last) + "/" +
         std::to_string(range.total);
}

std::string_view UnquotedETag(std::string_view etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') return etag.substr(1, etag.size() - 2);
  return etag;
}

std::optional<int64_t> ParseIsoTime(std::string_view s) {
  // "2024-05-01T12:00:00" then ".fff" (any digits) and "Z", or "Z" at once.
  if (s.size() < 20 || s[4] != '-' || s[7] != '-' || s[10] != 'T' || s[13] != ':' || s[16] != ':') {
    return std::nullopt;
  }
  std::optional<int> y = Digits(s, 0, 4), mo = Digits(s, 5, 2), d = Digits(s, 8, 2);
  std::optional<int> h = Digits(s, 11, 2), mi = Digits(s, 14, 2), sec = Digits(s, 17, 2);
  if (!y || !mo || !d || !h || !mi || !sec) return std::nullopt;
  std::string_view rest = s.substr(19);
  if (rest.front() == '.') {
    size_t n = 1;
    while (n < rest.size() && rest[n] >= '0' && rest[n] <= '9') ++n;
    if (n == 1) return std::nullopt;
    rest.remove_prefix(n);
  }
  if (rest != "Z") return std::nullopt;
  static constexpr int kDays[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (*mo < 1 || *mo > 12 || *d < 1) return std::nullopt;
  if (*d > kDays[*mo - 1] + (*mo == 2 && IsLeapYear(*y) ? 1 : 0)) return std::nullopt;
  if (*h > 23 || *mi > 59 || *sec > 60) return std::nullopt;  // 60: a leap second
  std::tm tm{};
  tm.tm_year = *y - 1900;
  tm.tm_mon = *mo - 1;
  tm.tm_mday = *d;
  tm.tm_hour = *h;
  tm.tm_min = *mi;
  tm.tm_sec = *sec;
  return static_cast<int64_t>(timegm(&tm));
}

}  // namespace deltasync::s3
