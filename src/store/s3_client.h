// S3Client: signed S3 requests against one bucket, with retries, and errors
// turned into Status messages a person can act on (internal).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "deltasync/blob.h"
#include "deltasync/status.h"
#include "store/s3_config.h"
#include "store/s3_http.h"

namespace deltasync::s3 {

// One S3 operation, described before signing (each attempt is signed anew,
// with the time of that attempt).
struct S3Call {
  S3Call(std::string m, std::string o) : method(std::move(m)), object(std::move(o)) {}

  std::string method;
  std::string object;  // the object's key in the bucket, prefix included; "" = the bucket
  std::vector<std::pair<std::string, std::string>> query;    // decoded
  std::vector<std::pair<std::string, std::string>> headers;  // besides host, date, auth
  BodySource body;
  MutableByteSpan into;                      // see HttpRequest
  BlobBuffer* grow_into = nullptr;           // see HttpRequest; cleared before each attempt
};

class S3Client {
 public:
  S3Client(ResolvedConfig config, std::string bucket, std::string prefix);

  // Signs and sends `call`; repeats it while the failure is retryable
  // (s3_retry.h), up to max_attempts, sleeping with jittered backoff between.
  // Returns the last response (check ok()); response.attempts says how many.
  HttpResponse Send(const S3Call& call);

  // The error for a failed response:
  //   "s3://bucket/key: GET: HTTP 404 NoSuchKey: The specified key does not
  //    exist. (request id tx00.., 1 attempt)"
  // kNotFound for 404, kIOError otherwise. Never contains a secret.
  Status Error(const S3Call& call, const HttpResponse& response) const;

  // The size a HEAD of `object` answered: its Content-Length, digits only
  // (s3::ParseContentLength); kIOError naming the value when it is missing
  // or not a number of bytes.
  Result<uint64_t> ContentLength(std::string_view object, const HttpResponse& head) const;

  // The object key for a store key: checks ValidateKey, puts the prefix in
  // front, and refuses results longer than S3's 1024 bytes (kInvalidArgument).
  Result<std::string> ObjectKey(std::string_view key) const;

  // "s3://bucket/object" (or "s3://bucket" for the bucket itself).
  std::string Url(std::string_view object) const;
  const S3Options& options() const { return config_.options; }
  const std::string& bucket() const { return bucket_; }
  const std::string& prefix() const { return prefix_; }
  const std::string& credential_source() const { return config_.credential_source; }
  // "http://127.0.0.1:7480 (path-style)".
  std::string EndpointDescription() const;

  // Ceph RGW 16 compares If-Match on PUT with the ETag without its quotes
  // (and answers 412 to the quoted form). Set once that has been observed.
  std::atomic<bool> unquoted_if_match{false};

  // Where downloads take and return their pages (options().download_pool_bytes;
  // null when 0).
  const std::shared_ptr<BufferPool>& download_pool() const { return download_pool_; }

 private:
  HttpRequest Sign(const S3Call& call, const std::string& payload_hash) const;

  ResolvedConfig config_;
  std::string bucket_;
  std::string prefix_;
  HttpClient http_;
  std::shared_ptr<BufferPool> download_pool_;
};

// The S3 error code (<Code>) of an error body; for bodiless answers (HEAD) a
// stand-in from the status ("NotFound", "Forbidden", ...); "" when unknown.
std::string S3ErrorCode(const HttpResponse& response);

}  // namespace deltasync::s3
