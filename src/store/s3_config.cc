// Bucket URLs, endpoints and the resolution of S3Options from the
// environment and AWS profiles (precedence as the AWS CLI's, see s3_config.h).
#include "store/s3_config.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "deltasync/blob.h"

namespace deltasync::s3 {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || IsDigit(c); }

// A host is a name or an address: nothing that would read as another host
// or port when the URL is written back (a ':', a NUL, a space).
bool IsHostName(std::string_view h) {
  return !h.empty() && std::all_of(h.begin(), h.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
  });
}

// "[...]": hex digits, ':' and '.', then an optional zone ("%25eth0").
bool IsIpv6Literal(std::string_view h) {
  if (h.size() < 4 || h.front() != '[' || h.back() != ']') return false;
  std::string_view inner = h.substr(1, h.size() - 2);
  std::string_view zone;
  if (size_t pct = inner.find('%'); pct != std::string_view::npos) {
    zone = inner.substr(pct + 1);
    inner = inner.substr(0, pct);
    if (zone.empty() || !std::all_of(zone.begin(), zone.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
        })) {
      return false;
    }
  }
  return inner.find(':') != std::string_view::npos && std::all_of(inner.begin(), inner.end(), [](char c) {
           return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
         });
}

// S3's bucket naming rules (the DNS-compatible ones every provider accepts).
Status CheckBucketName(std::string_view b) {
  auto bad = [&](std::string_view rule) {
    return Status::InvalidArgument("invalid bucket name '" + std::string(b) + "': " + std::string(rule));
  };
  if (b.size() < 3 || b.size() > 63) return bad("must be 3 to 63 characters long");
  for (char c : b) {
    if (!IsLowerAlnum(c) && c != '-' && c != '.') {
      return bad("only lower-case letters, digits, '-' and '.' are allowed");
    }
  }
  if (!IsLowerAlnum(b.front()) || !IsLowerAlnum(b.back())) {
    return bad("must start and end with a letter or digit");
  }
  if (b.find("..") != std::string_view::npos) return bad("must not contain '..'");
  return Status::OK();
}

// Reads an AWS config file; a missing file is an empty one.
Result<IniFile> LoadIni(const std::string& path) {
  Result<Blob> blob = Blob::ReadFile(path);
  if (!blob.ok()) {
    if (blob.status().code() == ErrorCode::kNotFound) return IniFile{};
    return blob.status();
  }
  std::string_view text(reinterpret_cast<const char*>(blob->data()), blob->size());
  return ParseIni(text, path);
}

const IniSection* FindSection(const IniFile& file, const std::string& name) {
  auto it = file.find(name);
  return it == file.end() ? nullptr : &it->second;
}

std::string Get(const IniSection* s, const std::string& key) {
  if (s == nullptr) return "";
  auto it = s->find(key);
  return it == s->end() ? "" : it->second;
}

}  // namespace

EnvLookup ProcessEnvironment() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

Result<BucketUrl> ParseBucketUrl(std::string_view url) {
  constexpr std::string_view kScheme = "s3://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    return Status::InvalidArgument(std::string(1, '\'').append(url).append("' is not an s3:// URL"));
  }
  std::string_view rest = url.substr(kScheme.size());
  size_t slash = rest.find('/');
  BucketUrl out;
  out.bucket = std::string(rest.substr(0, slash));
  DS_RETURN_IF_ERROR(CheckBucketName(out.bucket).WithContext(url));
  if (slash != std::string_view::npos) {
    std::string_view prefix = rest.substr(slash + 1);
    while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
    if (!prefix.empty()) {
      // The prefix is a key (the same rules) that objects live under.
      DS_RETURN_IF_ERROR(ValidateKey(prefix).WithContext(std::string(url) + ": prefix"));
      out.prefix = std::string(prefix) + "/";
    }
  }
  return out;
}

Result<Endpoint> ParseEndpoint(std::string_view url) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("invalid S3 endpoint '" + std::string(url) + "': " + std::string(why));
  };
  Endpoint ep;
  size_t sep = url.find("://");
  if (sep == std::string_view::npos) return bad("expected http://host[:port] or https://host[:port]");
  ep.scheme = std::string(url.substr(0, sep));
  if (ep.scheme != "http" && ep.scheme != "https") return bad("the scheme must be http or https");
  std::string_view rest = url.substr(sep + 3);
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find_first_of("/?#@") != std::string_view::npos) {
    return bad("only scheme, host and port are supported (no path, query or user)");
  }
  bool has_port = false;
  if (!rest.empty() && rest.front() == '[') {  // [IPv6]:port
    size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad("unterminated IPv6 address");
    ep.host = std::string(rest.substr(0, close + 1));
    rest.remove_prefix(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return bad("unexpected text after the IPv6 address");
      has_port = true;
      ep.port = std::string(rest.substr(1));
    }
  } else {
    size_t colon = rest.rfind(':');
    ep.host = std::string(rest.substr(0, colon));
    has_port = colon != std::string_view::npos;
    if (has_port) ep.port = std::string(rest.substr(colon + 1));
  }
  if (ep.host.empty()) return bad("no host");
  if (!IsHostName(ep.host) && !IsIpv6Literal(ep.host)) {
    return bad("the host must be a name or address (letters, digits, '.', '-', '_'; or [IPv6])");
  }
  if (has_port && ep.port.empty()) return bad("a ':' without a port");
  for (char c : ep.port) {
    if (!IsDigit(c)) return bad("the port must be a number");
  }
  if (!ep.port.empty() && (ep.port.size() > 5 || std::atoi(ep.port.c_str()) > 65535 || std::atoi(ep.port.c_str()) < 1)) {
    return bad("the port must be 1 to 65535");
  }
  return ep;
}

