// Session 48's adversarial review of S3Store against a server that lies:
// ScriptedS3 (tests/testing/scripted_s3.h) plays an in-memory bucket and,
// on cue, answers the way a buggy S3-compatible server, a proxy or a bad
// network would. Bit-exact or loud: every read returns the object's bytes
// exactly or an error; a write is either whole or not visible. No real S3
// server is needed.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "deltasync/s3_store.h"
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


std::string PercentDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string XmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '&') out += "&amp;";
    else if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else out += c;
  }
  return out;
}

// An honest in-memory bucket "bkt", unless `misbehave` answers first.
class FakeBucket {
 public:
  struct Object {
    std::string bytes;
    std::string etag;  // quoted
  };
  // Called first with the request and its object key ("" for the bucket);
  // an answer replaces the honest one.
  std::function<std::optional<ScriptedReply>(const ScriptedRequest&, const std::string& key)> misbehave;
  bool send_etags = true;

  void Set(const std::string& key, std::string bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    objects_[key] = Object{std::move(bytes), "\"e" + std::to_string(++etags_) + "\""};
  }
  std::optional<Object> Find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(key);
    if (it == objects_.end()) return std::nullopt;
    return it->second;
  }
  std::vector<std::string> put_paths() {
    std::lock_guard<std::mutex> lock(mu_);
    return put_paths_;
  }

  ScriptedReply Handle(const ScriptedRequest& r) {
    std::string key = r.path.size() > 5 ? PercentDecode(r.path.substr(5)) : "";  // "/bkt/KEY"
    if (misbehave) {
      if (std::optional<ScriptedReply> reply = misbehave(r, key)) return *reply;
    }
    if (key.empty()) {
      if (r.method == "HEAD") return HttpReply(200);
      bool list = false;
      r.Query("list-type", &list);
      if (r.method == "GET" && list) return List(r.Query("prefix"));
      return S3ErrorReply(400, "InvalidRequest");
    }
    std::lock_guard<std::mutex> lock(mu_);
    bool uploads = false, upload_id = false;
    r.Query("uploads", &uploads);
    std::string id = r.Query("uploadId", &upload_id);
    if (r.method == "POST" && uploads) {
      uploads_[key] = {};
      return HttpReply(200, {}, "<InitiateMultipartUploadResult><UploadId>u-" + key + "</UploadId></InitiateMultipartUploadResult>");
    }
    if (upload_id) {
      auto up = uploads_.find(key);
      if (up == uploads_.end()) return S3ErrorReply(404, "NoSuchUpload");
      if (r.method == "PUT") {
        up->second[std::stoi(r.Query("partNumber"))] = r.body;
        return HttpReply(200, {{"ETag", "\"p" + r.Query("partNumber") + "\""}});
      }
      if (r.method == "DELETE") {
        uploads_.erase(up);
        return HttpReply(204);
      }
      if (r.method == "POST") {
        std::string all;
        for (const auto& [n, bytes] : up->second) all += bytes;
        objects_[key] = Object{std::move(all), "\"m" + std::to_string(++etags_) + "-2\""};
        uploads_.erase(up);
        return HttpReply(200, {}, "<CompleteMultipartUploadResult><Key>" + XmlEscape(key) + "</Key></CompleteMultipartUploadResult>");
      }
    }
    auto it = objects_.find(key);
    if (r.method == "PUT") {
      put_paths_.push_back(r.path);
      if (r.Header("if-none-match") == "*" && it != objects_.end()) return S3ErrorReply(412, "PreconditionFailed");
      if (!r.Header("if-match").empty() && (it == objects_.end() || it->second.etag != r.Header("if-match"))) {
        return S3ErrorReply(412, "PreconditionFailed");
      }
      objects_[key] = Object{r.body, "\"e" + std::to_string(++etags_) + "\""};
      return HttpReply(200, {{"ETag", objects_[key].etag}});
    }
    if (r.method == "DELETE") {
      objects_.erase(key);
      return HttpReply(204);
    }
    if (it == objects_.end()) return S3ErrorReply(404, "NoSuchKey");
    const Object& o = it->second;
    std::vector<std::pair<std::string, std::string>> h;
    if (send_etags) h.emplace_back("ETag", o.etag);
    if (r.method == "HEAD") {
      h.emplace_back("Content-Length", std::to_string(o.bytes.size()));
      return HttpReply(200, h);
    }
    if (!r.Header("if-match").empty() && r.Header("if-match") != o.etag) return S3ErrorReply(412, "PreconditionFailed");
    unsigned long long a = 0, b = 0;
    if (std::sscanf(r.Header("range").c_str(), "bytes=%llu-%llu", &a, &b) == 2) {
      if (a >= o.bytes.size()) return S3ErrorReply(416, "InvalidRange");
      b = std::min<unsigned long long>(b, o.bytes.size() - 1);
      h.emplace_back("Content-Range", "bytes " + std::to_string(a) + "-" + std::to_string(b) + "/" +
                                          std::to_string(o.bytes.size()));
      return HttpReply(206, h, std::string_view(o.bytes).substr(a, b - a + 1));
    }
    return HttpReply(200, h, o.bytes);
  }

 private:
  ScriptedReply List(const std::string& prefix) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult><IsTruncated>false</IsTruncated>";
    for (const auto& [key, o] : objects_) {
      if (key.compare(0, prefix.size(), prefix) != 0) continue;
      xml += "<Contents><Key>" + XmlEscape(key) + "</Key><Size>" + std::to_string(o.bytes.size()) + "</Size></Contents>";
    }
    return HttpReply(200, {{"Content-Type", "application/xml"}}, xml + "</ListBucketResult>");
  }

  std::mutex mu_;
  std::map<std::string, Object> objects_;
  std::map<std::string, std::map<int, std::string>> uploads_;
  std::vector<std::string> put_paths_;
  int etags_ = 0;
};

