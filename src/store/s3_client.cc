#include "store/s3_client.h"

#include <chrono>
#include <optional>
#include <thread>

#include "store/s3_fields.h"
#include "store/s3_retry.h"
#include "store/s3_signer.h"
#include "store/s3_xml.h"
#include "deltasync/store.h"

namespace deltasync::s3 {
namespace {

HttpOptions HttpOptionsFrom(const S3Options& o) {
  HttpOptions h;
  h.connect_timeout = o.connect_timeout;
  h.low_speed_bytes_per_s = o.low_speed_bytes_per_s;
  h.low_speed_time = o.low_speed_time;
  return h;
}

std::string Plural(int n, std::string_view word) {
  return std::to_string(n) + " " + std::string(word) + (n == 1 ? "" : "s");
}

}  // namespace

std::string S3ErrorCode(const HttpResponse& r) {
  if (r.transport_error != 0) return "";
  if (std::optional<std::string> code = XmlText(r.body, "Code")) return *code;
  switch (r.status) {
    case 301: return "PermanentRedirect";
    case 400: return "BadRequest";
    case 403: return "Forbidden";
    case 404: return "NotFound";
    case 412: return "PreconditionFailed";
    case 416: return "InvalidRange";
    case 503: return "ServiceUnavailable";
    default: return "";
  }
}

S3Client::S3Client(ResolvedConfig config, std::string bucket, std::string prefix)
    : config_(std::move(config)),
      bucket_(std::move(bucket)),
      prefix_(std::move(prefix)),
      http_(HttpOptionsFrom(config_.options)) {
  if (config_.options.download_pool_bytes > 0) {
    download_pool_ = std::make_shared<BufferPool>(static_cast<size_t>(config_.options.download_pool_bytes));
  }
}

std::string S3Client::Url(std::string_view object) const {
  std::string url = "s3://" + bucket_;
  if (!object.empty()) url.append("/").append(object);
  return url;
}

Result<std::string> S3Client::ObjectKey(std::string_view key) const {
  DS_RETURN_IF_ERROR(ValidateKey(key));
  std::string object = prefix_ + std::string(key);
  if (object.size() > 1024) {
    return Status::InvalidArgument(Url(prefix_) + ": key '" + std::string(key) + "' makes an object key of " +
                                   std::to_string(object.size()) + " bytes; S3 allows 1024");
  }
  return object;
}

Result<uint64_t> S3Client::ContentLength(std::string_view object, const HttpResponse& head) const {
  const std::string len = head.Header("content-length");
  if (len.empty()) return Status::IOError(Url(object) + ": HEAD answered without Content-Length");
  std::optional<uint64_t> size = s3::ParseContentLength(len);
  if (!size) {
    return Status::IOError(Url(object) + ": HEAD answered Content-Length '" + len + "', not a number of bytes, at " +
                           EndpointDescription());
  }
  return *size;
}

std::string S3Client::EndpointDescription() const {
  return config_.endpoint.scheme + "://" + config_.endpoint.Authority() +
         (config_.path_style ? " (path-style)" : " (virtual-hosted)");
}

HttpRequest S3Client::Sign(const S3Call& call, const std::string& payload_hash) const {
  const Endpoint& ep = config_.endpoint;
  SigV4Request req;
  req.method = call.method;
  std::string host;
  if (config_.path_style) {
    host = ep.Authority();
    req.path = "/" + bucket_ + (call.object.empty() ? "" : "/" + call.object);
  } else {
    host = bucket_ + "." + ep.Authority();
    req.path = "/" + call.object;
  }
  req.query = call.query;
  int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  req.headers = {{"host", host}, {"x-amz-date", AmzDate(now)}, {"x-amz-content-sha256", payload_hash}};
  for (const auto& h : call.headers) req.headers.push_back(h);
  req.payload_hash = payload_hash;

  SigV4Credentials creds{config_.options.access_key, config_.options.secret_key,
                         config_.options.session_token};
  SigV4Result signed_req = SignV4(req, creds, config_.options.region, "s3", req.headers[1].second);

  HttpRequest http;
  http.method = call.method;
  http.url = ep.scheme + "://" + host + signed_req.encoded_path;
  if (!signed_req.canonical_query.empty()) http.url += "?" + signed_req.canonical_query;
  http.headers = std::move(signed_req.headers);
  http.headers.emplace_back("Authorization", std::move(signed_req.authorization));
  http.body = call.body;
  http.into = call.into;
  http.grow_into = call.grow_into;
  return http;
}

HttpResponse S3Client::Send(const S3Call& call) {
  const S3Options& o = config_.options;
  std::string payload_hash(kEmptyPayloadSha256);
  if (call.body.length > 0 || call.method == "PUT" || call.method == "POST") {
    payload_hash = o.sign_payload ? Sha256Hex(call.body.parts, call.body.offset, call.body.length)
                                  : std::string(kUnsignedPayload);
  }
  int max_attempts = o.max_attempts < 1 ? 1 : o.max_attempts;
  HttpResponse response;
  for (int attempt = 1;; ++attempt) {
    if (call.grow_into != nullptr) call.grow_into->Clear();
    response = http_.Perform(Sign(call, payload_hash));
    response.attempts = attempt;
    if (response.ok() || attempt >= max_attempts) break;
    if (!IsRetryable(response, S3ErrorCode(response))) break;
    std::this_thread::sleep_for(BackoffDelay(attempt - 1, o.backoff_base, o.backoff_max));
  }
  return response;
}

Status S3Client::Error(const S3Call& call, const HttpResponse& r) const {
  std::string msg = Url(call.object) + ": " + call.method;
  if (r.transport_error != 0) {
    msg += " failed: " + r.transport_message;
  } else {
    msg += ": HTTP " + std::to_string(r.status);
    std::string code = S3ErrorCode(r);
    if (!code.empty()) msg += " " + code;
    std::optional<std::string> message = XmlText(r.body, "Message");
    if (message && !message->empty()) msg += ": " + *message;
    if (r.status == 403) {
      msg += " (credentials from " + config_.credential_source + ", region " + config_.options.region + ")";
    }
    if (r.status == 301) {
      std::string region = r.Header("x-amz-bucket-region");
      if (!region.empty()) msg += " (the bucket is in region " + region + "; set AWS_REGION)";
    }
  }
  std::string request_id = r.Header("x-amz-request-id");
  msg += " (";
  if (!request_id.empty()) msg += "request id " + request_id + ", ";
  msg += Plural(r.attempts, "attempt") + " at " + EndpointDescription() + ")";
  if (r.transport_error == 0 && r.status == 404) return Status::NotFound(msg);
  return Status::IOError(msg);
}

}  // namespace deltasync::s3