Result<ResolvedConfig> ResolveConfig(const S3Options& given, std::string_view bucket,
                                     const EnvLookup& env) {
  ResolvedConfig rc;
  S3Options& o = rc.options;
  o = given;
  auto getenv = [&](std::string_view name) -> std::string {
    if (!given.read_environment) return "";
    return env(name).value_or("");
  };

  // The profile's sections, read only when something is still missing.
  std::string profile = o.profile.empty() ? getenv("AWS_PROFILE") : o.profile;
  bool profile_named = !profile.empty();
  if (profile.empty()) profile = "default";
  std::string home = getenv("HOME");
  std::string cred_path = getenv("AWS_SHARED_CREDENTIALS_FILE");
  if (cred_path.empty() && !home.empty()) cred_path = home + "/.aws/credentials";
  std::string conf_path = getenv("AWS_CONFIG_FILE");
  if (conf_path.empty() && !home.empty()) conf_path = home + "/.aws/config";
  IniFile cred_file, conf_file;
  if (given.read_environment) {
    if (!cred_path.empty()) { DS_ASSIGN_OR_RETURN(cred_file, LoadIni(cred_path)); }
    if (!conf_path.empty()) { DS_ASSIGN_OR_RETURN(conf_file, LoadIni(conf_path)); }
  }
  const IniSection* cred_section = FindSection(cred_file, profile);
  const IniSection* conf_section =
      FindSection(conf_file, profile == "default" ? "default" : "profile " + profile);
  if (conf_section == nullptr && profile == "default") conf_section = FindSection(conf_file, "profile default");
  if (profile_named && given.read_environment && cred_section == nullptr && conf_section == nullptr) {
    return Status::InvalidArgument("AWS profile '" + profile + "' not found in " + cred_path + " or " +
                                   conf_path);
  }

  // Credentials: all from one source, never mixed.
  if (!o.access_key.empty() || !o.secret_key.empty()) {
    rc.credential_source = "S3Options";
  } else if (!getenv("AWS_ACCESS_KEY_ID").empty() && !getenv("AWS_SECRET_ACCESS_KEY").empty()) {
    o.access_key = getenv("AWS_ACCESS_KEY_ID");
    o.secret_key = getenv("AWS_SECRET_ACCESS_KEY");
    o.session_token = getenv("AWS_SESSION_TOKEN");
    rc.credential_source = "environment (AWS_ACCESS_KEY_ID)";
  } else if (!Get(cred_section, "aws_access_key_id").empty()) {
    o.access_key = Get(cred_section, "aws_access_key_id");
    o.secret_key = Get(cred_section, "aws_secret_access_key");
    o.session_token = Get(cred_section, "aws_session_token");
    rc.credential_source = "profile '" + profile + "' in " + cred_path;
  } else if (!Get(conf_section, "aws_access_key_id").empty()) {
    o.access_key = Get(conf_section, "aws_access_key_id");
    o.secret_key = Get(conf_section, "aws_secret_access_key");
    o.session_token = Get(conf_section, "aws_session_token");
    rc.credential_source = "profile '" + profile + "' in " + conf_path;
  }
  if (o.access_key.empty() || o.secret_key.empty()) {
    std::string where = rc.credential_source.empty() ? "" : " (" + rc.credential_source + " is incomplete)";
    return Status::InvalidArgument(
        "no S3 credentials" + where +
        ": set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or aws_access_key_id and "
        "aws_secret_access_key in profile '" + profile + "' of " +
        (cred_path.empty() ? std::string("~/.aws/credentials") : cred_path));
  }

  if (o.region.empty()) o.region = getenv("AWS_REGION");
  if (o.region.empty()) o.region = getenv("AWS_DEFAULT_REGION");
  if (o.region.empty()) o.region = Get(conf_section, "region");
  if (o.region.empty()) o.region = "us-east-1";

  bool custom_endpoint = true;
  if (o.endpoint.empty()) o.endpoint = getenv("AWS_ENDPOINT_URL_S3");
  if (o.endpoint.empty()) o.endpoint = getenv("AWS_ENDPOINT_URL");
  if (o.endpoint.empty()) o.endpoint = Get(conf_section, "s3.endpoint_url");
  if (o.endpoint.empty()) o.endpoint = Get(conf_section, "endpoint_url");
  if (o.endpoint.empty()) {
    o.endpoint = "https://s3." + o.region + ".amazonaws.com";
    custom_endpoint = false;
  }
  DS_ASSIGN_OR_RETURN(rc.endpoint, ParseEndpoint(o.endpoint));

  if (o.addressing == S3Addressing::kAuto) {
    std::string style = getenv("DELTASYNC_S3_ADDRESSING");
    if (style.empty()) style = Get(conf_section, "s3.addressing_style");
    if (style == "path") {
      o.addressing = S3Addressing::kPath;
    } else if (style == "virtual") {
      o.addressing = S3Addressing::kVirtualHosted;
    } else if (!style.empty() && style != "auto") {
      return Status::InvalidArgument("unknown S3 addressing style '" + style +
                                     "' (expected path, virtual or auto)");
    }
  }
  if (o.addressing == S3Addressing::kAuto) {
    // A bucket with dots does not match AWS's wildcard TLS certificate, and
    // custom endpoints (RGW, MinIO) are usually reached by IP: path-style.
    bool dotted = bucket.find('.') != std::string_view::npos;
    rc.path_style = custom_endpoint || dotted;
  } else {
    rc.path_style = o.addressing == S3Addressing::kPath;
  }
  return rc;
}

}  // namespace deltasync::s3