class S3ReviewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    server_ = ScriptedS3::Start([this](const ScriptedRequest& r) { return bucket_.Handle(r); }, &error);
    ASSERT_NE(server_, nullptr) << error;
  }

  S3Options Options() const {
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
    return o;
  }
  std::unique_ptr<S3Store> Open(S3Options o) {
    Result<std::unique_ptr<S3Store>> r = S3Store::Open("s3://bkt", o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }
  std::unique_ptr<S3Store> Open() { return Open(Options()); }

  // The first byte a ranged GET asks for; -1 without a Range.
  static long long RangeStart(const ScriptedRequest& r) {
    unsigned long long a = 0;
    if (std::sscanf(r.Header("range").c_str(), "bytes=%llu-", &a) != 1) return -1;
    return static_cast<long long>(a);
  }

  FakeBucket bucket_;
  std::unique_ptr<ScriptedS3> server_;
};

TEST_F(S3ReviewTest, AnHonestServerRoundTrips) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  std::string big = Pattern(2 * kPart + 12345, 1);
  ASSERT_TRUE(store->Put("big", Span(big)).ok());
  Result<Blob> got = store->Get("big");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(Str(*got) == big);
  Result<Blob> range = store->GetRange("big", kPart - 10, kPart + 20);
  ASSERT_TRUE(range.ok()) << range.status().ToString();
  EXPECT_TRUE(Str(*range) == big.substr(kPart - 10, kPart + 20));
}

