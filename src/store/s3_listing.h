// The pages of S3's two listings (internal): ListObjectsV2 and
// ListMultipartUploads, decoded from the server's XML answer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deltasync/status.h"

namespace deltasync::s3 {

// One ListObjectsV2 page: every <Contents>' <Key>, decoded, in page order.
struct ListPage {
  std::vector<std::string> keys;
  bool truncated = false;
  std::string next_token;  // "" when the page gives none
};
// kIOError when the page is not one whole <ListBucketResult> document or an
// entry names no key: a page misread (cut short, a CDATA section that never
// ends) must never give a shorter or a different list.
Result<ListPage> ParseListPage(std::string_view xml);

// One ListMultipartUploads page. An <Upload> without a key or an upload id
// is left out (nothing can be done with it); `initiated` is nullopt when its
// <Initiated> is not an S3 timestamp (such an upload is never proven stale).
struct UploadEntry {
  std::string key, upload_id;
  std::optional<int64_t> initiated;  // seconds since the epoch
};
struct UploadsPage {
  std::vector<UploadEntry> uploads;
  bool truncated = false;
  std::string next_key, next_upload_id;
};
UploadsPage ParseUploadsPage(std::string_view xml);

}  // namespace deltasync::s3
