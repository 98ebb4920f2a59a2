// S3Store: opening a bucket, and the single-request operations (PUT, HEAD,
// LIST, DELETE, conditional PUT, bucket creation). Reads are in
// s3_download.cc, multipart uploads in s3_multipart.cc.
#include "deltasync/s3_store.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <utility>

#include "store/s3_client.h"
#include "store/s3_config.h"
#include "store/s3_listing.h"
#include "store/s3_signer.h"
#include "store/s3_xml.h"

namespace deltasync {
namespace {

using s3::HttpResponse;
using s3::S3Call;

constexpr uint64_t kMinPartSize = 5ull << 20;     // S3's smallest part (but the last)
constexpr uint64_t kMaxSinglePut = 5ull << 30;    // S3's largest single PUT

uint64_t TotalSize(std::span<const ByteSpan> parts) {
  uint64_t n = 0;
  for (ByteSpan p : parts) n += p.size();
  return n;
}

std::string Unquote(const std::string& etag) {
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"') return etag.substr(1, etag.size() - 2);
  return etag;
}

// A conditional PUT answered 200 without an ETag: the answer does not say
// which object was written, and the token is what the next compare-and-swap
// trusts. A HEAD may already see a racing writer's object, so its ETag counts
// only when it is the MD5 of the bytes written (what a single PUT's ETag is on
// AWS without SSE-KMS/SSE-C, Ceph RGW and MinIO): then the key holds exactly
// our bytes. Anything else is kIOError (docs/s3.md, "Conditional manifest writes").
template <typename CurrentETag>
Result<std::string> WrittenWithoutETag(s3::S3Client& c, const std::string& object, std::span<const ByteSpan> parts,
                                       uint64_t size, CurrentETag& current_etag) {
  DS_ASSIGN_OR_RETURN(std::optional<std::string> now, current_etag());
  const std::string md5 = s3::Md5Hex(parts, 0, size);
  std::string found = now ? Unquote(*now) : std::string();
  std::transform(found.begin(), found.end(), found.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (now && found == md5) return *now;
  return Status::IOError(c.Url(object) + ": the server did not return an ETag for a conditional write, and the " +
                         (now ? "object at the key has ETag " + *now + ", not the MD5 of the bytes written (" + md5 + ")"
                              : std::string("key holds no object now")) +
                         ": deltasync cannot prove which object it wrote (the server must return the ETag of a "
                         "PUT, or give MD5 ETags; docs/s3.md)");
}

// A HEAD of `key`: its object name and the answer (kNotFound etc. when it failed).
Result<std::pair<std::string, HttpResponse>> Head(s3::S3Client& c, std::string_view key) {
  DS_ASSIGN_OR_RETURN(std::string object, c.ObjectKey(key));
  S3Call head{"HEAD", object};
  HttpResponse r = c.Send(head);
  if (!r.ok()) return c.Error(head, r);
  return std::make_pair(std::move(object), std::move(r));
}

}  // namespace

S3Store::S3Store(std::unique_ptr<s3::S3Client> client) : client_(std::move(client)) {}
S3Store::~S3Store() = default;

Result<std::unique_ptr<S3Store>> S3Store::Open(std::string_view url, S3Options options) {
  DS_ASSIGN_OR_RETURN(s3::BucketUrl where, s3::ParseBucketUrl(url));
  DS_ASSIGN_OR_RETURN(s3::ResolvedConfig config,
                      s3::ResolveConfig(options, where.bucket, s3::ProcessEnvironment()));
  S3Options& o = config.options;
  if (o.part_size < kMinPartSize) o.part_size = kMinPartSize;
  if (o.parallelism < 1) o.parallelism = 1;
  std::unique_ptr<S3Store> store(
      new S3Store(std::make_unique<s3::S3Client>(std::move(config), where.bucket, where.prefix)));
  s3::S3Client& c = *store->client_;

  S3Call head{"HEAD", ""};
  HttpResponse r = c.Send(head);
  if (r.ok()) return store;
  if (r.transport_error == 0 && r.status == 404) {
    if (c.options().create_bucket) {
      DS_RETURN_IF_ERROR(store->CreateBucket());
      return store;
    }
    return Status::NotFound("bucket '" + c.bucket() + "' does not exist at " + c.EndpointDescription() +
                            " (create it with --create-bucket, or S3Options::create_bucket)");
  }
  return c.Error(head, r).WithContext("cannot open bucket '" + c.bucket() + "'");
}

Status S3Store::CreateBucket() {
  s3::S3Client& c = *client_;
  // Outside us-east-1 AWS wants the region in the body; RGW and MinIO accept
  // an empty body for their default region.
  std::string body;
  if (c.options().region != "us-east-1") {
    body = "<CreateBucketConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><LocationConstraint>" +
           s3::XmlEscape(c.options().region) + "</LocationConstraint></CreateBucketConfiguration>";
  }
  ByteSpan span(reinterpret_cast<const uint8_t*>(body.data()), body.size());
  S3Call put{"PUT", ""};
  put.body = {std::span<const ByteSpan>(&span, 1), 0, body.size()};
  HttpResponse r = c.Send(put);
  if (r.ok()) return Status::OK();
  std::string code = s3::S3ErrorCode(r);
  if (code == "BucketAlreadyOwnedByYou") return Status::OK();
  if (code == "BucketAlreadyExists") {
    return Status::Conflict("bucket '" + c.bucket() + "' already exists and belongs to another account");
  }
  return c.Error(put, r).WithContext("cannot create bucket '" + c.bucket() + "'");
}

Status S3Store::Put(std::string_view key, std::span<const ByteSpan> parts) {
  DS_ASSIGN_OR_RETURN(std::string object, client_->ObjectKey(key));
  uint64_t size = TotalSize(parts);
  if (size > client_->options().multipart_threshold || size > kMaxSinglePut) {
    return PutMultipart(object, parts, size);
  }
  S3Call put{"PUT", object};
  put.body = {parts, 0, size};
  HttpResponse r = client_->Send(put);
  return r.ok() ? Status::OK() : client_->Error(put, r);
}

Result<uint64_t> S3Store::Size(std::string_view key) {
  DS_ASSIGN_OR_RETURN(auto head, Head(*client_, key));
  return client_->ContentLength(head.first, head.second);
}

Result<std::string> S3Store::Token(std::string_view key) {
  DS_ASSIGN_OR_RETURN(auto head, Head(*client_, key));
  std::string etag = head.second.Header("etag");
  if (etag.empty()) return Status::IOError(client_->Url(head.first) + ": HEAD answered without an ETag");
  return etag;
}

Result<std::vector<std::string>> S3Store::List(std::string_view prefix) {
  s3::S3Client& c = *client_;
  const std::string full_prefix = c.prefix() + std::string(prefix);
  std::vector<std::string> keys;
  std::string token;
  std::set<std::string> seen_tokens;
  // ListObjectsV2 pages hold up to 1000 keys; every page must give a token
  // not seen before, which bounds the loop even against a faulty server
  // (one whose tokens go round in a circle would list keys again and again).
  for (;;) {
    S3Call list{"GET", ""};
    list.query = {{"list-type", "2"}, {"prefix", full_prefix}};
    if (!token.empty()) list.query.emplace_back("continuation-token", token);
    HttpResponse r = c.Send(list);
    if (!r.ok()) return c.Error(list, r).WithContext("listing '" + full_prefix + "'");
    Result<s3::ListPage> page = s3::ParseListPage(r.body);
    if (!page.ok()) return page.status().WithContext(c.Url(full_prefix));
    for (const std::string& key : page->keys) {
      if (key.compare(0, c.prefix().size(), c.prefix()) != 0) continue;
      keys.push_back(key.substr(c.prefix().size()));
    }
    if (!page->truncated) break;
    std::string next = std::move(page->next_token);
    if (next.empty() || !seen_tokens.insert(next).second) {
      return Status::IOError(c.Url(full_prefix) + ": listing is truncated but gives no new continuation token" +
                             (next.empty() ? "" : " (it repeats an earlier one)"));
    }
    token = std::move(next);
  }
  std::sort(keys.begin(), keys.end());  // S3 sorts by UTF-8 bytes already; be sure
  return keys;
}

Status S3Store::Delete(std::string_view key) {
  DS_ASSIGN_OR_RETURN(std::string object, client_->ObjectKey(key));
  S3Call del{"DELETE", object};
  HttpResponse r = client_->Send(del);
  if (r.ok() || (r.transport_error == 0 && r.status == 404)) return Status::OK();
  return client_->Error(del, r);
}

std::string S3Store::Describe() const {
  const std::string& p = client_->prefix();
  std::string url = "s3://" + client_->bucket();
  if (!p.empty()) url.append("/").append(p, 0, p.size() - 1);
  return url;
}

const std::string& S3Store::bucket() const { return client_->bucket(); }
const std::string& S3Store::prefix() const { return client_->prefix(); }
std::string S3Store::EndpointDescription() const { return client_->EndpointDescription(); }
const BufferPool* S3Store::download_pool() const { return client_->download_pool().get(); }

Result<std::string> S3Store::PutIfUnchanged(std::string_view key, std::span<const ByteSpan> parts,
                                            const std::optional<std::string>& expected_token) {
  s3::S3Client& c = *client_;
  DS_ASSIGN_OR_RETURN(std::string object, c.ObjectKey(key));
  uint64_t size = TotalSize(parts);
  if (size > kMaxSinglePut) {
    return Status::InvalidArgument(c.Url(object) + ": conditional writes are limited to 5 GiB (one PUT)");
  }
  const std::string expected_text =
      expected_token ? "ETag " + *expected_token : std::string("no object");

  // The current ETag (nullopt: no object), for the pre-check and for telling
  // RGW's If-Match quirk from a real conflict.
  auto current_etag = [&]() -> Result<std::optional<std::string>> {
    S3Call head{"HEAD", object};
    HttpResponse r = c.Send(head);
    if (r.transport_error == 0 && r.status == 404) return std::optional<std::string>();
    if (!r.ok()) return c.Error(head, r);
    return std::optional<std::string>(r.Header("etag"));
  };
  auto conflict = [&](const std::optional<std::string>& now, std::string_view note) {
    return Status::Conflict(c.Url(object) + ": changed by another writer (expected " + expected_text +
                            ", found " + (now ? "ETag " + *now : std::string("no object")) + ")" +
                            std::string(note));
  };

  if (c.options().conditional_put_precheck) {
    DS_ASSIGN_OR_RETURN(std::optional<std::string> now, current_etag());
    if (now != expected_token) return conflict(now, "");
  }
  for (int round = 0; round < 2; ++round) {
    S3Call put{"PUT", object};
    put.body = {parts, 0, size};
    if (expected_token) {
      put.headers = {{"if-match", c.unquoted_if_match ? Unquote(*expected_token) : *expected_token}};
    } else {
      put.headers = {{"if-none-match", "*"}};
    }
    HttpResponse r = c.Send(put);
    if (r.ok()) {
      std::string etag = r.Header("etag");
      if (!etag.empty()) return etag;
      return WrittenWithoutETag(c, object, parts, size, current_etag);
    }
    if (r.transport_error != 0 || r.status != 412) return c.Error(put, r);
    DS_ASSIGN_OR_RETURN(std::optional<std::string> now, current_etag());
    if (expected_token && now == expected_token && !c.unquoted_if_match && round == 0) {
      // 412 although the ETag matches: the server wants it without quotes
      // (Ceph RGW 16). Remember that and send it again.
      c.unquoted_if_match = true;
      continue;
    }
    bool retried = r.attempts > 1 || r.resent;
    return conflict(now, retried ? "; the PUT was retried, so an earlier attempt of this "
                                          "writer may be the one that landed"
                                        : "");
  }
  return Status::Internal(c.Url(object) + ": conditional PUT loop ended without a result");
}

Result<std::shared_ptr<Store>> OpenS3StoreFromUrl(std::string_view url, bool create_bucket) {
  S3Options options;
  options.create_bucket = create_bucket;
  DS_ASSIGN_OR_RETURN(std::unique_ptr<S3Store> store, S3Store::Open(url, options));
  return std::shared_ptr<Store>(std::move(store));
}

}  // namespace deltasync