// A later range answered 206 with the right length but for another range
// (a caching proxy mixing up its entries): its Content-Range says so.
TEST_F(S3ReviewTest, ARangeAnsweredForAnotherRangeIsRefused) {
  std::string big = Pattern(2 * kPart + 1000, 2);
  bucket_.Set("big", big);
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string& key) -> std::optional<ScriptedReply> {
    long long start = RangeStart(r);
    if (key != "big" || r.method != "GET" || start <= 0) return std::nullopt;
    unsigned long long a = 0, b = 0;
    std::sscanf(r.Header("range").c_str(), "bytes=%llu-%llu", &a, &b);
    uint64_t n = b - a + 1;
    return HttpReply(206, {{"ETag", bucket_.Find("big")->etag},
                           {"Content-Range", "bytes 0-" + std::to_string(n - 1) + "/" + std::to_string(big.size())}},
                     std::string_view(big).substr(0, n));
  };
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Result<Blob> got = store->Get("big");
  ASSERT_FALSE(got.ok()) << "bytes of another range were stitched into the download";
  EXPECT_EQ(got.status().code(), ErrorCode::kIOError) << got.status().ToString();
  EXPECT_NE(got.status().message().find("Content-Range"), std::string::npos) << got.status().message();
}

// The first answer itself for another offset (checked since the start).
TEST_F(S3ReviewTest, AFirstAnswerForAnotherOffsetIsRefused) {
  std::string small = Pattern(1000, 3);
  bucket_.Set("small", small);
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string& key) -> std::optional<ScriptedReply> {
    if (key != "small" || r.method != "GET") return std::nullopt;
    return HttpReply(206, {{"ETag", "\"x\""}, {"Content-Range", "bytes 0-49/1000"}}, std::string_view(small).substr(0, 50));
  };
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Result<Blob> got = store->GetRange("small", 100, 50);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), ErrorCode::kIOError) << got.status().ToString();
}

// The object is replaced between the first range and the later ones, on a
// server that ignores If-Match on GET: the later ranges carry the new ETag.
// The download must start over (all new bytes), never mix the two.
TEST_F(S3ReviewTest, ARangeOfAReplacedObjectOnAServerIgnoringIfMatchRestarts) {
  std::string old_bytes = Pattern(2 * kPart + 777, 4), new_bytes = Pattern(2 * kPart + 777, 5);
  bucket_.Set("big", old_bytes);
  std::atomic<bool> replaced{false};
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string& key) -> std::optional<ScriptedReply> {
    if (key != "big" || r.method != "GET") return std::nullopt;
    if (RangeStart(r) > 0 && !replaced.exchange(true)) bucket_.Set("big", new_bytes);
    // Ignores If-Match: answers the honest way without it.
    ScriptedRequest without = r;
    without.headers.erase("if-match");
    FakeBucket::Object o = *bucket_.Find("big");
    unsigned long long a = 0, b = 0;
    std::sscanf(without.Header("range").c_str(), "bytes=%llu-%llu", &a, &b);
    b = std::min<unsigned long long>(b, o.bytes.size() - 1);
    return HttpReply(206, {{"ETag", o.etag}, {"Content-Range", "bytes " + std::to_string(a) + "-" + std::to_string(b) + "/" + std::to_string(o.bytes.size())}},
                     std::string_view(o.bytes).substr(a, b - a + 1));
  };
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Result<Blob> got = store->Get("big");
  ASSERT_TRUE(replaced.load());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(Str(*got) == new_bytes) << "a download stitched from two versions of the object";
}

// Every later range answered 412 (the object replaced after the first
// answer, again on every attempt): all parts of a round see it at once, on
// their own threads (session 53: each set the caller's flag through a plain
// bool*, a data race ThreadSanitizer reports). The download gives up after
// its rounds, never stitched.
TEST_F(S3ReviewTest, PartsThatAllSeeTheObjectReplacedAtOnceRetryThenFail) {
  bucket_.Set("big", Pattern(8 * kPart + 5, 8));
  std::atomic<int> refused{0};
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string& key) -> std::optional<ScriptedReply> {
    if (key != "big" || r.method != "GET" || r.Header("if-match").empty()) return std::nullopt;
    ++refused;
    return S3ErrorReply(412, "PreconditionFailed");
  };
  S3Options o = Options();
  o.parallelism = 8;
  auto store = Open(o);
  ASSERT_NE(store, nullptr);
  Result<Blob> got = store->Get("big");
  ASSERT_FALSE(got.ok()) << "a download whose every later range was refused";
  EXPECT_EQ(got.status().code(), ErrorCode::kIOError) << got.status().ToString();
  EXPECT_NE(got.status().message().find("replaced during each of 3 download attempts"), std::string::npos)
      << got.status().message();
  EXPECT_GE(refused.load(), 3);
}

