#include "server/listen_address.h"

#include <charconv>

namespace deltasync::server {

std::string ListenAddress::ToString() const { return WithPort(port); }

std::string ListenAddress::WithPort(int real_port) const {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(real_port);
}

Result<ListenAddress> ParseListenAddress(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("--listen '" + text + "': " + why +
                                   " (expected HOST:PORT or PORT, e.g. 127.0.0.1:8470 or 8470)");
  };
  size_t colon = text.rfind(':');
  ListenAddress a;
  if (colon == std::string::npos) {
    // A bare port means loopback, the default host: "--listen 8471".
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), a.port);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() || a.port < 0 || a.port > 65535) {
      return bad("no port");
    }
    a.host = "127.0.0.1";
    return a;
  }
  a.host = text.substr(0, colon);
  if (a.host.size() >= 2 && a.host.front() == '[' && a.host.back() == ']') {
    a.host = a.host.substr(1, a.host.size() - 2);
  } else if (a.host.find(':') != std::string::npos) {
    return bad("put an IPv6 address in brackets");
  }
  if (a.host.empty()) return bad("no host");
  std::string port = text.substr(colon + 1);
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), a.port);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || a.port < 0 || a.port > 65535) {
    return bad("the port must be a number from 0 to 65535");
  }
  return a;
}

}  // namespace deltasync::server
