// S3Store through FaultProxy (tests/testing/fault_proxy.h) to the test RGW:
// connection resets, stalls and 503 SlowDown answers are retried until they
// stop; when they do not stop, the error says what happened. Skipped without
// an http://127.0.0.1 S3 endpoint.
#include <gtest/gtest.h>

#include <chrono>

#include "deltasync/s3_store.h"
#include "testing/fault_proxy.h"
#include "testing/s3_test_env.h"
#include "testing/test_bytes.h"

namespace deltasync::testing {
namespace {

using testing::Span;

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

bool Contains(const std::string& s, std::string_view needle) { return s.find(needle) != std::string::npos; }

std::vector<uint8_t> Pattern(size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>((i * 131) ^ (i >> 9));
  return out;
}

class S3FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::optional<S3TestServer> s = FindS3TestServer();
    if (!s) GTEST_SKIP() << kNoS3Reason;
    if (s->loopback_port == 0) GTEST_SKIP() << "the fault proxy needs an http://127.0.0.1:PORT endpoint";
    server_ = *s;
    // The bucket is made directly; only the store under test goes through the proxy.
    direct_ = MakeTestBucket(server_, S3TestOptions(server_), "fault");
    ASSERT_NE(direct_, nullptr);
    std::string error;
    proxy_ = FaultProxy::Start(server_.loopback_port, &error);
    ASSERT_NE(proxy_, nullptr) << error;
  }

  std::unique_ptr<S3Store> Open(S3Options o) {
    o.endpoint = proxy_->endpoint();
    Result<std::unique_ptr<S3Store>> r = S3Store::Open("s3://" + direct_->bucket(), o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  S3Options Options() const { return S3TestOptions(server_); }

  S3TestServer server_;
  std::shared_ptr<S3Store> direct_;
  std::unique_ptr<FaultProxy> proxy_;
};

TEST_F(S3FaultTest, ProxyPassesTrafficUntouched) {
  std::unique_ptr<S3Store> s = Open(Options());
  ASSERT_NE(s, nullptr);
  std::vector<uint8_t> data = Pattern(3 << 20);
  ASSERT_TRUE(s->Put("plain", data).ok());
  EXPECT_EQ(s->Get("plain")->size(), data.size());
  EXPECT_EQ(proxy_->faults_injected(), 0);
  EXPECT_GE(proxy_->requests(), 3);
}

TEST_F(S3FaultTest, ConnectionResetsAreRetried) {
  std::unique_ptr<S3Store> s = Open(Options());
  ASSERT_NE(s, nullptr);
  proxy_->ResetNextRequests(2);
  ASSERT_TRUE(s->Put("reset/put", Span("survived")).ok());
  EXPECT_EQ(proxy_->faults_injected(), 2);
  proxy_->ResetNextRequests(2);
  Result<Blob> got = s->Get("reset/put");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->size(), 8u);
  EXPECT_EQ(proxy_->faults_injected(), 4);
}

TEST_F(S3FaultTest, ResetInTheMiddleOfADownloadIsRetried) {
  std::vector<uint8_t> data = Pattern(6 << 20);
  ASSERT_TRUE(direct_->Put("reset/big", data).ok());
  std::unique_ptr<S3Store> s = Open(Options());
  ASSERT_NE(s, nullptr);
  proxy_->ResetNextRequests(1, /*after_response_bytes=*/1 << 20);
  Result<Blob> got = s->Get("reset/big");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), data.size());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), got->data()));
  EXPECT_EQ(proxy_->faults_injected(), 1);
}

TEST_F(S3FaultTest, SlowDownIsRetriedWithBackoff) {
  std::unique_ptr<S3Store> s = Open(Options());
  ASSERT_NE(s, nullptr);
  proxy_->FailNextRequests(3);
  ASSERT_TRUE(s->Put("slow/k", Span("eventually")).ok());
  EXPECT_EQ(proxy_->faults_injected(), 3);
  proxy_->FailNextRequests(2);
  Result<std::vector<std::string>> keys = s->List("slow/");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(*keys, std::vector<std::string>{"slow/k"});
}