// Without an ETag the ranges of a large object cannot be pinned to one
// version: never stitched unchecked, but read in one GET instead (one answer
// is one version of the object), the slower exact route. A small object (one
// GET) needs none.
TEST_F(S3ReviewTest, ALargeObjectWithoutAnETagIsReadInOneGet) {
  bucket_.send_etags = false;
  std::string big = Pattern(kPart + 10, 6), small = Pattern(100, 7);
  bucket_.Set("big", big);
  bucket_.Set("small", small);
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Result<Blob> s = store->Get("small");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_TRUE(Str(*s) == small);
  std::atomic<int> gets{0}, whole{0};
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string& key) -> std::optional<ScriptedReply> {
    if (key == "big" && r.method == "GET") {
      ++gets;
      if (r.Header("range").empty()) ++whole;
    }
    return std::nullopt;
  };
  Result<Blob> got = store->Get("big");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(Str(*got) == big);
  EXPECT_EQ(gets.load(), 2) << "the first range, then the whole object in one GET";
  EXPECT_EQ(whole.load(), 1);
  // Replaced between the two GETs: the one GET's answer is the new object,
  // whole (a later range from another version is not possible).
  std::string next = Pattern(kPart + 10, 9);
  gets = 0;
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string& key) -> std::optional<ScriptedReply> {
    if (key == "big" && r.method == "GET" && ++gets == 2) bucket_.Set("big", next);
    return std::nullopt;
  };
  got = store->Get("big");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(Str(*got) == next) << "a download stitched from two versions of the object";
  // A range of it (an offset and a length) in one GET too.
  bucket_.misbehave = nullptr;
  Result<Blob> part = store->GetRange("big", 5, kPart);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  EXPECT_TRUE(Str(*part) == next.substr(5, kPart));

  // An ETag on the first range only (a proxy stripping it from the others):
  // said so, not taken for an object replaced three times over.
  bucket_.send_etags = true;
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string& key) -> std::optional<ScriptedReply> {
    if (key != "big" || r.method != "GET" || RangeStart(r) <= 0) return std::nullopt;
    unsigned long long a = 0, b = 0;
    std::sscanf(r.Header("range").c_str(), "bytes=%llu-%llu", &a, &b);
    b = std::min<unsigned long long>(b, big.size() - 1);
    return HttpReply(206, {{"Content-Range", "bytes " + std::to_string(a) + "-" + std::to_string(b) + "/" + std::to_string(big.size())}},
                     std::string_view(big).substr(a, b - a + 1));
  };
  got = store->Get("big");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), ErrorCode::kIOError);
  EXPECT_NE(got.status().message().find("without an ETag"), std::string::npos) << got.status().message();
}

// A body cut short (the connection closes before Content-Length bytes) is
// retried from its start, for the first range and for a later one; the
// result is exact.
TEST_F(S3ReviewTest, ABodyCutShortIsRetriedAndTheBytesAreExact) {
  std::string big = Pattern(2 * kPart + 4321, 8);
  bucket_.Set("big", big);
  std::atomic<int> cut_first{0}, cut_later{0};
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string& key) -> std::optional<ScriptedReply> {
    if (key != "big" || r.method != "GET") return std::nullopt;
    long long start = RangeStart(r);
    std::atomic<int>& cut = start == 0 ? cut_first : cut_later;
    if (cut.fetch_add(1) != 0) return std::nullopt;
    FakeBucket::Object o = *bucket_.Find("big");
    unsigned long long a = 0, b = 0;
    std::sscanf(r.Header("range").c_str(), "bytes=%llu-%llu", &a, &b);
    b = std::min<unsigned long long>(b, o.bytes.size() - 1);
    ScriptedReply reply = HttpReply(206, {{"ETag", o.etag}, {"Content-Range", "bytes " + std::to_string(a) + "-" + std::to_string(b) + "/" + std::to_string(o.bytes.size())}},
                                    std::string_view(o.bytes).substr(a, b - a + 1));
    reply.raw.resize(reply.raw.size() - (b - a + 1) / 2);  // half the body, then the connection closes
    reply.close = true;
    return reply;
  };
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Result<Blob> got = store->Get("big");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(Str(*got) == big);
  EXPECT_GE(cut_first.load(), 2);
  EXPECT_GE(cut_later.load(), 2);
}

