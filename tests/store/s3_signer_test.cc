// SigV4 against AWS's published vectors: the aws-sig-v4-test-suite cases
// (credentials AKIDEXAMPLE, 2015-08-30, service "service") and the worked S3
// examples of the S3 API reference (AKIAIOSFODNN7EXAMPLE, 2013-05-24).
// Intermediate strings are checked where the vectors give them, because a
// server answers every signing mistake with the same SignatureDoesNotMatch.
// No server needed.
#include <gtest/gtest.h>

#include "store/s3_signer.h"

namespace deltasync::s3 {
namespace {

const SigV4Credentials kSuiteCreds{"AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""};
constexpr char kSuiteDate[] = "20150830T123600Z";
constexpr char kSuiteCredential[] =
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, ";

// A request of the generic suite: host and x-amz-date, plus `extra` headers.
SigV4Request Suite(std::string method, std::string path,
                   std::vector<std::pair<std::string, std::string>> query = {},
                   std::vector<std::pair<std::string, std::string>> extra = {}) {
  SigV4Request r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.query = std::move(query);
  r.headers = {{"Host", "example.amazonaws.com"}, {"X-Amz-Date", kSuiteDate}};
  for (auto& h : extra) r.headers.push_back(std::move(h));
  r.payload_hash = std::string(kEmptyPayloadSha256);
  return r;
}

SigV4Result SignSuite(const SigV4Request& r, const SigV4Credentials& c = kSuiteCreds) {
  return SignV4(r, c, "us-east-1", "service", kSuiteDate);
}

std::string StsHash(const SigV4Result& r) { return r.string_to_sign.substr(r.string_to_sign.rfind('\n') + 1); }

TEST(SigV4Suite, GetVanilla) {
  SigV4Result r = SignSuite(Suite("GET", "/"));
  EXPECT_EQ(r.canonical_request,
            "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(r.string_to_sign,
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n"
            "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63");
  EXPECT_EQ(r.authorization, std::string(kSuiteCredential) +
                                 "SignedHeaders=host;x-amz-date, "
                                 "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31");
}

TEST(SigV4Suite, PostVanilla) {
  SigV4Result r = SignSuite(Suite("POST", "/"));
  EXPECT_EQ(StsHash(r), "553f88c9e4d10fc9e109e2aeb65f030801b70c2f6468faca261d401ae622fc87");
  EXPECT_EQ(r.signature, "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b");
}

TEST(SigV4Suite, GetVanillaQueryOrderKeyCase) {
  SigV4Result r = SignSuite(Suite("GET", "/", {{"Param2", "value2"}, {"Param1", "value1"}}));
  EXPECT_EQ(r.canonical_query, "Param1=value1&Param2=value2");
  EXPECT_EQ(StsHash(r), "816cd5b414d056048ba4f7c5386d6e0533120fb1fcfa93762cf0fc39e2cf19e0");
  EXPECT_EQ(r.signature, "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500");
}

TEST(SigV4Suite, GetVanillaEmptyQueryKey) {
  EXPECT_EQ(SignSuite(Suite("GET", "/", {{"Param1", "value1"}})).signature,
            "a67d582fa61cc504c4bae71f336f98b97f1ea3c7a6bfe1b6e45aec72011b9aeb");
}

TEST(SigV4Suite, PostVanillaQuery) {
  EXPECT_EQ(SignSuite(Suite("POST", "/", {{"Param1", "value1"}})).signature,
            "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11");
}

TEST(SigV4Suite, GetUnreserved) {
  SigV4Result r = SignSuite(Suite("GET", "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"));
  EXPECT_EQ(r.encoded_path, "/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz");
  EXPECT_EQ(r.signature, "07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f");
}

TEST(SigV4Suite, GetVanillaQueryUnreserved) {
  const std::string u = "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  EXPECT_EQ(SignSuite(Suite("GET", "/", {{u, u}})).signature,
            "9c3e54bfcdf0b19771a7f523ee5669cdf59bc7cc0884027167c21bb143a40197");
}

TEST(SigV4Suite, GetUtf8) {
  SigV4Result r = SignSuite(Suite("GET", "/\xE1\x88\xB4"));
  EXPECT_EQ(r.encoded_path, "/%E1%88%B4");
  EXPECT_EQ(r.signature, "8318018e0b0f223aa2bbf98705b62bb787dc9c0e678f255a891fd03141be5d85");
}

TEST(SigV4Suite, GetVanillaUtf8Query) {
  SigV4Result r = SignSuite(Suite("GET", "/", {{"\xE1\x88\xB4", "bar"}}));
  EXPECT_EQ(r.canonical_query, "%E1%88%B4=bar");
  EXPECT_EQ(r.signature, "2cdec8eed098649ff3a119c94853b13c643bcf08f8b0a1d91e12c9027818dd04");
}

TEST(SigV4Suite, GetSpace) {
  SigV4Result r = SignSuite(Suite("GET", "/example space/"));
  EXPECT_EQ(r.encoded_path, "/example%20space/");
  EXPECT_EQ(r.signature, "652487583200325589f1fba4c7e578f72c47cb61beeca81406b39ddec1366741");
}

TEST(SigV4Suite, GetHeaderValueTrim) {
  SigV4Result r = SignSuite(Suite("GET", "/", {}, {{"My-Header1", " value1"}, {"My-Header2", "\"a   b   c\""}}));
  EXPECT_NE(r.canonical_request.find("my-header1:value1\nmy-header2:\"a b c\"\n"), std::string::npos)
      << r.canonical_request;
  EXPECT_EQ(r.authorization, std::string(kSuiteCredential) +
                                 "SignedHeaders=host;my-header1;my-header2;x-amz-date, "
                                 "Signature=acc3ed3afb60bb290fc8d2dd0098b9911fcaa05412b367055dee359757a9c736");
}

TEST(SigV4Suite, GetVanillaWithSessionToken) {
  SigV4Credentials creds = kSuiteCreds;
  creds.session_token = "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267";
  SigV4Result r = SignSuite(Suite("GET", "/"), creds);
  EXPECT_EQ(r.authorization, std::string(kSuiteCredential) +
                                 "SignedHeaders=host;x-amz-date;x-amz-security-token, "
                                 "Signature=07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8");
  // The token travels as a header; the secret never does.
  bool sent = false;
  for (const auto& [k, v] : r.headers) sent |= k == "x-amz-security-token" && v == creds.session_token;
  EXPECT_TRUE(sent);
  EXPECT_EQ(r.authorization.find(creds.secret_key), std::string::npos);
}

TEST(SigV4Suite, PostXWwwFormUrlencoded) {
  SigV4Request req = Suite("POST", "/", {}, {{"Content-Type", "application/x-www-form-urlencoded"}});
  req.payload_hash = Sha256Hex("Param1=value1");
  EXPECT_EQ(req.payload_hash, "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e");
  SigV4Result r = SignSuite(req);
  EXPECT_EQ(StsHash(r), "42a5e5bb34198acb3e84da4f085bb7927f2bc277ca766e6d19c73c2154021281");
  EXPECT_EQ(r.authorization, std::string(kSuiteCredential) +
                                 "SignedHeaders=content-type;host;x-amz-date, "
                                 "Signature=ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a");
}

// --- The S3 API reference's examples ("Signature Calculations for the
// Authorization Header: Transferring Payload in a Single Chunk").
const SigV4Credentials kS3Creds{"AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", ""};
constexpr char kS3Date[] = "20130524T000000Z";

SigV4Request S3Example(std::string method, std::string path, std::vector<std::pair<std::string, std::string>> query,
                       std::string payload_hash) {
  SigV4Request r;
  r.method = std::move(method);
  r.path = std::move(path);
  r.query = std::move(query);
  r.headers = {{"Host", "examplebucket.s3.amazonaws.com"},
               {"x-amz-date", kS3Date},
               {"x-amz-content-sha256", payload_hash}};
  r.payload_hash = std::move(payload_hash);
  return r;
}

SigV4Result SignS3(const SigV4Request& r) { return SignV4(r, kS3Creds, "us-east-1", "s3", kS3Date); }

TEST(SigV4S3Examples, GetObjectWithRange) {
  SigV4Request req = S3Example("GET", "/test.txt", {}, std::string(kEmptyPayloadSha256));
  req.headers.emplace_back("Range", "bytes=0-9");
  SigV4Result r = SignS3(req);
  EXPECT_EQ(r.canonical_request,
            "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\n"
            "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
            "x-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\n"
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(StsHash(r), "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972");
  EXPECT_EQ(r.authorization,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
            "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41");
}

TEST(SigV4S3Examples, PutObject) {
  std::string hash = Sha256Hex("Welcome to Amazon S3.");
  EXPECT_EQ(hash, "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072");
  SigV4Request req = S3Example("PUT", "/test$file.text", {}, hash);
  req.headers.emplace_back("Date", "Fri, 24 May 2013 00:00:00 GMT");
  req.headers.emplace_back("x-amz-storage-class", "REDUCED_REDUNDANCY");
  SigV4Result r = SignS3(req);
  EXPECT_EQ(r.encoded_path, "/test%24file.text");
  EXPECT_EQ(StsHash(r), "9e0e90d9c76de8fa5b200d8c849cd5b8dc7a3be3951ddb7f6a76b4158342019d");
  EXPECT_EQ(r.signature, "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd");
}

TEST(SigV4S3Examples, GetBucketLifecycleValuelessParameter) {
  SigV4Result r = SignS3(S3Example("GET", "/", {{"lifecycle", ""}}, std::string(kEmptyPayloadSha256)));
  EXPECT_EQ(r.canonical_query, "lifecycle=");
  EXPECT_EQ(StsHash(r), "9766c798316ff2757b517bc739a67f6213b4ab36dd5da2f94eaebf79c77395ca");
  EXPECT_EQ(r.signature, "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543");
}

TEST(SigV4S3Examples, ListObjectsSortsQuery) {
  SigV4Result r =
      SignS3(S3Example("GET", "/", {{"prefix", "J"}, {"max-keys", "2"}}, std::string(kEmptyPayloadSha256)));
  EXPECT_EQ(r.canonical_query, "max-keys=2&prefix=J");
  EXPECT_EQ(StsHash(r), "df57d21db20da04d7fa30298dd4488ba3a2b47ca3a489c74750e0f1e7df1b9b7");
  EXPECT_EQ(r.signature, "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7");
}

TEST(SigV4Helpers, UriEncode) {
  EXPECT_EQ(UriEncode("a b+c/d~e", true), "a%20b%2Bc/d~e");
  EXPECT_EQ(UriEncode("a b+c/d~e", false), "a%20b%2Bc%2Fd~e");
  EXPECT_EQ(UriEncode("=&%", false), "%3D%26%25");
  EXPECT_EQ(UriEncode(std::string("\0\xff", 2), false), "%00%FF");
}

TEST(SigV4Helpers, AmzDate) {
  EXPECT_EQ(AmzDate(1440938160), "20150830T123600Z");
  EXPECT_EQ(AmzDate(0), "19700101T000000Z");
}

TEST(SigV4Helpers, Sha256OverSpansWithOffset) {
  std::string all = "Welcome to Amazon S3.";
  std::vector<ByteSpan> parts;
  for (size_t i = 0; i < all.size(); i += 4) {
    parts.emplace_back(reinterpret_cast<const uint8_t*>(all.data()) + i, std::min<size_t>(4, all.size() - i));
  }
  EXPECT_EQ(Sha256Hex(parts, 0, all.size()), Sha256Hex(all));
  EXPECT_EQ(Sha256Hex(parts, 3, 10), Sha256Hex(all.substr(3, 10)));
  EXPECT_EQ(Sha256Hex(parts, 0, 0), std::string(kEmptyPayloadSha256));
}

}  // namespace
}  // namespace deltasync::s3
