// When an S3 request is worth repeating, and how long to wait first (internal).
#pragma once

#include <chrono>
#include <string_view>

#include "store/s3_http.h"

namespace deltasync::s3 {

// True for failures that a later attempt can cure: connection errors and
// resets, timeouts (including stalls caught by the low-speed limit), 5xx,
// 429, and the S3 error codes SlowDown, RequestTimeout, IncompleteBody,
// OperationAborted and friends. False for answers that will not change
// (403, 404, 412, other 4xx) and for local errors (a malformed URL, a body
// larger than asked for).
bool IsRetryable(const HttpResponse& response, std::string_view s3_error_code);

// "Full jitter" exponential backoff: a uniformly random wait in
// [0, min(max, base * 2^retry)], retry = 0 for the first retry. Spreading
// retries at random keeps many clients that failed together (a throttled
// bucket) from retrying in lockstep.
std::chrono::milliseconds BackoffDelay(int retry, std::chrono::milliseconds base,
                                       std::chrono::milliseconds max);

}  // namespace deltasync::s3
