// S3Store against a real S3 server (Ceph RGW from scripts/start-rgw.sh): the
// Store conformance suite, then what is S3's own: multipart uploads, ranged
// parallel downloads, conditional writes, bucket errors, credentials.
// Skipped without AWS_ENDPOINT_URL; the server-free parts are in
// s3_signer_test.cc and s3_config_test.cc.
#include <gtest/gtest.h>

#include <thread>

#include "deltasync/s3_store.h"
#include "store/s3_client.h"
#include "store/store_conformance.h"
#include "testing/fault_proxy.h"
#include "testing/s3_test_env.h"
#include "testing/test_bytes.h"

namespace deltasync::testing {
namespace {

using testing::Span;
using testing::Str;

bool Contains(const std::string& s, std::string_view needle) { return s.find(needle) != std::string::npos; }
std::vector<ByteSpan> One(std::string_view s) { return {Span(s)}; }

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> out(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<uint8_t>(x >> 24);
  }
  return out;
}

// --- The conformance suite, one fresh bucket per test. Instantiated only
// when a server is configured when the binary starts (a parameterised test
// cannot skip from its factory).
std::vector<StoreFactory> S3Factories() {
  std::optional<S3TestServer> server = FindS3TestServer();
  if (!server) return {};
  return {StoreFactory{"S3", [server] {
                         return std::shared_ptr<Store>(MakeTestBucket(*server, S3TestOptions(*server), "conf"));
                       }},
          StoreFactory{"S3Prefixed", [server] {
                         return std::shared_ptr<Store>(
                             MakeTestBucket(*server, S3TestOptions(*server), "confp", "runs/exp1"));
                       }}};
}
INSTANTIATE_TEST_SUITE_P(S3, StoreConformanceTest, ::testing::ValuesIn(S3Factories()), StoreFactoryName);

class S3StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::optional<S3TestServer> s = FindS3TestServer();
    if (!s) GTEST_SKIP() << kNoS3Reason;
    server_ = *s;
  }
  S3Options Options() const { return S3TestOptions(server_); }
  S3TestServer server_;
};

TEST_F(S3StoreTest, MultipartUploadWithUnevenPartsAcrossSpans) {
  S3Options o = Options();
  o.part_size = 5 << 20;           // S3's minimum part size
  o.multipart_threshold = 5 << 20;
  o.parallelism = 4;
  std::shared_ptr<S3Store> store = MakeTestBucket(server_, o, "mp");
  ASSERT_NE(store, nullptr);
  // 23 MiB + 5 bytes in spans whose boundaries fall inside parts: 5 parts,
  // the last 3 MiB + 5 bytes.
  std::vector<uint8_t> data = Pattern((23u << 20) + 5, 7);
  std::vector<ByteSpan> spans = {ByteSpan(data.data(), 1), ByteSpan(data.data() + 1, (7u << 20) + 3),
                                 ByteSpan(), ByteSpan(data.data() + (7u << 20) + 4, data.size() - (7u << 20) - 4)};
  ASSERT_TRUE(store->Put("anchors/big.safetensors", spans).ok());
  EXPECT_EQ(store->Size("anchors/big.safetensors").value(), data.size());

  // Downloaded as one ranged GET plus parallel ones of 5 MiB.
  Result<Blob> got = store->Get("anchors/big.safetensors");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), data.size());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), got->data()));

  // A range across several chunks, and one at the very end.
  Result<Blob> mid = store->GetRange("anchors/big.safetensors", (3u << 20) + 11, 12u << 20);
  ASSERT_TRUE(mid.ok()) << mid.status().ToString();
  EXPECT_TRUE(std::equal(mid->data(), mid->data() + mid->size(), data.begin() + (3u << 20) + 11));
  EXPECT_EQ(Str(store->GetRange("anchors/big.safetensors", data.size() - 5, 5).value()),
            std::string(data.end() - 5, data.end()));
  Result<Blob> past = store->GetRange("anchors/big.safetensors", data.size() - 5, 6);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), ErrorCode::kInvalidArgument);

  // Nothing left behind.
  size_t aborted = 99;
  ASSERT_TRUE(store->AbortStaleUploads(std::chrono::seconds(0), &aborted).ok());
  EXPECT_EQ(aborted, 0u);
}

