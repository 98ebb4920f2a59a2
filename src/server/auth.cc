#include "server/auth.h"

#include <cstdint>

namespace deltasync::server {

bool BearerMatches(std::string_view header, std::string_view token) {
  constexpr std::string_view kScheme = "Bearer ";
  if (header.size() < kScheme.size() || header.substr(0, kScheme.size()) != kScheme) return false;
  std::string_view given = header.substr(kScheme.size());
  // Walk the expected token whatever was given: the time depends only on
  // the token's length, which is not secret enough to matter.
  uint8_t diff = given.size() == token.size() ? 0 : 1;
  for (size_t i = 0; i < token.size(); ++i) {
    uint8_t g = i < given.size() ? static_cast<uint8_t>(given[i]) : 0;
    diff |= static_cast<uint8_t>(g ^ static_cast<uint8_t>(token[i]));
  }
  // Stop the compiler from turning the loop into an early-exit compare.
  volatile uint8_t result = diff;
  return result == 0 && !token.empty();
}

bool IsValidToken(std::string_view token) {
  if (token.empty() || token.size() > 4096) return false;
  for (char c : token) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace deltasync::server
