// Bearer-token checks for mutating routes.
#pragma once

#include <string_view>

namespace deltasync::server {

// True when `header` (the Authorization header's value) is "Bearer <token>"
// with exactly `token`. The comparison's time does not depend on where the
// bytes differ, so the token cannot be guessed byte by byte from timings.
bool BearerMatches(std::string_view header, std::string_view token);

// A token is usable in a header: 1-4096 printable ASCII characters, no spaces.
bool IsValidToken(std::string_view token);

}  // namespace deltasync::server