// Bytes beyond Content-Length (a server that sends the whole object after a
// ranged header) never make it into a result: each read is exact or fails.
TEST_F(S3ReviewTest, BytesBeyondContentLengthNeverReachAResult) {
  std::string a = Pattern(3000, 9), b = Pattern(3000, 10);
  bucket_.Set("a", a);
  bucket_.Set("b", b);
  std::atomic<int> n{0};
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string& key) -> std::optional<ScriptedReply> {
    if (key != "a" || r.method != "GET" || n.fetch_add(1) != 0) return std::nullopt;
    ScriptedReply reply = HttpReply(206, {{"ETag", "\"e1\""}, {"Content-Range", "bytes 0-2999/3000"}}, a);
    reply.raw += "HTTP/1.1 200 OK\r\nContent-Length: 3000\r\n\r\n" + b;  // a stray second answer
    return reply;
  };
  auto store = Open();
  ASSERT_NE(store, nullptr);
  int exact = 0;
  for (int i = 0; i < 3; ++i) {
    for (const auto& [key, bytes] : {std::pair<std::string, const std::string*>{"a", &a}, {"b", &b}}) {
      Result<Blob> got = store->Get(key);
      if (got.ok()) {
        EXPECT_TRUE(Str(*got) == *bytes) << key << " read " << i;
        exact += Str(*got) == *bytes;
      } else {
        EXPECT_EQ(got.status().code(), ErrorCode::kIOError) << got.status().ToString();
      }
    }
  }
  EXPECT_EQ(exact, 6) << "curl drops the stray bytes with the connection; every read is retried or exact";
}

// A listing whose continuation tokens go round in a circle (A -> B -> A)
// must fail, not loop or list keys twice.
TEST_F(S3ReviewTest, AListingWhoseTokensGoRoundInACircleFails) {
  std::atomic<int> pages{0};
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string& key) -> std::optional<ScriptedReply> {
    bool list = false;
    r.Query("list-type", &list);
    if (!key.empty() || !list) return std::nullopt;
    int page = pages.fetch_add(1);
    std::string token = r.Query("continuation-token");
    std::string next = token == "A" ? "B" : "A";
    bool truncated = page < 20;  // an old client would have looped forever
    std::string xml = "<ListBucketResult><IsTruncated>" + std::string(truncated ? "true" : "false") +
                      "</IsTruncated><Contents><Key>k" + std::to_string(page) + "</Key></Contents>" +
                      (truncated ? "<NextContinuationToken>" + next + "</NextContinuationToken>" : "") +
                      "</ListBucketResult>";
    return HttpReply(200, {}, xml);
  };
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Result<std::vector<std::string>> keys = store->List("");
  ASSERT_FALSE(keys.ok()) << keys->size() << " keys from a listing that went round in a circle";
  EXPECT_EQ(keys.status().code(), ErrorCode::kIOError);
  EXPECT_LE(pages.load(), 4);
}