TEST_F(S3FaultTest, StallPastTheTimeoutIsRetried) {
  S3Options o = Options();
  o.low_speed_time = std::chrono::seconds(1);  // nothing moving for 1 s = stalled
  std::unique_ptr<S3Store> s = Open(o);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(direct_->Put("stall/k", Span("patience")).ok());
  proxy_->StallNextRequests(1, milliseconds(6000));
  Clock::time_point t0 = Clock::now();
  Result<Blob> got = s->Get("stall/k");
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(proxy_->faults_injected(), 1);
  EXPECT_GE(secs, 0.9);  // it did wait for the low-speed limit...
  EXPECT_LT(secs, 5.5);  // ...and did not sit out the whole stall
}

TEST_F(S3FaultTest, GivingUpAfterMaxAttemptsSaysWhy) {
  S3Options o = Options();
  o.max_attempts = 3;
  std::unique_ptr<S3Store> s = Open(o);
  ASSERT_NE(s, nullptr);
  int before = proxy_->requests();
  proxy_->FailNextRequests(100);
  Status st = s->Put("doomed/key.bin", Span("x"));
  proxy_->Clear();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kIOError);
  EXPECT_EQ(proxy_->requests() - before, 3);
  EXPECT_TRUE(Contains(st.message(), "s3://" + direct_->bucket() + "/doomed/key.bin")) << st.message();
  EXPECT_TRUE(Contains(st.message(), "503 SlowDown")) << st.message();
  EXPECT_TRUE(Contains(st.message(), "3 attempts")) << st.message();

  before = proxy_->requests();
  proxy_->ResetNextRequests(100);
  Result<Blob> r = s->Get("doomed/key.bin");
  proxy_->Clear();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(proxy_->requests() - before, 3);
  EXPECT_TRUE(Contains(r.status().message(), "3 attempts")) << r.status().message();
}

TEST_F(S3FaultTest, NotFoundIsNotRetried) {
  std::unique_ptr<S3Store> s = Open(Options());
  ASSERT_NE(s, nullptr);
  int before = proxy_->requests();
  EXPECT_EQ(s->Get("absent").status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(proxy_->requests() - before, 1);
}

TEST_F(S3FaultTest, MultipartRetriesPartsAndAbortsOnFailure) {
  S3Options o = Options();
  o.part_size = 5 << 20;
  o.multipart_threshold = 5 << 20;
  o.parallelism = 1;  // parts in order, so that request numbers are predictable
  std::unique_ptr<S3Store> s = Open(o);
  ASSERT_NE(s, nullptr);
  std::vector<uint8_t> data = Pattern((12 << 20) + 1);  // 3 parts

  // Request 1 starts the upload, 2 is part 1; parts 2's first two attempts fail.
  proxy_->FailNextRequests(2, /*skip=*/2);
  ASSERT_TRUE(s->Put("mp/ok", data).ok());
  EXPECT_EQ(proxy_->faults_injected(), 2);
  EXPECT_EQ(direct_->Size("mp/ok").value(), data.size());

  // With one attempt, a failing part fails the upload, which is aborted.
  o.max_attempts = 1;
  std::unique_ptr<S3Store> once = Open(o);
  ASSERT_NE(once, nullptr);
  proxy_->FailNextRequests(1, /*skip=*/2);
  Status st = once->Put("mp/failed", data);
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.message(), "part 2 of 3")) << st.message();
  EXPECT_EQ(direct_->Size("mp/failed").status().code(), ErrorCode::kNotFound);
  size_t left = 99;
  ASSERT_TRUE(direct_->AbortStaleUploads(std::chrono::seconds(0), &left).ok());
  EXPECT_EQ(left, 0u);  // the failed upload was already aborted
}

TEST_F(S3FaultTest, ConditionalPutRetriedAfterItLandedReportsTheAmbiguity) {
  // The server applies the PUT, but its answer is cut: the retry then meets
  // the object it created itself, and the conflict says so.
  S3Options o = Options();
  o.conditional_put_precheck = false;
  std::unique_ptr<S3Store> raw = Open(o);
  ASSERT_NE(raw, nullptr);
  proxy_->ResetNextRequests(1, /*after_response_bytes=*/5);
  Result<std::string> r = raw->PutIfUnchanged("manifest.json", std::vector<ByteSpan>{Span("mine")}, std::nullopt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kConflict);
  EXPECT_TRUE(Contains(r.status().message(), "earlier attempt")) << r.status().message();
}

}  // namespace
}  // namespace deltasync::testing
