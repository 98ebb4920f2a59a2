// Session 49: the S3 faults session 48's review left open, made exact or
// loud. A small bucket behind ScriptedS3 (tests/testing/scripted_s3.h) that,
// unlike s3_review_test.cc's, gives the ETags AWS, Ceph RGW and MinIO give:
// the MD5 of a single PUT's bytes, and for a multipart upload the MD5 of its
// parts' binary MD5s, "-N".
//  - CompleteMultipartUpload answered NoSuchUpload after a retry counts as
//    done only when the object at the key has this upload's ETag;
//  - a conditional PUT answered without an ETag takes the token of a HEAD only
//    when that ETag is the MD5 of the bytes written;
//  - listings read keys and tokens inside CDATA sections as written, and a
//    page that cannot be read whole is an error, never a shorter list.
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <memory>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "deltasync/s3_store.h"
#include "store/s3_signer.h"
#include "store/s3_xml.h"
#include "testing/s3_test_env.h"
#include "testing/scripted_s3.h"
#include "testing/test_bytes.h"

namespace deltasync {
namespace {

using testing::Span;
using testing::Str;

using testing::HttpReply;
using testing::S3ErrorReply;
using testing::ScriptedReply;
using testing::ScriptedRequest;
using testing::ScriptedS3;

constexpr uint64_t kPart = 5ull << 20;  // S3Store's smallest part size

std::string Pattern(size_t n, uint32_t seed) { return testing::Pattern<std::string>(n, seed); }

Result<std::string> PutIfUnchanged(S3Store& store, std::string_view key, std::string_view bytes,
                                   const std::optional<std::string>& token) {
  ByteSpan span = Span(bytes);
  return store.PutIfUnchanged(key, std::span<const ByteSpan>(&span, 1), token);
}

std::string Md5(std::string_view bytes) {
  ByteSpan span = Span(bytes);
  return s3::Md5Hex(std::span<const ByteSpan>(&span, 1), 0, bytes.size());
}

// AWS's multipart ETag, written out independently of the store's.
std::string MultipartETag(const std::vector<std::string>& parts) {
  std::string digests;
  for (const std::string& p : parts) {
    std::string hex = Md5(p);
    for (size_t i = 0; i < hex.size(); i += 2) digests += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return "\"" + Md5(digests) + "-" + std::to_string(parts.size()) + "\"";
}

// An in-memory bucket "bkt" with MD5 ETags; `misbehave` answers first.
class Md5Bucket {
 public:
  struct Object {
    std::string bytes;
    std::string etag;  // quoted
  };
  std::function<std::optional<ScriptedReply>(const ScriptedRequest&, const std::string& key)> misbehave;
  bool opaque_part_etags = false;  // part ETags that are not MD5s (as with SSE-KMS)
  bool put_etags = true;           // false: a PUT's 200 carries no ETag

  void Set(const std::string& key, std::string bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string etag = "\"" + Md5(bytes) + "\"";
    objects_[key] = Object{std::move(bytes), etag};
  }
  std::optional<Object> Find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(key);
    if (it == objects_.end()) return std::nullopt;
    return it->second;
  }
  // Completes the upload of `key` as S3 would; false when there is none.
  bool Complete(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto up = uploads_.find(key);
    if (up == uploads_.end()) return false;
    std::vector<std::string> parts;
    std::string all;
    for (const auto& [n, bytes] : up->second) {
      parts.push_back(bytes);
      all += bytes;
    }
    std::string etag = opaque_part_etags ? "\"k" + std::to_string(parts.size()) + "-" + std::to_string(parts.size()) + "\""
                                         : MultipartETag(parts);
    objects_[key] = Object{std::move(all), etag};
    uploads_.erase(up);
    return true;
  }
  void DropUpload(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    uploads_.erase(key);
  }

  ScriptedReply Handle(const ScriptedRequest& r) {
    std::string key = r.path.size() > 5 ? r.path.substr(5) : "";  // "/bkt/KEY" (plain keys only)
    if (misbehave) {
      if (std::optional<ScriptedReply> reply = misbehave(r, key)) return *reply;
    }
    if (key.empty()) return r.method == "HEAD" ? HttpReply(200) : S3ErrorReply(400, "InvalidRequest");
    bool uploads = false, upload_id = false;
    r.Query("uploads", &uploads);
    r.Query("uploadId", &upload_id);
    if (r.method == "POST" && uploads) {
      std::lock_guard<std::mutex> lock(mu_);
      uploads_[key] = {};
      return HttpReply(200, {}, "<InitiateMultipartUploadResult><UploadId>u-" + key +
                                    "</UploadId></InitiateMultipartUploadResult>");
    }
    if (upload_id && r.method == "POST") {
      return Complete(key) ? HttpReply(200, {}, "<CompleteMultipartUploadResult></CompleteMultipartUploadResult>")
                           : S3ErrorReply(404, "NoSuchUpload");
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (upload_id) {
      auto up = uploads_.find(key);
      if (up == uploads_.end()) return S3ErrorReply(404, "NoSuchUpload");
      if (r.method == "DELETE") {
        uploads_.erase(up);
        return HttpReply(204);
      }
      up->second[std::stoi(r.Query("partNumber"))] = r.body;
      return HttpReply(200, {{"ETag", opaque_part_etags ? "\"p" + r.Query("partNumber") + "\"" : "\"" + Md5(r.body) + "\""}});
    }
    auto it = objects_.find(key);
    if (r.method == "PUT") {
      if (r.Header("if-none-match") == "*" && it != objects_.end()) return S3ErrorReply(412, "PreconditionFailed");
      if (!r.Header("if-match").empty() && (it == objects_.end() || it->second.etag != r.Header("if-match"))) {
        return S3ErrorReply(412, "PreconditionFailed");
      }
      objects_[key] = Object{r.body, "\"" + Md5(r.body) + "\""};
      if (!put_etags) return HttpReply(200);
      return HttpReply(200, {{"ETag", objects_[key].etag}});
    }
    if (it == objects_.end()) return S3ErrorReply(404, "NoSuchKey");
    const Object& o = it->second;
    if (r.method == "HEAD") return HttpReply(200, {{"ETag", o.etag}, {"Content-Length", std::to_string(o.bytes.size())}});
    return HttpReply(200, {{"ETag", o.etag}}, o.bytes);
  }

 private:
  std::mutex mu_;
  std::map<std::string, Object> objects_;
  std::map<std::string, std::map<int, std::string>> uploads_;
};

class S3Review2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    server_ = ScriptedS3::Start([this](const ScriptedRequest& r) { return bucket_.Handle(r); }, &error);
    ASSERT_NE(server_, nullptr) << error;
  }
  std::unique_ptr<S3Store> Open() {
    S3Options o;
    o.endpoint = server_->endpoint();
    o.region = "us-east-1";
    o.access_key = "AKIDEXAMPLE";
    o.secret_key = "secret";
    o.addressing = S3Addressing::kPath;
    o.read_environment = false;
    o.part_size = kPart;
    o.multipart_threshold = kPart;
    o.parallelism = 2;
    o.max_attempts = 3;
    o.backoff_base = std::chrono::milliseconds(1);
    o.backoff_max = std::chrono::milliseconds(5);
    o.download_pool_bytes = 0;
    Result<std::unique_ptr<S3Store>> r = S3Store::Open("s3://bkt", o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  // A misbehaviour for CompleteMultipartUpload of `key`: the first attempt
  // is answered 500 after `first` ran (it may complete the upload, or let a
  // racing gc abort it); the retry goes to the honest bucket.
  void FirstCompleteFails(const std::string& key, std::function<void()> first) {
    bucket_.misbehave = [this, key, first, done = std::make_shared<std::atomic<bool>>(false)](
                            const ScriptedRequest& r, const std::string& k) -> std::optional<ScriptedReply> {
      bool upload_id = false;
      r.Query("uploadId", &upload_id);
      if (k != key || r.method != "POST" || !upload_id || done->exchange(true)) return std::nullopt;
      first();
      return S3ErrorReply(500, "InternalError");
    };
  }

  Md5Bucket bucket_;
  std::unique_ptr<ScriptedS3> server_;
};

TEST(S3Md5, KnownVectors) {
  EXPECT_EQ(Md5(""), "d41d8cd98f00b204e9800998ecf8427e");
  EXPECT_EQ(Md5("abc"), "900150983cd24fb0d6963f7d28e17f72");
}

// Fault 1: the upload was aborted between the attempts (a racing `gc
// --abort-uploads-older-than`) while an older object of the same size sits at
// the key. The same size is not the same bytes: the Put must fail.
TEST_F(S3Review2Test, NoSuchUploadAfterARetryOverAnotherObjectOfTheSameSizeFails) {
  std::string old_bytes = Pattern(2 * kPart + 99, 1), new_bytes = Pattern(2 * kPart + 99, 2);
  bucket_.Set("big", old_bytes);
  FirstCompleteFails("big", [this] { bucket_.DropUpload("big"); });
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Status st = store->Put("big", Span(new_bytes));
  ASSERT_FALSE(st.ok()) << "an older object of the same size was counted as this upload";
  EXPECT_EQ(st.code(), ErrorCode::kIOError) << st.ToString();
  EXPECT_NE(st.message().find("NoSuchUpload after a retry"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("another one"), std::string::npos) << st.message();
  EXPECT_TRUE(bucket_.Find("big")->bytes == old_bytes);
}

// The same with no object left at the key: an error (it was kNotFound).
TEST_F(S3Review2Test, NoSuchUploadAfterARetryWithNoObjectFails) {
  std::string bytes = Pattern(2 * kPart + 5, 3);
  FirstCompleteFails("big", [this] { bucket_.DropUpload("big"); });
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Status st = store->Put("big", Span(bytes));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kIOError) << st.ToString();
  EXPECT_FALSE(bucket_.Find("big").has_value());
}

// The first attempt completed the upload and only its answer was lost: the
// object's ETag is this upload's, so the Put succeeded (as before).
TEST_F(S3Review2Test, NoSuchUploadAfterARetryOverThisUploadSucceeds) {
  std::string bytes = Pattern(3 * kPart + 1234, 4);
  FirstCompleteFails("big", [this] { ASSERT_TRUE(bucket_.Complete("big")); });
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Status st = store->Put("big", Span(bytes));
  ASSERT_TRUE(st.ok()) << st.ToString();
  Result<Blob> got = store->Get("big");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(Str(*got) == bytes);
}

// Part ETags that are not MD5s (SSE-KMS): this upload's ETag cannot be
// computed, so even the upload's own object cannot be proven: loud.
TEST_F(S3Review2Test, NoSuchUploadAfterARetryWithPartETagsThatAreNotMd5sFails) {
  bucket_.opaque_part_etags = true;
  std::string bytes = Pattern(2 * kPart + 7, 5);
  FirstCompleteFails("big", [this] { ASSERT_TRUE(bucket_.Complete("big")); });
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Status st = store->Put("big", Span(bytes));
  ASSERT_FALSE(st.ok()) << "an object that cannot be proven to be this upload was counted as written";
  EXPECT_EQ(st.code(), ErrorCode::kIOError) << st.ToString();
  EXPECT_NE(st.message().find("not MD5s"), std::string::npos) << st.message();
}

// Fault 2: a conditional PUT answered 200 without an ETag, and another writer
// replaced the object before the HEAD that would stand in for it: the token
// would be the other writer's ETag, and the next compare-and-swap would
// overwrite its object. Loud instead.
TEST_F(S3Review2Test, AConditionalPutWithoutAnETagIsNotGivenAnotherWritersToken) {
  bucket_.put_etags = false;
  std::string ours = "manifest of writer A", theirs = "manifest of writer B";
  std::atomic<bool> raced{false};
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string& key) -> std::optional<ScriptedReply> {
    if (key == "manifest.json" && r.method == "HEAD" && bucket_.Find(key) && !raced.exchange(true)) {
      bucket_.Set(key, theirs);  // writer B, just after A's PUT
    }
    return std::nullopt;
  };
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Result<std::string> token = PutIfUnchanged(*store, "manifest.json", ours, std::nullopt);
  ASSERT_TRUE(raced);
  ASSERT_FALSE(token.ok()) << "the token returned is writer B's (" << *token << ")";
  EXPECT_EQ(token.status().code(), ErrorCode::kIOError) << token.status().ToString();
  EXPECT_NE(token.status().message().find("did not return an ETag for a conditional write"), std::string::npos)
      << token.status().message();
}

// Without a race, the HEAD's ETag is the MD5 of our bytes: proven, accepted,
// and the token works for the next compare-and-swap.
TEST_F(S3Review2Test, AConditionalPutWithoutAnETagIsProvenByTheMd5OfItsBytes) {
  bucket_.put_etags = false;
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Result<std::string> token = PutIfUnchanged(*store, "manifest.json", "v1", std::nullopt);
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  EXPECT_EQ(*token, bucket_.Find("manifest.json")->etag);
  Result<std::string> next = PutIfUnchanged(*store, "manifest.json", "v2", *token);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(bucket_.Find("manifest.json")->bytes, "v2");
}

// Fault 3: listings with CDATA sections, comments, and pages that cannot be
// read whole.
class S3ListingTest : public S3Review2Test {
 protected:
  // Answers every listing with pages[token] (token "" first).
  void Pages(std::map<std::string, std::string> pages) {
    bucket_.misbehave = [pages = std::move(pages)](const ScriptedRequest& r,
                                                   const std::string& key) -> std::optional<ScriptedReply> {
      bool list = false;
      r.Query("list-type", &list);
      if (!key.empty() || r.method != "GET" || !list) return std::nullopt;
      auto it = pages.find(r.Query("continuation-token"));
      if (it == pages.end()) return S3ErrorReply(400, "InvalidArgument", "unknown token");
      return HttpReply(200, {{"Content-Type", "application/xml"}}, it->second);
    };
  }
  static std::string Page(std::string_view inner) {
    return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult>" + std::string(inner) +
           "</ListBucketResult>";
  }
};

TEST_F(S3ListingTest, KeysAndTokensInCdataAreReadAsWritten) {
  Pages({{"", Page("<IsTruncated>true</IsTruncated>"
                   "<Contents><Key><![CDATA[a&amp;b]]></Key></Contents>"
                   "<Contents><Key><![CDATA[c</Key><Key>d]]></Key></Contents>"
                   "<Contents><Key>e<![CDATA[&f]]>&amp;g</Key></Contents>"
                   "<NextContinuationToken><![CDATA[t<&>1]]></NextContinuationToken>")},
         {"t<&>1", Page("<IsTruncated>false</IsTruncated><Contents><Key><![CDATA[h]]]]><![CDATA[>]]></Key></Contents>")}});
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Result<std::vector<std::string>> keys = store->List("");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(*keys, (std::vector<std::string>{"a&amp;b", "c</Key><Key>d", "e&f&g", "h]]>"}));
}

TEST_F(S3ListingTest, ACommentIsNoEntry) {
  Pages({{"", Page("<IsTruncated>false</IsTruncated><!-- <Contents><Key>ghost</Key></Contents> -->"
                   "<Contents><Key>real</Key></Contents>")}});
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Result<std::vector<std::string>> keys = store->List("");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(*keys, (std::vector<std::string>{"real"}));
}

// A page that cannot be read whole never gives a shorter or a wrong list.
TEST_F(S3ListingTest, APageThatCannotBeReadWholeIsAnError) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a CDATA section that never ends",
       Page("<IsTruncated>false</IsTruncated><Contents><Key>a</Key></Contents>"
            "<Contents><Key><![CDATA[b</Key></Contents>")},
      {"a page cut short", "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a</Key></Contents>"
                           "<Contents><Key>b</Key>"},
      {"an entry without a key", Page("<IsTruncated>false</IsTruncated><Contents><Key>a</Key></Contents>"
                                      "<Contents><Size>3</Size></Contents>")},
  };
  for (const auto& [what, page] : cases) {
    SCOPED_TRACE(what);
    Pages({{"", page}});
    auto store = Open();
    ASSERT_NE(store, nullptr);
    Result<std::vector<std::string>> keys = store->List("");
    if (keys.ok()) {
      ADD_FAILURE() << "listed " << keys->size() << " keys";
      continue;
    }
    EXPECT_EQ(keys.status().code(), ErrorCode::kIOError) << keys.status().ToString();
  }
}