// ListMultipartUploads markers that go round in a circle ((a,1) -> (b,2) ->
// (a,1)): `gc` must fail, not abort the same uploads again and again.
TEST_F(S3ReviewTest, AnUploadListingWhoseMarkersGoRoundInACircleFails) {
  std::atomic<int> pages{0};
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string& key) -> std::optional<ScriptedReply> {
    bool uploads = false, id = false;
    r.Query("uploads", &uploads);
    r.Query("uploadId", &id);
    if (r.method == "DELETE" && id) return HttpReply(204);
    if (!key.empty() || !uploads || r.method != "GET") return std::nullopt;
    int page = pages.fetch_add(1);
    std::string next = r.Query("key-marker") == "a" ? "b" : "a";
    bool truncated = page < 20;  // an old client would have looped forever
    std::string xml = "<ListMultipartUploadsResult><IsTruncated>" + std::string(truncated ? "true" : "false") +
                      "</IsTruncated><Upload><Key>k" + std::to_string(page) + "</Key><UploadId>u" +
                      std::to_string(page) + "</UploadId><Initiated>2020-01-01T00:00:00.000Z</Initiated></Upload>" +
                      (truncated ? "<NextKeyMarker>" + next + "</NextKeyMarker><NextUploadIdMarker>" +
                                       (next == "a" ? "1" : "2") + "</NextUploadIdMarker>"
                                 : "") +
                      "</ListMultipartUploadsResult>";
    return HttpReply(200, {}, xml);
  };
  auto store = Open();
  ASSERT_NE(store, nullptr);
  size_t aborted = 0;
  Status st = store->AbortStaleUploads(std::chrono::hours(1), &aborted);
  ASSERT_FALSE(st.ok()) << aborted << " uploads aborted from a listing that went round in a circle";
  EXPECT_EQ(st.code(), ErrorCode::kIOError);
  EXPECT_LE(pages.load(), 4);
}

// Keys with characters that need encoding (space, '+', '%', '=', '&', UTF-8)
// go out percent-encoded as SigV4 wants, come back from a listing with XML
// entities decoded, and read back exactly.
TEST_F(S3ReviewTest, KeysThatNeedEncodingRoundTrip) {
  auto store = Open();
  ASSERT_NE(store, nullptr);
  const std::string key = "dir/a b+c%d=e&f\xC3\xA9'<x>.bin";
  std::string bytes = Pattern(64, 11);
  ASSERT_TRUE(store->Put(key, Span(bytes)).ok());
  ASSERT_EQ(bucket_.put_paths().size(), 1u);
  EXPECT_EQ(bucket_.put_paths()[0], "/bkt/dir/a%20b%2Bc%25d%3De%26f%C3%A9%27%3Cx%3E.bin");
  ASSERT_TRUE(bucket_.Find(key).has_value());
  Result<std::vector<std::string>> keys = store->List("dir/");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(*keys, std::vector<std::string>{key});
  Result<Blob> got = store->Get(key);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(Str(*got) == bytes);
}

// A multipart upload whose part fails for good: aborted, never completed,
// never visible as the object.
TEST_F(S3ReviewTest, AMultipartUploadWithAFailingPartIsAbortedAndNeverVisible) {
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string&) -> std::optional<ScriptedReply> {
    if (r.method == "PUT" && r.Query("partNumber") == "2") return S3ErrorReply(400, "InvalidArgument");
    return std::nullopt;
  };
  auto store = Open();
  ASSERT_NE(store, nullptr);
  std::string big = Pattern(2 * kPart + 5, 12);
  Status put = store->Put("big", Span(big));
  ASSERT_FALSE(put.ok());
  EXPECT_NE(put.message().find("part 2"), std::string::npos) << put.message();
  bool aborted = false, completed = false;
  for (const std::string& line : server_->log()) {
    aborted |= line.starts_with("DELETE /bkt/big?uploadId=");
    completed |= line.starts_with("POST /bkt/big?uploadId=");
  }
  EXPECT_TRUE(aborted);
  EXPECT_FALSE(completed);
  EXPECT_EQ(store->Get("big").status().code(), ErrorCode::kNotFound);
}

