#include "store/s3_retry.h"

#include <curl/curl.h>

#include <algorithm>
#include <random>

namespace deltasync::s3 {

bool IsRetryable(const HttpResponse& response, std::string_view s3_error_code) {
  if (response.transport_error != 0) {
    if (response.sink_overflow || response.sink_no_memory) return false;
    switch (static_cast<CURLcode>(response.transport_error)) {
      // Local mistakes or refusals that another attempt repeats exactly.
      case CURLE_UNSUPPORTED_PROTOCOL:
      case CURLE_URL_MALFORMAT:
      case CURLE_OUT_OF_MEMORY:
      case CURLE_BAD_FUNCTION_ARGUMENT:
      case CURLE_ABORTED_BY_CALLBACK:
      case CURLE_PEER_FAILED_VERIFICATION:
      case CURLE_SSL_CACERT_BADFILE:
      case CURLE_SSL_CERTPROBLEM:
      case CURLE_READ_ERROR:  // our body callback refused: the spans are shorter than declared
        return false;
      default:
        // Connection refused/reset, timeouts, a truncated body, DNS hiccups.
        return true;
    }
  }
  if (response.status >= 500 || response.status == 429) return true;
  // 4xx codes that S3 documents as transient: a body cut short on the way
  // (IncompleteBody), an idle connection the server gave up on
  // (RequestTimeout), and concurrent operations on the same key that S3 asks
  // to retry (OperationAborted, ConditionalRequestConflict; a retried
  // conditional PUT then sees 412 if another writer won).
  return s3_error_code == "SlowDown" || s3_error_code == "RequestTimeout" ||
         s3_error_code == "InternalError" || s3_error_code == "ServiceUnavailable" ||
         s3_error_code == "Throttling" || s3_error_code == "ThrottlingException" ||
         s3_error_code == "IncompleteBody" || s3_error_code == "OperationAborted" ||
         s3_error_code == "ConditionalRequestConflict";
}

std::chrono::milliseconds BackoffDelay(int retry, std::chrono::milliseconds base,
                                       std::chrono::milliseconds max) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  int shift = std::clamp(retry, 0, 30);
  int64_t cap = std::min<int64_t>(max.count(), base.count() << shift);
  if (cap <= 0) return std::chrono::milliseconds(0);
  std::uniform_int_distribution<int64_t> dist(0, cap);
  return std::chrono::milliseconds(dist(rng));
}

}  // namespace deltasync::s3