TEST(S3XmlCdata, ElementsAndTextAroundCdataCommentsAndInstructions) {
  std::string_view xml = "<?pi <A>x</A> ?><A><![CDATA[<A>1</A>]]></A><!-- <A>2</A> --><A>3<!--c-->4</A>";
  std::vector<std::string_view> all = s3::XmlElements(xml, "A");
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(s3::XmlUnescape(all[0]), "<A>1</A>");
  EXPECT_EQ(s3::XmlUnescape(all[1]), "34");
  EXPECT_EQ(s3::XmlUnescape("&lt;<![CDATA[&lt;]]>&gt;"), "<&lt;>");
  EXPECT_TRUE(s3::XmlElements("<A><![CDATA[x</A>", "A").empty());  // the section never ends
  EXPECT_EQ(s3::XmlText("<E><Code>SlowDown</Code></E>", "Code"), "SlowDown");
}

// The ETags both exact routes rely on, as a real server gives them (the RGW
// suite; skipped without AWS_ENDPOINT_URL): a single PUT's is the MD5 of its
// bytes, a multipart upload's the MD5 of its parts' MD5s, "-N".
TEST(S3Review2Rgw, TheServersETagsAreTheMd5sBothRoutesCompute) {
  std::optional<testing::S3TestServer> server = testing::FindS3TestServer();
  if (!server) GTEST_SKIP() << testing::kNoS3Reason;
  S3Options o = testing::S3TestOptions(*server);
  o.part_size = kPart;
  o.multipart_threshold = kPart;
  std::shared_ptr<S3Store> store = testing::MakeTestBucket(*server, o, "etag");
  ASSERT_NE(store, nullptr);
  std::string big = Pattern(4 * kPart + 5, 9);
  ASSERT_TRUE(store->Put("big", Span(big)).ok());
  Result<Store::Versioned> got = store->GetVersioned("big");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  std::vector<std::string> parts;
  for (uint64_t at = 0; at < big.size(); at += kPart) parts.push_back(big.substr(at, kPart));
  EXPECT_EQ(got->token, MultipartETag(parts));
  Result<std::string> token = PutIfUnchanged(*store, "small", "manifest", std::nullopt);
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  EXPECT_EQ(*token, "\"" + Md5("manifest") + "\"");
}

}  // namespace
}  // namespace deltasync
