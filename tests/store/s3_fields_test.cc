// Session 52 (h1): the small fields of an S3 server's answers are read in
// their exact form only. Before, strtoull/sscanf read "Content-Length: -1" as
// 2^64-1 and "abc" as 0, and "Initiated: -999-01-01T..." as a time in year
// -999, so gc aborted an upload it could not prove stale.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "deltasync/s3_store.h"
#include "store/s3_fields.h"
#include "store/s3_listing.h"
#include "testing/scripted_s3.h"

namespace deltasync {
namespace {

using testing::HttpReply;
using testing::S3ErrorReply;
using testing::ScriptedReply;
using testing::ScriptedRequest;
using testing::ScriptedS3;

TEST(S3Fields, ContentLengthIsDigitsOnly) {
  EXPECT_EQ(s3::ParseContentLength("0"), 0u);
  EXPECT_EQ(s3::ParseContentLength("18446744073709551615"), UINT64_MAX);
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "12abc", "abc", "18446744073709551616", "0x10"}) {
    EXPECT_FALSE(s3::ParseContentLength(bad).has_value()) << bad;
  }
}

TEST(S3Fields, ContentRangeIsExactlyTheFormS3Writes) {
  std::optional<s3::ContentRange> r = s3::ParseContentRange("bytes 0-99/1000");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first, 0u);
  EXPECT_EQ(r->last, 99u);
  EXPECT_EQ(r->total, 1000u);
  EXPECT_EQ(s3::FormatContentRange(*r), "bytes 0-99/1000");
  for (const char* bad : {"bytes 0-99/1000x", "bytes -0-99/1000", "bytes 0- 99/1000", "bytes 0-99/ 1000",
                          "bytes 5-4/10", "bytes 0-10/10", "bytes 0-99/*", "bytes */1000", "items 0-1/2",
                          "bytes 0-1-2/3", "bytes 0/1-2", "bytes +0-1/2"}) {
    EXPECT_FALSE(s3::ParseContentRange(bad).has_value()) << bad;
  }
  EXPECT_EQ(s3::ParseUnsatisfiedRange("bytes */1000"), 1000u);
  EXPECT_FALSE(s3::ParseUnsatisfiedRange("bytes */-1").has_value());
  EXPECT_FALSE(s3::ParseUnsatisfiedRange("bytes 0-1/2").has_value());
}

TEST(S3Fields, IsoTimeIsAnS3TimestampOnly) {
  EXPECT_EQ(s3::ParseIsoTime("1970-01-01T00:00:00.000Z"), 0);
  EXPECT_EQ(s3::ParseIsoTime("2024-02-29T12:00:00Z"), 1709208000);
  EXPECT_EQ(s3::ParseIsoTime("2024-05-01T12:00:00.123456Z"), 1714564800);
  for (const char* bad : {"-999-01-01T00:00:00.000Z", "2024-13-01T00:00:00Z", "2023-02-29T00:00:00Z",
                          "2024-00-10T00:00:00Z", "2024-05-01T24:00:00Z", "2024-5-1T1:2:3Z", " 2024-05-01T12:00:00Z",
                          "2024-05-01T12:00:00", "2024-05-01T12:00:00.Z", "2024-05-01T12:00:00.000+01:00",
                          "+024-05-01T12:00:00Z", "2024-05-01T12:00:00ZZ", ""}) {
    EXPECT_FALSE(s3::ParseIsoTime(bad).has_value()) << bad;
  }
}

// A HEAD whose Content-Length is not a number is an error, not a size.
TEST(S3Fields, SizeRefusesAContentLengthThatIsNotANumber) {
  for (const std::string length : {"-1", "12abc", "abc"}) {
    SCOPED_TRACE(length);
    std::string error;
    std::unique_ptr<ScriptedS3> server = ScriptedS3::Start(
        [&](const ScriptedRequest& r) -> ScriptedReply {
          if (r.method == "HEAD" && r.path == "/bkt/k") return HttpReply(200, {{"Content-Length", length}});
          if (r.method == "HEAD") return HttpReply(200);
          return S3ErrorReply(400, "InvalidRequest");
        },
        &error);
    ASSERT_NE(server, nullptr) << error;
    Result<std::unique_ptr<S3Store>> store = S3Store::Open("s3://bkt", testing::ScriptedS3Options(*server));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    Result<uint64_t> size = (*store)->Size("k");
    EXPECT_FALSE(size.ok()) << "read as " << *size;
  }
}

// gc never aborts an upload whose start it cannot read.
TEST(S3Fields, GcDoesNotAbortAnUploadWithAnUnreadableStart) {
  std::mutex mu;
  std::vector<std::string> aborted_paths;
  std::string error;
  std::unique_ptr<ScriptedS3> server = ScriptedS3::Start(
      [&](const ScriptedRequest& r) -> ScriptedReply {
        std::lock_guard<std::mutex> lock(mu);
        bool uploads = false, upload_id = false;
        r.Query("uploads", &uploads);
        r.Query("uploadId", &upload_id);
        if (r.method == "HEAD") return HttpReply(200);
        if (r.method == "GET" && uploads) {
          return HttpReply(200, {},
                           "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>"
                           "<Upload><Key>a</Key><UploadId>id-a</UploadId><Initiated>-999-01-01T00:00:00.000Z"
                           "</Initiated></Upload>"
                           "<Upload><Key>b</Key><UploadId>id-b</UploadId><Initiated>2020-00-01T00:00:00.000Z"
                           "</Initiated></Upload>"
                           "<Upload><Key>c</Key><UploadId>id-c</UploadId><Initiated>2020-01-01T00:00:00.000Z"
                           "</Initiated></Upload></ListMultipartUploadsResult>");
        }
        if (r.method == "DELETE" && upload_id) {
          aborted_paths.push_back(r.path);
          return HttpReply(204);
        }
        return S3ErrorReply(400, "InvalidRequest");
      },
      &error);
  ASSERT_NE(server, nullptr) << error;
  Result<std::unique_ptr<S3Store>> store = S3Store::Open("s3://bkt", testing::ScriptedS3Options(*server));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  size_t aborted = 0;
  Status st = (*store)->AbortStaleUploads(std::chrono::hours(24), &aborted);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(aborted_paths, std::vector<std::string>{"/bkt/c"});
}

TEST(S3Listing, UploadsPageLeavesOutEntriesWithoutKeyOrIdAndKeepsUnreadableTimes) {
  s3::UploadsPage page = s3::ParseUploadsPage(
      "<ListMultipartUploadsResult><IsTruncated>true</IsTruncated><NextKeyMarker>k</NextKeyMarker>"
      "<NextUploadIdMarker>i</NextUploadIdMarker>"
      "<Upload><Key>a</Key><UploadId>1</UploadId><Initiated>x</Initiated></Upload>"
      "<Upload><UploadId>2</UploadId></Upload><Upload><Key>c</Key></Upload></ListMultipartUploadsResult>");
  ASSERT_EQ(page.uploads.size(), 1u);
  EXPECT_EQ(page.uploads[0].key, "a");
  EXPECT_FALSE(page.uploads[0].initiated.has_value());
  EXPECT_TRUE(page.truncated);
  EXPECT_EQ(page.next_key, "k");
  EXPECT_EQ(page.next_upload_id, "i");
}

}  // namespace
}  // namespace deltasync