TEST_F(S3StoreTest, LargeObjectDownloadsIntoOneBuffer) {
  // Above 64 MiB the download buffer is pre-populated from several threads.
  S3Options o = Options();
  o.part_size = 8 << 20;
  o.multipart_threshold = 8 << 20;
  std::shared_ptr<S3Store> store = MakeTestBucket(server_, o, "large");
  ASSERT_NE(store, nullptr);
  std::vector<uint8_t> data = Pattern((70u << 20) + 12345, 11);
  ASSERT_TRUE(store->Put("anchors/step_000010.safetensors", data).ok());
  Result<Store::Versioned> got = store->GetVersioned("anchors/step_000010.safetensors");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->blob.size(), data.size());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), got->blob.data()));
  EXPECT_FALSE(got->token.empty());
  ASSERT_TRUE(store->Delete("anchors/step_000010.safetensors").ok());
}

// Downloads reuse the pages of released ones (S3Options::download_pool_bytes):
// the second download of a large object lands in the first one's pages, and
// its bytes are exactly the object's (a stale byte would show).
TEST_F(S3StoreTest, DownloadsReuseReleasedPages) {
  S3Options o = Options();
  o.part_size = 8 << 20;
  o.multipart_threshold = 8 << 20;
  o.download_pool_bytes = 256u << 20;
  std::shared_ptr<S3Store> store = MakeTestBucket(server_, o, "pool");
  ASSERT_NE(store, nullptr);
  ASSERT_NE(store->download_pool(), nullptr);
  const std::vector<uint8_t> a = Pattern((40u << 20) + 777, 21), b = Pattern((36u << 20) + 5, 22);
  ASSERT_TRUE(store->Put("a", a).ok());
  ASSERT_TRUE(store->Put("b", b).ok());
  const uint8_t* first_pages = nullptr;
  {
    Result<Blob> got = store->Get("a");
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->size(), a.size());
    EXPECT_TRUE(std::equal(a.begin(), a.end(), got->data()));
    first_pages = got->data();
    EXPECT_EQ(store->download_pool()->held_bytes(), 0u);  // in use
  }
  EXPECT_GE(store->download_pool()->held_bytes(), a.size());  // released: held for reuse
  Result<Blob> again = store->Get("b");  // a smaller object: the same pages, overwritten
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->data(), first_pages);
  ASSERT_EQ(again->size(), b.size());
  EXPECT_TRUE(std::equal(b.begin(), b.end(), again->data()));
  // Steady state: downloads one after another, each released before the
  // next, every one exact (the growth onto held pages moves the first
  // part's pages in and the displaced ones out, for the next first part).
  again = Blob();
  for (int round = 0; round < 3; ++round) {
    for (const auto& [key, want] : {std::pair{"a", &a}, std::pair{"b", &b}}) {
      Result<Blob> got = store->Get(key);
      ASSERT_TRUE(got.ok()) << key << " round " << round << ": " << got.status().ToString();
      ASSERT_EQ(got->size(), want->size());
      EXPECT_TRUE(std::equal(want->begin(), want->end(), got->data())) << key << " round " << round;
    }
  }
  EXPECT_LE(store->download_pool()->held_bytes(), o.download_pool_bytes);
  // Without a pool every download gets fresh pages.
  o.download_pool_bytes = 0;
  std::shared_ptr<S3Store> plain = MakeTestBucket(server_, o, "nopool");
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->download_pool(), nullptr);
  ASSERT_TRUE(store->Delete("a").ok());
  ASSERT_TRUE(store->Delete("b").ok());
}

