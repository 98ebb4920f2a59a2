// AWS Signature Version 4 for S3 requests (internal).
//
// Pure functions: no clock, no network, no state, so every step can be checked
// against AWS's published test vectors (tests/store/s3_store_test.cc). The
// S3 flavour of SigV4 is used: the path is URI-encoded once and never
// normalised ("a//b" and "a/./b" are distinct keys on S3).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "deltasync/tensor.h"

namespace deltasync::s3 {

// SHA-256 of "" in hex: the payload hash of a request without a body.
inline constexpr std::string_view kEmptyPayloadSha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
// Payload hash for bodies that are not hashed (integrity comes from the
// manifest's XXH3-128 and, on https, from TLS).
inline constexpr std::string_view kUnsignedPayload = "UNSIGNED-PAYLOAD";

// Lower-case hex of SHA-256 over `parts[offset, offset+length)` concatenated.
std::string Sha256Hex(std::span<const ByteSpan> parts, uint64_t offset, uint64_t length);
std::string Sha256Hex(std::string_view data);
// Lower-case hex of MD5 over the same bytes: what S3-compatible servers
// (AWS without SSE-KMS/SSE-C, Ceph RGW, MinIO) give as a single PUT's ETag,
// and per part of a multipart upload. Checks only, never signing.
std::string Md5Hex(std::span<const ByteSpan> parts, uint64_t offset, uint64_t length);

// RFC 3986 percent-encoding as SigV4 defines it: unreserved characters
// (A-Z a-z 0-9 - . _ ~) stay, every other byte becomes %XX (upper-case hex).
// With keep_slash, '/' stays too (for paths).
std::string UriEncode(std::string_view in, bool keep_slash);

// "20150830T123600Z" for a Unix time in seconds (UTC).
std::string AmzDate(int64_t unix_seconds);

struct SigV4Credentials {
  std::string access_key;
  std::string secret_key;
  std::string session_token;  // empty when none; sent as x-amz-security-token
};

struct SigV4Request {
  std::string method;  // "GET", "PUT", ...
  // The decoded path, starting with '/': "/bucket/dir/key" (path-style) or
  // "/dir/key" (virtual-hosted). Encoded here, once.
  std::string path;
  // Decoded query parameters in any order; a parameter without a value
  // ("?uploads") has an empty value.
  std::vector<std::pair<std::string, std::string>> query;
  // Every header to sign (names in any case, values as sent). Must include
  // host and x-amz-date; x-amz-security-token is added by Sign() when the
  // credentials carry a session token.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_hash;  // hex SHA-256 of the body, or kUnsignedPayload
};

struct SigV4Result {
  std::string canonical_request;
  std::string string_to_sign;
  std::string signature;      // hex
  std::string authorization;  // the Authorization header value
  // "Param1=value1&Param2=value2": the encoded, sorted query, for the URL,
  // so that what is sent is exactly what was signed.
  std::string canonical_query;
  std::string encoded_path;  // the path as encoded for the URL
  // request.headers plus x-amz-security-token when added.
  std::vector<std::pair<std::string, std::string>> headers;
};

// Signs `request` at `amz_date` ("YYYYMMDDTHHMMSSZ") for `region`/`service`.
SigV4Result SignV4(const SigV4Request& request, const SigV4Credentials& credentials,
                   std::string_view region, std::string_view service, std::string_view amz_date);

// `s` with ASCII A-Z lowered (header names, INI keys); other bytes kept.
std::string AsciiLower(std::string_view s);

}  // namespace deltasync::s3
