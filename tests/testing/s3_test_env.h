// The S3 server the tests use: the one scripts/start-rgw.sh starts (its env
// file exports AWS_ENDPOINT_URL and keys). Without AWS_ENDPOINT_URL (or
// AWS_ENDPOINT_URL_S3) the S3 tests skip. Every test works in buckets of its
// own, named ds-test-..., and removes them afterwards.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "deltasync/s3_store.h"

namespace deltasync::testing {

struct S3TestServer {
  std::string endpoint;  // "http://127.0.0.1:PORT"
  std::string access_key;
  std::string secret_key;
  std::string region;
  uint16_t loopback_port = 0;  // when the endpoint is http://127.0.0.1:PORT (proxy tests need it)
};

// nullopt when no endpoint is configured.
std::optional<S3TestServer> FindS3TestServer();
inline constexpr char kNoS3Reason[] =
    "no S3 endpoint: start one with `ENV=$(scripts/start-rgw.sh) && source $ENV` "
    "(sets AWS_ENDPOINT_URL and keys)";

// Options with explicit endpoint and keys (no environment, no profiles), and
// short backoff so that retry tests run fast.
S3Options S3TestOptions(const S3TestServer& server);

// "ds-test-<tag>-<pid>-<n>": unique within the run and across concurrent runs.
std::string UniqueBucketName(std::string_view tag);

// Creates a fresh bucket and opens "s3://bucket/prefix" with `options`; the
// bucket (objects, unfinished uploads and all) is removed when the last
// reference goes. nullptr (and a test failure) when that does not work.
std::shared_ptr<S3Store> MakeTestBucket(const S3TestServer& server, S3Options options,
                                        std::string_view tag, std::string_view prefix = "");

// Removes every object and upload in `bucket`, then the bucket. Best effort.
void RemoveBucket(const S3TestServer& server, const std::string& bucket);

}  // namespace deltasync::testing