TEST_F(S3StoreTest, SignedPayloadIsAcceptedAndChecked) {
  S3Options o = Options();
  o.sign_payload = true;
  std::shared_ptr<S3Store> store = MakeTestBucket(server_, o, "sig");
  ASSERT_NE(store, nullptr);
  std::vector<uint8_t> data = Pattern(300000, 3);
  ASSERT_TRUE(store->Put("k", data).ok());
  EXPECT_EQ(store->Get("k")->size(), data.size());
}

TEST_F(S3StoreTest, AbortStaleUploadsOnlyUnderThePrefixAndOnlyOldOnes) {
  std::shared_ptr<S3Store> store = MakeTestBucket(server_, Options(), "gc", "mine");
  ASSERT_NE(store, nullptr);
  // What a publisher killed mid-upload leaves: started, never completed.
  Result<s3::ResolvedConfig> rc = s3::ResolveConfig(Options(), store->bucket(), s3::ProcessEnvironment());
  ASSERT_TRUE(rc.ok());
  s3::S3Client raw(*rc, store->bucket(), "");
  for (const char* key : {"mine/anchors/a", "mine/deltas/b", "other/c"}) {
    s3::S3Call init("POST", key);
    init.query = {{"uploads", ""}};
    ASSERT_TRUE(raw.Send(init).ok()) << key;
  }
  size_t aborted = 0;
  ASSERT_TRUE(store->AbortStaleUploads(std::chrono::hours(1), &aborted).ok());
  EXPECT_EQ(aborted, 0u);  // all younger than an hour
  ASSERT_TRUE(store->AbortStaleUploads(std::chrono::seconds(0), &aborted).ok());
  EXPECT_EQ(aborted, 2u);  // "other/" is not ours
  ASSERT_TRUE(store->AbortStaleUploads(std::chrono::seconds(0), &aborted).ok());
  EXPECT_EQ(aborted, 0u);
}

TEST_F(S3StoreTest, ConditionalPutsAreEnforcedByTheServer) {
  // Without the HEAD pre-check, so that only If-Match / If-None-Match guard.
  S3Options o = Options();
  o.conditional_put_precheck = false;
  std::shared_ptr<S3Store> store = MakeTestBucket(server_, o, "cas");
  ASSERT_NE(store, nullptr);
  std::vector<ByteSpan> v1 = One("manifest v1");
  Result<std::string> t1 = store->PutIfUnchanged("manifest.json", v1, std::nullopt);
  ASSERT_TRUE(t1.ok()) << t1.status().ToString();

  // If-None-Match: * on an existing object.
  Result<std::string> again = store->PutIfUnchanged("manifest.json", v1, std::nullopt);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), ErrorCode::kConflict) << again.status().ToString();

  Result<Store::Versioned> cur = store->GetVersioned("manifest.json");
  ASSERT_TRUE(cur.ok());
  EXPECT_EQ(cur->token, *t1);
  EXPECT_EQ(Str(cur->blob), "manifest v1");

  // If-Match with the current ETag succeeds; with a stale one it is a conflict.
  std::vector<ByteSpan> v2 = {Span("manifest "), Span("v2")};
  Result<std::string> t2 = store->PutIfUnchanged("manifest.json", v2, *t1);
  ASSERT_TRUE(t2.ok()) << t2.status().ToString();
  EXPECT_NE(*t2, *t1);
  Result<std::string> stale = store->PutIfUnchanged("manifest.json", One("lost update"), *t1);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), ErrorCode::kConflict);
  EXPECT_EQ(Str(store->Get("manifest.json").value()), "manifest v2");
  Result<std::string> t3 = store->PutIfUnchanged("manifest.json", One("manifest v3"), *t2);
  ASSERT_TRUE(t3.ok()) << t3.status().ToString();
  EXPECT_EQ(store->GetVersioned("manifest.json")->token, *t3);
}

