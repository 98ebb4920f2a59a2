// Decoders of the small fields in an S3 server's answers (internal): the
// Content-Length and Content-Range headers, ETags, and the timestamps of
// upload listings. The server is not trusted to be well-formed: each decoder
// takes only the exact form S3 writes and gives nullopt for anything else,
// so a malformed answer is refused, never read as a different number.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace deltasync::s3 {

// Content-Length: decimal digits only ("12"); nullopt for "", "-1", "1x",
// " 1", or a value beyond 2^64-1.
std::optional<uint64_t> ParseContentLength(std::string_view value);

// Content-Range of a 206 answer: "bytes FIRST-LAST/TOTAL", decimal digits,
// FIRST <= LAST < TOTAL. Of a 416 answer: "bytes */TOTAL" (first = last = 0).
struct ContentRange {
  uint64_t first = 0, last = 0, total = 0;
};
std::optional<ContentRange> ParseContentRange(std::string_view value);
std::optional<uint64_t> ParseUnsatisfiedRange(std::string_view value);
// The header value of ParseContentRange's form, for tests and the fuzz target.
std::string FormatContentRange(const ContentRange& range);

// An ETag without its surrounding double quotes (as it is when unquoted).
std::string_view UnquotedETag(std::string_view etag);

// Seconds since the epoch for "YYYY-MM-DDTHH:MM:SS[.fff]Z" (ListMultipartUploads'
// Initiated, always UTC); nullopt for any other form or an impossible date or
// time ("2024-13-01T...", "2024-02-30T..."), which would otherwise be read as
// another, possibly far older, time.
std::optional<int64_t> ParseIsoTime(std::string_view text);

}  // namespace deltasync::s3
