// Fuzz target for the S3 configuration decoders (src/store/s3_ini.cc,
// s3_config.cc): ~/.aws/credentials and ~/.aws/config (ParseIni), bucket
// URLs and endpoints. Properties, per input:
//   1. arbitrary bytes never crash ParseIni, ParseBucketUrl or ParseEndpoint;
//   2. an INI file that parses, written back out ("[section]", "key = value",
//      a value's further lines indented), parses to the same sections, keys
//      and values; every key is lower case and non-empty, every key and
//      value trimmed;
//   3. an accepted bucket URL written back ("s3://bucket/prefix") parses to
//      the same bucket and prefix, and the prefix is "" or ends in '/';
//   4. an accepted endpoint has a host and a port of 1-65535 (or none), and
//      scheme://host[:port] parses back to the same endpoint.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "store/s3_config.h"

namespace {

using namespace deltasync::s3;

using deltasync::fuzz::Check;

bool Trimmed(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  return s.empty() || (!space(s.front()) && !space(s.back()));
}

std::string WriteIni(const IniFile& file) {
  std::string out;
  for (const auto& [name, section] : file) {
    out += "[" + name + "]\n";
    for (const auto& [key, value] : section) {
      out += key + " = ";
      for (char c : value) out += c == '\n' ? std::string("\n  ") : std::string(1, c);
      out += "\n";
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);

  deltasync::Result<IniFile> ini = ParseIni(in, "fuzz");
  if (ini.ok()) {
    for (const auto& [name, section] : *ini) {
      Check(!name.empty() && Trimmed(name), "a section name is empty or untrimmed");
      for (const auto& [key, value] : section) {
        Check(!key.empty() && Trimmed(key) && Trimmed(value), "a key is empty, or a key or value untrimmed");
        for (char c : key) Check(c < 'A' || c > 'Z', "a key is not lower case");
      }
    }
    const std::string written = WriteIni(*ini);
    deltasync::Result<IniFile> again = ParseIni(written, "fuzz-written");
    Check(again.ok(), "a written INI file is refused");
    Check(*again == *ini, "a written INI file parses to other values");
  }

  deltasync::Result<BucketUrl> url = ParseBucketUrl(in);
  if (url.ok()) {
    Check(!url->bucket.empty() && (url->prefix.empty() || url->prefix.back() == '/'), "a malformed bucket URL");
    deltasync::Result<BucketUrl> again = ParseBucketUrl("s3://" + url->bucket + "/" + url->prefix);
    Check(again.ok() && again->bucket == url->bucket && again->prefix == url->prefix, "a bucket URL's round trip");
  }

  deltasync::Result<Endpoint> ep = ParseEndpoint(in);
  if (ep.ok()) {
    Check(!ep->host.empty() && (ep->scheme == "http" || ep->scheme == "https"), "an endpoint without host");
    if (!ep->port.empty()) {
      Check(ep->port.size() <= 5 && std::stoul(ep->port) >= 1 && std::stoul(ep->port) <= 65535,
            "an endpoint's port is not 1-65535");
    }
    deltasync::Result<Endpoint> again = ParseEndpoint(ep->scheme + "://" + ep->Authority());
    Check(again.ok() && again->host == ep->host && again->port == ep->port, "an endpoint's round trip");
  }
  return 0;
}
