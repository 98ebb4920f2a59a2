// S3Store: a Store over the S3 REST API (AWS S3, Ceph RGW, MinIO, R2, GCS
// interop, ...), signed with AWS Signature Version 4. docs/s3.md describes
// configuration, retries, multipart uploads and conditional writes.
//
// Object keys are the store's keys under the URL's prefix:
// "s3://bucket/runs/a" + "manifest.json" -> object "runs/a/manifest.json".
//
// Thread safety: an S3Store may be used from several threads at once; they
// share one pool of HTTP connections.
//
// Secrets (the secret key, the session token) never appear in a Status
// message, in Describe(), or anywhere else this library prints.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deltasync/status.h"
#include "deltasync/store.h"

namespace deltasync {

enum class S3Addressing {
  kAuto,           // virtual-hosted for AWS's own endpoints, path-style for a custom endpoint
  kPath,           // http://endpoint/bucket/key
  kVirtualHosted,  // http://bucket.endpoint/key
};

struct S3Options {
  // --- Where, and as whom. Empty fields are filled, like the AWS CLI does,
  // from AWS_* environment variables and the profile in ~/.aws/credentials
  // and ~/.aws/config (unless read_environment is false). See docs/s3.md.
  std::string endpoint;  // "http://127.0.0.1:7480"; empty: https://s3.<region>.amazonaws.com
  std::string region;    // empty and unset anywhere: "us-east-1"
  std::string access_key;
  std::string secret_key;
  std::string session_token;
  std::string profile;  // empty: $AWS_PROFILE, else "default"
  S3Addressing addressing = S3Addressing::kAuto;
  bool read_environment = true;

  // --- Large objects.
  // Objects above multipart_threshold bytes are uploaded in parts of
  // max(part_size, ceil(size / 10000)) bytes (S3 allows 10,000 parts of 5 MiB
  // to 5 GiB); part_size below 5 MiB is raised to 5 MiB. Downloads above
  // part_size are fetched as parallel ranged GETs of part_size bytes.
  uint64_t part_size = 64ull << 20;
  uint64_t multipart_threshold = 64ull << 20;
  int parallelism = 8;  // concurrent part uploads / ranged GETs per call
  // Send the body's SHA-256 (the server then rejects a corrupted upload)
  // instead of UNSIGNED-PAYLOAD. Costs one hash pass over every upload.
  bool sign_payload = false;
  // Downloads land in pages that are reused: the pages of a released
  // download (its Blob's last copy gone) stay mapped, up to this many bytes
  // in all, for the next download of about their size, which then skips the
  // kernel's fault and clear of every fresh page (BufferPool in
  // deltasync/blob.h). Held until a later release pushes them out (oldest
  // first) or the store is destroyed. 0: every download gets fresh pages.
  uint64_t download_pool_bytes = 2ull << 30;

  // --- Failures. A request that fails with a 5xx, 429, SlowDown,
  // RequestTimeout, a connection error or a timeout is retried up to
  // max_attempts times in total, waiting a random time in [0, min(backoff_max,
  // backoff_base * 2^n)] before the n-th retry ("full jitter"). Other 4xx
  // answers (403, 404, 412, ...) are never retried.
  int max_attempts = 5;
  std::chrono::milliseconds backoff_base{100};
  std::chrono::milliseconds backoff_max{10'000};
  std::chrono::milliseconds connect_timeout{5'000};
  // A transfer moving fewer than low_speed_bytes_per_s bytes per second for
  // low_speed_time is abandoned (and retried): catches stalled connections
  // without capping how long a large transfer may take.
  uint32_t low_speed_bytes_per_s = 1;
  std::chrono::seconds low_speed_time{30};

  // --- Bucket and conditional writes.
  bool create_bucket = false;  // Open() creates a missing bucket
  // Before a conditional PUT, check the object's current ETag with a HEAD and
  // report kConflict without writing when it differs. Closes the gap on
  // servers that ignore If-Match / If-None-Match, apart from a race window of
  // one round trip (docs/s3.md, "Conditional writes").
  bool conditional_put_precheck = true;
};

namespace s3 {
class S3Client;  // internal: src/store/s3_client.h
}  // namespace s3

class S3Store : public Store {
 public:
  // Opens "s3://bucket" or "s3://bucket/prefix". Resolves options (above),
  // then checks that the bucket exists with a HEAD request: a missing bucket
  // is kNotFound naming it and the endpoint (or, with create_bucket, it is
  // created). Bad credentials give an error naming where they came from.
  static Result<std::unique_ptr<S3Store>> Open(std::string_view url, S3Options options = {});
  ~S3Store() override;

  // Put: a single PUT up to multipart_threshold, else a multipart upload with
  // parallel parts read straight from `parts`; a failed multipart upload is
  // aborted so that no parts are left behind.
  Status Put(std::string_view key, std::span<const ByteSpan> parts) override;
  using Store::Put;
  // Get: objects above part_size arrive as parallel ranged GETs into one
  // buffer; every range is pinned to the first one's ETag (sent as If-Match
  // and checked in each answer, with its Content-Range), so an object
  // replaced mid-download is read again rather than stitched from two
  // versions; a large object served without an ETag is read in one GET
  // instead (slower, exact: its ranges could not be pinned).
  Result<Blob> Get(std::string_view key) override;
  Result<Blob> GetRange(std::string_view key, uint64_t offset, uint64_t length) override;
  Result<uint64_t> Size(std::string_view key) override;
  Result<std::vector<std::string>> List(std::string_view prefix) override;
  Status Delete(std::string_view key) override;
  std::string Describe() const override;  // "s3://bucket/prefix"
  // token = the object's ETag.
  Result<Versioned> GetVersioned(std::string_view key) override;
  // The ETag of a HEAD.
  Result<std::string> Token(std::string_view key) override;
  // A single PUT with If-Match: <etag> or If-None-Match: *; 412 -> kConflict.
  // Limited to 5 GiB (no multipart): meant for the manifest.
  Result<std::string> PutIfUnchanged(std::string_view key, std::span<const ByteSpan> parts,
                                     const std::optional<std::string>& expected_token) override;

  // Aborts the multipart uploads under the store's prefix that were started
  // more than `older_than` ago (what a killed publisher leaves behind; they
  // are invisible to List but are stored and billed). `aborted`, when given,
  // receives how many were aborted.
  Status AbortStaleUploads(std::chrono::seconds older_than, size_t* aborted = nullptr);
  // Creates the bucket; OK when it already exists and is ours.
  Status CreateBucket();

  const std::string& bucket() const;
  const std::string& prefix() const;  // "" or ending in '/'
  // How requests are addressed, for messages: "http://127.0.0.1:7480 (path-style)".
  std::string EndpointDescription() const;
  // The pool downloads reuse pages from (S3Options::download_pool_bytes);
  // nullptr when it is 0.
  const BufferPool* download_pool() const;

 private:
  explicit S3Store(std::unique_ptr<s3::S3Client> client);
  Status PutMultipart(const std::string& object, std::span<const ByteSpan> parts, uint64_t size);

  std::unique_ptr<s3::S3Client> client_;
};

// For OpenStore("s3://..."): S3Store::Open with options from the environment.
Result<std::shared_ptr<Store>> OpenS3StoreFromUrl(std::string_view url, bool create_bucket);

}  // namespace deltasync