TEST_F(S3StoreTest, ConditionalPutPrecheckReportsTheCurrentState) {
  std::shared_ptr<S3Store> store = MakeTestBucket(server_, Options(), "pre");
  ASSERT_NE(store, nullptr);
  Result<std::string> t1 = store->PutIfUnchanged("m", One("a"), std::nullopt);
  ASSERT_TRUE(t1.ok());
  ASSERT_TRUE(store->Put("m", Span("someone else")).ok());
  Result<std::string> r = store->PutIfUnchanged("m", One("b"), *t1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kConflict);
  EXPECT_TRUE(Contains(r.status().message(), "changed by another writer")) << r.status().message();
  ASSERT_TRUE(store->Delete("m").ok());
  r = store->PutIfUnchanged("m", One("b"), *t1);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "found no object")) << r.status().message();
}

TEST_F(S3StoreTest, ConcurrentConditionalWritersOneWins) {
  std::shared_ptr<S3Store> store = MakeTestBucket(server_, Options(), "race");
  ASSERT_NE(store, nullptr);
  Result<std::string> base = store->PutIfUnchanged("manifest.json", One("v0"), std::nullopt);
  ASSERT_TRUE(base.ok());
  std::atomic<int> wins{0}, conflicts{0};
  std::vector<std::thread> writers;
  for (int i = 0; i < 6; ++i) {
    writers.emplace_back([&, i] {
      std::string body = "writer " + std::to_string(i);
      Result<std::string> r = store->PutIfUnchanged("manifest.json", One(body), *base);
      (r.ok() ? wins : conflicts).fetch_add(1);
      if (!r.ok()) EXPECT_EQ(r.status().code(), ErrorCode::kConflict) << r.status().ToString();
    });
  }
  for (std::thread& t : writers) t.join();
  EXPECT_EQ(wins.load(), 1);
  EXPECT_EQ(conflicts.load(), 5);
}

TEST_F(S3StoreTest, MissingBucketIsNamed) {
  std::string bucket = UniqueBucketName("missing");
  Result<std::unique_ptr<S3Store>> r = S3Store::Open("s3://" + bucket + "/p", Options());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(Contains(r.status().message(), "bucket '" + bucket + "' does not exist")) << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "--create-bucket"));

  S3Options create = Options();
  create.create_bucket = true;
  r = S3Store::Open("s3://" + bucket + "/p", create);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->Describe(), "s3://" + bucket + "/p");
  ASSERT_TRUE((*r)->CreateBucket().ok());  // already ours: fine
  r->reset();
  RemoveBucket(server_, bucket);
}

