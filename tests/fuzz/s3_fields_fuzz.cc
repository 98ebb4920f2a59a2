// Fuzz target for the small fields of an S3 server's answers
// (src/store/s3_fields.cc): Content-Length, Content-Range, ETag, the
// Initiated time of upload listings. Properties, per input:
//   1. arbitrary bytes never crash any decoder;
//   2. an accepted Content-Length / range total is the input's digits
//      exactly (to_string of the value, less leading zeros, is the input);
//   3. an accepted Content-Range has first <= last < total and formats back
//      to the input (less leading zeros);
//   4. an accepted time names a real instant: gmtime of the value gives back
//      the input's year, month, day, hour, minute (and second, but for a
//      leap second);
//   5. UnquotedETag drops exactly the one pair of quotes around a value.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "store/s3_fields.h"

namespace {

using namespace deltasync::s3;

using deltasync::fuzz::Check;

// Each run of digits without its leading zeros ("bytes 007-9/10" -> "bytes 7-9/10").
std::string Canonical(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool starts_digits = s[i] >= '0' && s[i] <= '9' && (i == 0 || s[i - 1] < '0' || s[i - 1] > '9');
    if (starts_digits) {
      while (i + 1 < s.size() && s[i] == '0' && s[i + 1] >= '0' && s[i + 1] <= '9') ++i;
    }
    out += s[i];
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);

  if (std::optional<uint64_t> n = ParseContentLength(in)) {
    Check(std::to_string(*n) == Canonical(in), "Content-Length is not the input's digits");
  }
  if (std::optional<ContentRange> r = ParseContentRange(in)) {
    Check(r->first <= r->last && r->last < r->total, "a Content-Range outside its total was accepted");
    Check(FormatContentRange(*r) == Canonical(in), "Content-Range does not format back to the input");
    Check(ParseContentRange(FormatContentRange(*r)).has_value(), "a formatted Content-Range is refused");
  }
  if (std::optional<uint64_t> t = ParseUnsatisfiedRange(in)) {
    Check("bytes */" + std::to_string(*t) == Canonical(in), "the unsatisfied range's total is not the input's");
  }

  std::string_view etag = UnquotedETag(in);
  if (in.size() >= 2 && in.front() == '"' && in.back() == '"') {
    Check(etag == in.substr(1, in.size() - 2), "UnquotedETag kept or dropped more than the quotes");
  } else {
    Check(etag == in, "UnquotedETag changed an unquoted value");
  }

  if (std::optional<int64_t> t = ParseIsoTime(in)) {
    std::time_t when = static_cast<std::time_t>(*t);
    std::tm tm{};
    Check(gmtime_r(&when, &tm) != nullptr, "an accepted time is out of range");
    char buf[64];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                  tm.tm_hour, tm.tm_min, tm.tm_sec);
    const std::string_view got(buf);
    if (in.substr(17, 2) == "60") {  // a leap second: the next minute's second 0
      Check(got.substr(17, 2) == "00", "a leap second was misread");
    } else {
      Check(got == in.substr(0, 19), "an accepted time is not the instant the input names");
    }
  }
  return 0;
}
