// Multipart uploads: large objects as parallel parts, and the cleanup of
// uploads that were never completed (a publisher killed mid-upload).
//
// Parts are read straight from the caller's spans (a part may begin in one
// span and end in another), so no part is ever copied into its own buffer.
// Any failure aborts the upload: S3 keeps (and bills) the parts of an
// unfinished upload forever otherwise, invisible to ListObjects.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <ctime>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include "common/parallel.h"
#include "deltasync/s3_store.h"
#include "store/s3_client.h"
#include "store/s3_fields.h"
#include "store/s3_listing.h"
#include "store/s3_signer.h"
#include "store/s3_xml.h"

namespace deltasync {
namespace {

using s3::HttpResponse;
using s3::S3Call;
using s3::S3Client;

constexpr uint64_t kMinPartSize = 5ull << 20;
constexpr uint64_t kMaxPartSize = 5ull << 30;
constexpr uint64_t kMaxParts = 10000;

// The part size for an object of `size` bytes: the configured size, grown so
// that the object fits in S3's 10,000 parts.
uint64_t PartSizeFor(uint64_t configured, uint64_t size) {
  uint64_t needed = (size + kMaxParts - 1) / kMaxParts;
  return std::max({configured, needed, kMinPartSize});
}

Status Abort(S3Client& c, const std::string& object, const std::string& upload_id) {
  S3Call del{"DELETE", object};
  del.query = {{"uploadId", upload_id}};
  HttpResponse r = c.Send(del);
  if (r.ok() || (r.transport_error == 0 && r.status == 404)) return Status::OK();
  return c.Error(del, r);
}

// The ETag S3-compatible servers give a completed multipart upload: the MD5
// of the parts' binary MD5s, "-", the number of parts (AWS without SSE-KMS or
// SSE-C, Ceph RGW, MinIO). nullopt when a part's ETag is not an MD5 (32 hex
// digits, quoted or not): then it cannot be computed.
std::optional<std::string> MultipartETag(const std::vector<std::string>& part_etags) {
  auto nibble = [](char ch) -> int {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
  };
  std::string digests;
  for (const std::string& etag : part_etags) {
    std::string_view hex = s3::UnquotedETag(etag);
    if (hex.size() != 32) return std::nullopt;
    for (size_t i = 0; i < 32; i += 2) {
      int hi = nibble(hex[i]), lo = nibble(hex[i + 1]);
      if (hi < 0 || lo < 0) return std::nullopt;
      digests += static_cast<char>(hi * 16 + lo);
    }
  }
  ByteSpan span(reinterpret_cast<const uint8_t*>(digests.data()), digests.size());
  return s3::Md5Hex(std::span<const ByteSpan>(&span, 1), 0, digests.size()) + "-" +
         std::to_string(part_etags.size());
}

// After CompleteMultipartUpload answered NoSuchUpload to a retry: OK when the
// object at the key is provably this upload (its ETag is the one computed from
// our parts' ETags, its size ours); otherwise kIOError, and the caller uploads
// again. The same size is not the same bytes: an older object of that size
// left at the key by an aborted upload must never count as written.
Status CheckCompletedEarlier(S3Client& c, const std::string& object, const std::vector<std::string>& etags,
                             uint64_t size) {
  const std::string what = c.Url(object) + ": CompleteMultipartUpload answered NoSuchUpload after a retry, and ";
  const std::string then = "; the upload is not counted as written (upload it again)";
  S3Call head{"HEAD", object};
  HttpResponse h = c.Send(head);
  if (!h.ok()) {
    return Status::IOError(what + "the key holds no object of it (" + c.Error(head, h).message() + ")" + then);
  }
  std::optional<std::string> expected = MultipartETag(etags);
  if (!expected) {
    return Status::IOError(what + "the parts' ETags are not MD5s (encryption with SSE-KMS or SSE-C?), so the "
                           "object at the key cannot be proven to be this upload" + then);
  }
  std::string found(s3::UnquotedETag(h.Header("etag")));
  std::transform(found.begin(), found.end(), found.begin(), [](unsigned char ch) { return std::tolower(ch); });
  std::optional<uint64_t> found_size = s3::ParseContentLength(h.Header("content-length"));
  if (found == *expected && found_size == size) return Status::OK();
  return Status::IOError(what + "the object at the key is another one (ETag \"" + found + "\", Content-Length '" +
                         h.Header("content-length") + "'; this upload's would be \"" + *expected + "\", " +
                         std::to_string(size) + " bytes)" + then);
}

// CompleteMultipartUpload can fail inside a 200 answer (S3 sends the status
// before it has finished assembling): the body then holds an <Error>.
Status Complete(S3Client& c, const std::string& object, const std::string& upload_id,
                const std::vector<std::string>& etags, uint64_t size) {
  std::string xml = "<CompleteMultipartUpload>";
  for (size_t i = 0; i < etags.size(); ++i) {
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + s3::XmlEscape(etags[i]) +
           "</ETag></Part>";
  }
  xml += "</CompleteMultipartUpload>";
  ByteSpan span(reinterpret_cast<const uint8_t*>(xml.data()), xml.size());
  S3Call post{"POST", object};
  post.query = {{"uploadId", upload_id}};
  post.headers = {{"content-type", "application/xml"}};
  post.body = {std::span<const ByteSpan>(&span, 1), 0, xml.size()};
  int max_attempts = std::max(1, c.options().max_attempts);
  for (int round = 1;; ++round) {
    HttpResponse r = c.Send(post);
    bool error_in_body = r.ok() && s3::XmlText(r.body, "Error").has_value();
    if (r.ok() && !error_in_body) return Status::OK();
    if (r.transport_error == 0 && r.status == 404 && (r.attempts > 1 || round > 1)) {
      // NoSuchUpload after a retry: an earlier attempt may have completed it,
      // or someone aborted it (`gc --abort-uploads-older-than`) and the key
      // holds an older object. Only this upload's ETag proves which.
      return CheckCompletedEarlier(c, object, etags, size);
    }
    std::string code = s3::S3ErrorCode(r);
    bool retry = error_in_body && (code == "InternalError" || code == "SlowDown");
    if (!retry || round >= max_attempts) {
      if (error_in_body) {
        return Status::IOError(c.Url(object) + ": CompleteMultipartUpload failed: " + code + ": " +
                               s3::XmlText(r.body, "Message").value_or(""));
      }
      return c.Error(post, r);
    }
  }
}

}  // namespace

Status S3Store::PutMultipart(const std::string& object, std::span<const ByteSpan> parts, uint64_t size) {
  S3Client& c = *client_;
  const uint64_t part_size = PartSizeFor(c.options().part_size, size);
  if (part_size > kMaxPartSize) {
    return Status::InvalidArgument(c.Url(object) + ": " + std::to_string(size) +
                                   " bytes exceed what 10,000 parts of at most 5 GiB can hold");
  }
  const size_t n = static_cast<size_t>((size + part_size - 1) / part_size);

  S3Call init{"POST", object};
  init.query = {{"uploads", ""}};
  HttpResponse r = c.Send(init);
  if (!r.ok()) return c.Error(init, r).WithContext("starting a multipart upload");
  std::string upload_id = s3::XmlText(r.body, "UploadId").value_or("");
  if (upload_id.empty()) {
    return Status::IOError(c.Url(object) + ": CreateMultipartUpload answered without an UploadId");
  }

  std::vector<std::string> etags(n);
  std::atomic<bool> stop{false};
  std::mutex mu;
  Status failure;
  ParallelFor(n, c.options().parallelism, [&](size_t i) {
    if (stop.load()) return;
    uint64_t offset = i * part_size;
    S3Call put{"PUT", object};
    put.query = {{"partNumber", std::to_string(i + 1)}, {"uploadId", upload_id}};
    put.body = {parts, offset, std::min(part_size, size - offset)};
    HttpResponse pr = c.Send(put);
    Status st;
    if (!pr.ok()) {
      st = c.Error(put, pr).WithContext("part " + std::to_string(i + 1) + " of " + std::to_string(n));
    } else if (pr.Header("etag").empty()) {
      st = Status::IOError(c.Url(object) + ": part " + std::to_string(i + 1) + " answered without an ETag");
    } else {
      etags[i] = pr.Header("etag");
    }
    if (!st.ok()) {
      stop.store(true);
      std::lock_guard<std::mutex> lock(mu);
      if (failure.ok()) failure = st;
    }
  });
  if (failure.ok()) failure = Complete(c, object, upload_id, etags, size);
  if (failure.ok()) return Status::OK();

  Status aborted = Abort(c, object, upload_id);
  if (!aborted.ok()) {
    return Status(failure.code(), failure.message() + "; aborting the upload failed too (" +
                                      aborted.message() + "); `deltasync gc` removes it later");
  }
  return failure;
}

Status S3Store::AbortStaleUploads(std::chrono::seconds older_than, size_t* aborted) {
  S3Client& c = *client_;
  if (aborted != nullptr) *aborted = 0;
  const int64_t cutoff = static_cast<int64_t>(std::time(nullptr)) - older_than.count();
  std::string key_marker, id_marker;
  std::set<std::pair<std::string, std::string>> seen_markers;
  // ListMultipartUploads pages by (key, upload id) markers; every page must
  // give a pair not seen before (markers that go round in a circle would
  // abort the same uploads forever).
  for (;;) {
    S3Call list{"GET", ""};
    list.query = {{"uploads", ""}, {"prefix", c.prefix()}};
    if (!key_marker.empty()) list.query.emplace_back("key-marker", key_marker);
    if (!id_marker.empty()) list.query.emplace_back("upload-id-marker", id_marker);
    HttpResponse r = c.Send(list);
    if (!r.ok()) return c.Error(list, r).WithContext("listing multipart uploads");
    s3::UploadsPage page = s3::ParseUploadsPage(r.body);
    for (const s3::UploadEntry& u : page.uploads) {
      // An upload whose start cannot be read is never proven stale.
      if (!u.initiated || *u.initiated > cutoff) continue;
      // Under this bucket's prefix only, even when a server answers with
      // uploads outside the prefix asked for (another run's, "run10/"
      // beside "run1/"), as List skips such keys.
      if (u.key.compare(0, c.prefix().size(), c.prefix()) != 0) continue;
      DS_RETURN_IF_ERROR(Abort(c, u.key, u.upload_id).WithContext("aborting upload " + u.upload_id));
      if (aborted != nullptr) ++*aborted;
    }
    if (!page.truncated) break;
    std::string next_key = std::move(page.next_key);
    std::string next_id = std::move(page.next_upload_id);
    if (!seen_markers.emplace(next_key, next_id).second || (next_key.empty() && next_id.empty())) {
      return Status::IOError(c.Url(c.prefix()) + ": upload listing is truncated but its markers do not advance");
    }
    key_marker = std::move(next_key);
    id_marker = std::move(next_id);
  }
  return Status::OK();
}

}  // namespace deltasync