// CompleteMultipartUpload failing inside a 200 answer: an error, the upload
// aborted.
TEST_F(S3ReviewTest, ACompleteThatFailsInsideA200IsAnError) {
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string&) -> std::optional<ScriptedReply> {
    bool id = false;
    r.Query("uploadId", &id);
    if (r.method == "POST" && id) return HttpReply(200, {}, "<Error><Code>InvalidPart</Code><Message>no</Message></Error>");
    return std::nullopt;
  };
  auto store = Open();
  ASSERT_NE(store, nullptr);
  std::string big = Pattern(kPart + 5, 13);
  Status put = store->Put("big", Span(big));
  ASSERT_FALSE(put.ok());
  EXPECT_NE(put.message().find("InvalidPart"), std::string::npos) << put.message();
  EXPECT_EQ(store->Get("big").status().code(), ErrorCode::kNotFound);
}

// A server that ignores If-None-Match / If-Match on PUT: the pre-check HEAD
// reports the conflict and nothing is written.
TEST_F(S3ReviewTest, ConditionalWritesOnAServerIgnoringThemAreStillRefused) {
  bucket_.Set("manifest.json", "theirs");
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string& key) -> std::optional<ScriptedReply> {
    if (r.method != "PUT") return std::nullopt;
    bucket_.Set(key, r.body);  // whatever the conditions say
    return HttpReply(200, {{"ETag", bucket_.Find(key)->etag}});
  };
  auto store = Open();
  ASSERT_NE(store, nullptr);
  std::string mine = "mine";
  Result<std::string> created = store->PutIfUnchanged("manifest.json", std::span<const ByteSpan>(std::vector<ByteSpan>{Span(mine)}), std::nullopt);
  EXPECT_EQ(created.status().code(), ErrorCode::kConflict) << created.status().ToString();
  Result<std::string> replaced = store->PutIfUnchanged("manifest.json", std::span<const ByteSpan>(std::vector<ByteSpan>{Span(mine)}), std::string("\"stale\""));
  EXPECT_EQ(replaced.status().code(), ErrorCode::kConflict) << replaced.status().ToString();
  EXPECT_EQ(bucket_.Find("manifest.json")->bytes, "theirs");
}

// 503 SlowDown on every attempt: retried max_attempts times, then an error
// naming the code and the attempts. Clock skew (403 RequestTimeTooSkewed)
// and a redirect are not retried and not followed: errors naming them.
TEST_F(S3ReviewTest, SlowDownStormsSkewAndRedirectsAreLoud) {
  bucket_.Set("k", "v");
  std::atomic<int> gets{0};
  std::string answer = "slowdown";
  bucket_.misbehave = [&](const ScriptedRequest& r, const std::string& key) -> std::optional<ScriptedReply> {
    if (key != "k" || r.method != "GET") return std::nullopt;
    gets.fetch_add(1);
    if (answer == "slowdown") return S3ErrorReply(503, "SlowDown", "Please reduce your request rate.");
    if (answer == "skew") return S3ErrorReply(403, "RequestTimeTooSkewed", "The difference is too large.");
    return HttpReply(307, {{"Location", "http://127.0.0.1:1/bkt/k"}}, "");
  };
  auto store = Open();
  ASSERT_NE(store, nullptr);
  Result<Blob> got = store->Get("k");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(gets.load(), 3);
  EXPECT_NE(got.status().message().find("SlowDown"), std::string::npos) << got.status().message();
  EXPECT_NE(got.status().message().find("3 attempts"), std::string::npos) << got.status().message();

  answer = "skew";
  gets = 0;
  got = store->Get("k");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(gets.load(), 1);
  EXPECT_NE(got.status().message().find("RequestTimeTooSkewed"), std::string::npos) << got.status().message();

  answer = "redirect";
  gets = 0;
  got = store->Get("k");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(gets.load(), 1);
  EXPECT_NE(got.status().message().find("307"), std::string::npos) << got.status().message();
}

}  // namespace
}  // namespace deltasync
