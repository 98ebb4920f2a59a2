// --listen HOST:PORT.
#pragma once

#include <string>

#include "deltasync/status.h"

namespace deltasync::server {

struct ListenAddress {
  std::string host;  // without brackets: "127.0.0.1", "::1", "localhost"
  int port = 0;      // 0: any free port

  // "127.0.0.1:8470", "[::1]:8470".
  std::string ToString() const;
  std::string WithPort(int real_port) const;
};

// "HOST:PORT", "[IPV6]:PORT" or "PORT" (on 127.0.0.1), port 0-65535.
// kInvalidArgument otherwise.
Result<ListenAddress> ParseListenAddress(const std::string& text);

}  // namespace deltasync::server
