// S3 configuration (internal): bucket URLs, endpoints, AWS config files and
// the environment, resolved the way the AWS CLI does (docs/s3.md).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "deltasync/s3_store.h"
#include "deltasync/status.h"

namespace deltasync::s3 {

// An INI file as the AWS CLI reads it (Python configparser rules, reduced):
// "[section]" headers, "key = value" or "key: value" lines (keys lower-cased,
// values trimmed), '#'/';' comment lines, and AWS's nested form
//     s3 =
//       addressing_style = path
// which is stored as key "s3.addressing_style". An indented line after a key
// with a value continues that value.
using IniSection = std::map<std::string, std::string>;
using IniFile = std::map<std::string, IniSection>;
// kInvalidArgument naming `label` and the line number on a malformed line.
Result<IniFile> ParseIni(std::string_view text, std::string_view label);

// "s3://bucket/some/prefix" -> bucket "bucket", prefix "some/prefix/".
struct BucketUrl {
  std::string bucket;
  std::string prefix;  // "" or ending in '/'
};
Result<BucketUrl> ParseBucketUrl(std::string_view url);

// "https://host[:port][/]" -> parts. kInvalidArgument for anything else.
struct Endpoint {
  std::string scheme;  // "http" or "https"
  std::string host;    // "127.0.0.1", "s3.eu-west-1.amazonaws.com"
  std::string port;    // "" when the URL has none
  // host[:port], as sent in the Host header.
  std::string Authority() const { return port.empty() ? host : host + ":" + port; }
};
Result<Endpoint> ParseEndpoint(std::string_view url);

// Options with every field resolved, plus where the credentials came from
// (for error messages, never the secret itself).
struct ResolvedConfig {
  S3Options options;
  Endpoint endpoint;
  bool path_style = true;
  std::string credential_source;  // "environment (AWS_ACCESS_KEY_ID)", "profile 'x' in /root/.aws/credentials", ...
};

// Reads an environment variable; nullopt when unset. Tests pass their own.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;
EnvLookup ProcessEnvironment();

// Fills the empty fields of `given` for `bucket`:
//   credentials: AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN),
//     else the profile (AWS_PROFILE or "default") in AWS_SHARED_CREDENTIALS_FILE
//     (~/.aws/credentials), else that profile in AWS_CONFIG_FILE (~/.aws/config);
//   region: AWS_REGION, AWS_DEFAULT_REGION, the profile's region, "us-east-1";
//   endpoint: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's
//     s3.endpoint_url or endpoint_url, else AWS's endpoint for the region;
//   addressing: DELTASYNC_S3_ADDRESSING (path|virtual), the profile's
//     s3.addressing_style, else automatic.
// Errors: a named profile that exists nowhere, no credentials at all, a
// malformed file or endpoint (kInvalidArgument, never quoting a secret).
Result<ResolvedConfig> ResolveConfig(const S3Options& given, std::string_view bucket,
                                     const EnvLookup& env);

}  // namespace deltasync::s3
