// Session 49's review of gc's multipart-upload abort (S3Store::
// AbortStaleUploads): only this bucket prefix's stale uploads, even from a
// server that answers the listing with uploads outside the prefix asked for
// (another run's, "run10/" beside "run1/").
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "deltasync/s3_store.h"
#include "testing/scripted_s3.h"

namespace deltasync {
namespace {

using testing::HttpReply;
using testing::S3ErrorReply;
using testing::ScriptedReply;
using testing::ScriptedRequest;
using testing::ScriptedS3;

TEST(GcAbortReviewTest, AbortsOnlyTheStaleUploadsUnderItsOwnPrefix) {
  std::mutex mu;
  std::vector<std::string> prefixes_asked, aborted_paths;
  auto handler = [&](const ScriptedRequest& r) -> ScriptedReply {
    std::lock_guard<std::mutex> lock(mu);
    bool uploads = false, upload_id = false;
    std::string prefix = r.Query("prefix");
    r.Query("uploads", &uploads);
    r.Query("uploadId", &upload_id);
    if (r.method == "HEAD") return HttpReply(200);
    if (r.method == "GET" && uploads) {
      prefixes_asked.push_back(prefix);
      // The prefix ignored: every upload of the bucket.
      auto upload = [](const std::string& key, const std::string& when) {
        return "<Upload><Key>" + key + "</Key><UploadId>id-" + key + "</UploadId><Initiated>" + when +
               "</Initiated></Upload>";
      };
      return HttpReply(200, {},
                       "<ListMultipartUploadsResult><IsTruncated>false</IsTruncated>" +
                           upload("run1/anchors/step_000010.safetensors", "2020-01-01T00:00:00.000Z") +
                           upload("run10/anchors/step_000020.safetensors", "2020-01-01T00:00:00.000Z") +
                           upload("run1x", "2020-01-01T00:00:00.000Z") +
                           upload("run1/deltas/step_000011.safetensors", "2999-01-01T00:00:00.000Z") +
                           "</ListMultipartUploadsResult>");
    }
    if (r.method == "DELETE" && upload_id) {
      aborted_paths.push_back(r.path);
      return HttpReply(204);
    }
    return S3ErrorReply(400, "InvalidRequest");
  };
  std::string error;
  std::unique_ptr<ScriptedS3> server = ScriptedS3::Start(handler, &error);
  ASSERT_NE(server, nullptr) << error;
  Result<std::unique_ptr<S3Store>> store = S3Store::Open("s3://bkt/run1", testing::ScriptedS3Options(*server));
  ASSERT_TRUE(store.ok()) << store.status().ToString();

  size_t aborted = 0;
  Status st = (*store)->AbortStaleUploads(std::chrono::hours(24), &aborted);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(prefixes_asked, std::vector<std::string>{"run1/"});
  EXPECT_EQ(aborted, 1u);
  EXPECT_EQ(aborted_paths, std::vector<std::string>{"/bkt/run1/anchors/step_000010.safetensors"});
}

}  // namespace
}  // namespace deltasync