TEST_F(S3StoreTest, MissingObjectNamesBucketAndKey) {
  std::shared_ptr<S3Store> store = MakeTestBucket(server_, Options(), "nokey", "pre");
  ASSERT_NE(store, nullptr);
  Result<Blob> r = store->Get("deltas/step_000007.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(Contains(r.status().message(), "s3://" + store->bucket() + "/pre/deltas/step_000007.safetensors"))
      << r.status().message();
  EXPECT_TRUE(Contains(r.status().message(), "NoSuchKey")) << r.status().message();
  EXPECT_EQ(store->Size("nope").status().code(), ErrorCode::kNotFound);
}

TEST_F(S3StoreTest, WrongSecretIsNotRetriedAndNotPrinted) {
  if (server_.loopback_port == 0) GTEST_SKIP() << "needs an http://127.0.0.1 endpoint for the proxy";
  std::shared_ptr<S3Store> good = MakeTestBucket(server_, Options(), "auth");
  ASSERT_NE(good, nullptr);
  std::string error;
  std::unique_ptr<FaultProxy> proxy = FaultProxy::Start(server_.loopback_port, &error);
  ASSERT_NE(proxy, nullptr) << error;

  S3Options bad = Options();
  bad.endpoint = proxy->endpoint();
  bad.secret_key = "WRONG" + server_.secret_key.substr(5) + "zz";
  Result<std::unique_ptr<S3Store>> r = S3Store::Open("s3://" + good->bucket(), bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(proxy->requests(), 1);  // a 403 is final
  const std::string msg = r.status().message();
  EXPECT_TRUE(Contains(msg, "403")) << msg;
  EXPECT_TRUE(Contains(msg, good->bucket())) << msg;
  EXPECT_TRUE(Contains(msg, "credentials from S3Options")) << msg;
  EXPECT_FALSE(Contains(msg, bad.secret_key)) << msg;
  EXPECT_FALSE(Contains(msg, server_.secret_key)) << msg;

  // An object request has an error body: its S3 code is in the message.
  Result<s3::ResolvedConfig> rc = s3::ResolveConfig(bad, good->bucket(), s3::ProcessEnvironment());
  ASSERT_TRUE(rc.ok());
  s3::S3Client client(*rc, good->bucket(), "");
  s3::S3Call get("GET", "some/key");
  s3::HttpResponse resp = client.Send(get);
  EXPECT_EQ(resp.status, 403);
  EXPECT_EQ(resp.attempts, 1);
  Status st = client.Error(get, resp);
  EXPECT_TRUE(Contains(st.message(), "SignatureDoesNotMatch")) << st.message();
  EXPECT_TRUE(Contains(st.message(), "s3://" + good->bucket() + "/some/key")) << st.message();
  EXPECT_FALSE(Contains(st.message(), bad.secret_key));
}

TEST_F(S3StoreTest, VirtualHostedAddressing) {
  if (server_.loopback_port == 0) GTEST_SKIP() << "needs the local RGW (rgw dns name = localhost)";
  std::shared_ptr<S3Store> store = MakeTestBucket(server_, Options(), "vhost");
  ASSERT_NE(store, nullptr);
  S3Options o = Options();
  o.endpoint = "http://localhost:" + std::to_string(server_.loopback_port);
  o.addressing = S3Addressing::kVirtualHosted;
  Result<std::unique_ptr<S3Store>> v = S3Store::Open("s3://" + store->bucket() + "/vh", o);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(Contains((*v)->EndpointDescription(), "virtual-hosted"));
  ASSERT_TRUE((*v)->Put("x/y.bin", Span("virtual")).ok());
  EXPECT_EQ(Str((*v)->Get("x/y.bin").value()), "virtual");
  EXPECT_EQ((*v)->List("").value(), std::vector<std::string>{"x/y.bin"});
  // The same object, seen path-style.
  EXPECT_EQ(Str(store->Get("vh/x/y.bin").value()), "virtual");
}

TEST_F(S3StoreTest, KeysThatNeedEscaping) {
  std::shared_ptr<S3Store> store = MakeTestBucket(server_, Options(), "esc", "p q");
  ASSERT_NE(store, nullptr);
  std::vector<std::string> keys = {"a b+c&d'e\"f<g>.bin", "%41%2F=?#", "\xC3\xBCn\xC3\xAF/\xE1\x88\xB4.bin",
                                   "~tilde/.dot/x", "semi;colon,comma"};
  for (const std::string& k : keys) ASSERT_TRUE(store->Put(k, Span(k)).ok()) << k;
  std::vector<std::string> want = keys;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(store->List("").value(), want);
  for (const std::string& k : keys) EXPECT_EQ(Str(store->Get(k).value()), k) << k;
  EXPECT_EQ(store->List("a b").value(), std::vector<std::string>{keys[0]});
}

TEST_F(S3StoreTest, ListingPagesThroughContinuationTokens) {
  std::shared_ptr<S3Store> store = MakeTestBucket(server_, Options(), "page");
  ASSERT_NE(store, nullptr);
  constexpr int kKeys = 1010;  // more than one 1000-key page
  std::vector<std::thread> workers;
  std::atomic<int> failures{0};
  for (int w = 0; w < 8; ++w) {
    workers.emplace_back([&, w] {
      for (int i = w; i < kKeys; i += 8) {
        char key[32];
        std::snprintf(key, sizeof key, "k/%05d", i);
        if (!store->Put(key, Span("x")).ok()) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& t : workers) t.join();
  ASSERT_EQ(failures.load(), 0);
  Result<std::vector<std::string>> all = store->List("k/");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), static_cast<size_t>(kKeys));
  EXPECT_EQ(all->front(), "k/00000");
  EXPECT_EQ(all->back(), "k/01009");
}

}  // namespace
}  // namespace deltasync::testing
