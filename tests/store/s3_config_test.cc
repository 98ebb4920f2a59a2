// S3 configuration without a server: INI files, bucket URLs, endpoints, the
// AWS CLI's precedence of environment and profiles, the XML reader and the
// retry policy.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "store/s3_config.h"
#include "store/s3_retry.h"
#include "store/s3_xml.h"
#include "testing/temp_dir.h"

namespace deltasync::s3 {
namespace {

bool Contains(const std::string& s, std::string_view needle) { return s.find(needle) != std::string::npos; }

TEST(S3Ini, SectionsKeysCommentsAndNesting) {
  Result<IniFile> ini = ParseIni(
      "\xEF\xBB\xBF# comment\r\n"
      "[default]\r\n"
      "aws_access_key_id = AKID\r\n"
      "Region: eu-west-1\n"
      "; another comment\n"
      "\n"
      "[profile rgw]\n"
      "endpoint_url = http://127.0.0.1:7480\n"
      "s3 =\n"
      "  addressing_style = path\n"
      "  endpoint_url = http://10.0.0.1:9000\n"
      "output = json\n"
      "note = first\n"
      "  second\n",
      "config");
  ASSERT_TRUE(ini.ok()) << ini.status().ToString();
  EXPECT_EQ((*ini)["default"]["aws_access_key_id"], "AKID");
  EXPECT_EQ((*ini)["default"]["region"], "eu-west-1");  // keys are lower-cased, ':' works like '='
  EXPECT_EQ((*ini)["profile rgw"]["endpoint_url"], "http://127.0.0.1:7480");
  EXPECT_EQ((*ini)["profile rgw"]["s3.addressing_style"], "path");
  EXPECT_EQ((*ini)["profile rgw"]["s3.endpoint_url"], "http://10.0.0.1:9000");
  EXPECT_EQ((*ini)["profile rgw"]["output"], "json");
  EXPECT_EQ((*ini)["profile rgw"]["note"], "first\nsecond");  // continuation line
}

TEST(S3Ini, ErrorsNameFileAndLine) {
  Result<IniFile> r = ParseIni("[default]\nkey = v\nthis is not a key value line\n", "/home/u/.aws/config");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Contains(r.status().message(), "/home/u/.aws/config:3")) << r.status().message();
  EXPECT_FALSE(ParseIni("key = before any section\n", "f").ok());
  EXPECT_FALSE(ParseIni("[unclosed\n", "f").ok());
  EXPECT_FALSE(ParseIni("[]\n", "f").ok());
  EXPECT_TRUE(ParseIni("", "f").ok());
}

TEST(S3Url, BucketAndPrefix) {
  Result<BucketUrl> u = ParseBucketUrl("s3://my-bucket/runs/exp1/");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->bucket, "my-bucket");
  EXPECT_EQ(u->prefix, "runs/exp1/");
  EXPECT_EQ(ParseBucketUrl("s3://my-bucket")->prefix, "");
  EXPECT_EQ(ParseBucketUrl("s3://my-bucket/")->prefix, "");
  EXPECT_EQ(ParseBucketUrl("s3://a.b-c/x")->prefix, "x/");
}

TEST(S3Url, Refusals) {
  for (const char* bad : {"s3://", "s3://ab", "s3://Upper", "s3://under_score", "s3://-dash", "s3://a..b",
                          "http://bucket", "bucket/prefix", "s3://bucket/a//b", "s3://bucket/../x"}) {
    Result<BucketUrl> r = ParseBucketUrl(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << bad;
  }
}

TEST(S3Endpoint, Forms) {
  Result<Endpoint> e = ParseEndpoint("http://127.0.0.1:7480/");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->scheme, "http");
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, "7480");
  EXPECT_EQ(e->Authority(), "127.0.0.1:7480");
  EXPECT_EQ(ParseEndpoint("https://s3.eu-west-1.amazonaws.com")->Authority(), "s3.eu-west-1.amazonaws.com");
  EXPECT_EQ(ParseEndpoint("http://[::1]:9000")->host, "[::1]");
  for (const char* bad : {"127.0.0.1:7480", "ftp://x", "http://", "http://h:port", "http://h:99999",
                          "http://h/path", "http://user@h", "http://[::1"}) {
    EXPECT_FALSE(ParseEndpoint(bad).ok()) << bad;
  }
}

// Session 52 (h1, found by s3_config_fuzz): a host is a name or an address,
// so that the endpoint written back (scheme://host:port) is the same one.
// Before, "http://a:b:" was host "a:b" (re-read: host "a", port "b"), a NUL
// from a config file cut the host short when curl read the URL, and a port
// "00" was port 0.
TEST(S3Endpoint, RefusesHostsThatAreNoNameOrAddressAndPortZero) {
  using namespace std::string_literals;
  EXPECT_EQ(ParseEndpoint("http://[fe80::1%25eth0]:80")->host, "[fe80::1%25eth0]");
  EXPECT_EQ(ParseEndpoint("http://my-rgw_1.local:7480")->port, "7480");
  for (const std::string& bad : {"http://a:b:"s, "http://h:"s, "http://a b"s, "http://good\0evil"s, "http://h\x01"s,
                                 "http://[]"s, "http://[::1]]"s, "http://[g::1]"s, "http://h]"s, "http://h:00"s,
                                 "http://h:0000"s}) {
    EXPECT_FALSE(ParseEndpoint(bad).ok()) << bad;
  }
}

// An environment and a home directory made up for each test.
class S3ResolveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    vars_["HOME"] = home_.path();
    std::filesystem::create_directories(home_.Sub(".aws"));
  }
  void Write(const std::string& name, const std::string& text) {
    std::ofstream(home_.Sub(".aws/" + name)) << text;
  }
  Result<ResolvedConfig> Resolve(S3Options o = {}, std::string_view bucket = "bucket") {
    return ResolveConfig(o, bucket, [this](std::string_view n) -> std::optional<std::string> {
      auto it = vars_.find(std::string(n));
      if (it == vars_.end()) return std::nullopt;
      return it->second;
    });
  }
  deltasync::testing::TempDir home_;
  std::map<std::string, std::string> vars_;
};

TEST_F(S3ResolveTest, EnvironmentCredentialsWinOverProfiles) {
  Write("credentials", "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = FILESECRET\n");
  vars_["AWS_ACCESS_KEY_ID"] = "ENVKEY";
  vars_["AWS_SECRET_ACCESS_KEY"] = "ENVSECRET";
  vars_["AWS_SESSION_TOKEN"] = "ENVTOKEN";
  Result<ResolvedConfig> rc = Resolve();
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_EQ(rc->options.access_key, "ENVKEY");
  EXPECT_EQ(rc->options.secret_key, "ENVSECRET");
  EXPECT_EQ(rc->options.session_token, "ENVTOKEN");
  EXPECT_TRUE(Contains(rc->credential_source, "environment"));
  EXPECT_EQ(rc->options.region, "us-east-1");
  EXPECT_EQ(rc->options.endpoint, "https://s3.us-east-1.amazonaws.com");
  EXPECT_FALSE(rc->path_style);  // AWS's own endpoint: virtual-hosted
}

TEST_F(S3ResolveTest, NamedProfileFromCredentialsAndConfig) {
  Write("credentials",
        "[default]\naws_access_key_id = D\naws_secret_access_key = DS\n"
        "[rgw]\naws_access_key_id = RGWKEY\naws_secret_access_key = RGWSECRET\n");
  Write("config",
        "[default]\nregion = us-west-2\n"
        "[profile rgw]\nregion = eu-central-1\nendpoint_url = http://127.0.0.1:7480\n");
  vars_["AWS_PROFILE"] = "rgw";
  Result<ResolvedConfig> rc = Resolve();
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_EQ(rc->options.access_key, "RGWKEY");
  EXPECT_EQ(rc->options.secret_key, "RGWSECRET");
  EXPECT_EQ(rc->options.region, "eu-central-1");
  EXPECT_EQ(rc->endpoint.Authority(), "127.0.0.1:7480");
  EXPECT_TRUE(rc->path_style);  // custom endpoint: path-style
  EXPECT_TRUE(Contains(rc->credential_source, "profile 'rgw'"));
  EXPECT_FALSE(Contains(rc->credential_source, "RGWSECRET"));
}

TEST_F(S3ResolveTest, CredentialsInConfigFileAndNestedS3Section) {
  Write("config",
        "[profile p]\naws_access_key_id = CK\naws_secret_access_key = CS\n"
        "endpoint_url = http://global:1\ns3 =\n  endpoint_url = http://s3only:2\n  addressing_style = virtual\n");
  S3Options o;
  o.profile = "p";
  Result<ResolvedConfig> rc = Resolve(o);
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_EQ(rc->options.access_key, "CK");
  EXPECT_EQ(rc->endpoint.Authority(), "s3only:2");  // the service-specific endpoint wins
  EXPECT_FALSE(rc->path_style);
}

TEST_F(S3ResolveTest, PrecedenceOfRegionAndEndpoint) {
  Write("config", "[default]\nregion = from-profile\nendpoint_url = http://profile:1\n");
  vars_["AWS_ACCESS_KEY_ID"] = "K";
  vars_["AWS_SECRET_ACCESS_KEY"] = "S";
  EXPECT_EQ(Resolve()->options.region, "from-profile");
  vars_["AWS_DEFAULT_REGION"] = "default-region";
  EXPECT_EQ(Resolve()->options.region, "default-region");
  vars_["AWS_REGION"] = "region";
  EXPECT_EQ(Resolve()->options.region, "region");
  S3Options explicit_region;
  explicit_region.region = "explicit";
  EXPECT_EQ(Resolve(explicit_region)->options.region, "explicit");

  EXPECT_EQ(Resolve()->endpoint.host, "profile");
  vars_["AWS_ENDPOINT_URL"] = "http://global:2";
  EXPECT_EQ(Resolve()->endpoint.host, "global");
  vars_["AWS_ENDPOINT_URL_S3"] = "http://s3:3";
  EXPECT_EQ(Resolve()->endpoint.host, "s3");
}

TEST_F(S3ResolveTest, AddressingStyle) {
  vars_["AWS_ACCESS_KEY_ID"] = "K";
  vars_["AWS_SECRET_ACCESS_KEY"] = "S";
  EXPECT_TRUE(Resolve({}, "with.dots")->path_style);  // AWS, but dots break the TLS wildcard
  vars_["DELTASYNC_S3_ADDRESSING"] = "path";
  EXPECT_TRUE(Resolve()->path_style);
  vars_["DELTASYNC_S3_ADDRESSING"] = "virtual";
  vars_["AWS_ENDPOINT_URL"] = "http://localhost:7480";
  EXPECT_FALSE(Resolve()->path_style);
  vars_["DELTASYNC_S3_ADDRESSING"] = "sideways";
  EXPECT_FALSE(Resolve().ok());
}

TEST_F(S3ResolveTest, MissingProfileAndMissingCredentialsAreClear) {
  vars_["AWS_PROFILE"] = "nope";
  Result<ResolvedConfig> r = Resolve();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "profile 'nope' not found")) << r.status().message();

  vars_.erase("AWS_PROFILE");
  r = Resolve();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(Contains(r.status().message(), "AWS_ACCESS_KEY_ID")) << r.status().message();

  // A key id without its secret is incomplete, and says so without echoing anything secret.
  vars_["AWS_SECRET_ACCESS_KEY"] = "TOPSECRET-ONLY";
  r = Resolve();
  ASSERT_FALSE(r.ok());
  EXPECT_FALSE(Contains(r.status().message(), "TOPSECRET")) << r.status().message();
}

TEST_F(S3ResolveTest, MalformedFileAndEndpointNeverQuoteSecrets) {
  vars_["AWS_ACCESS_KEY_ID"] = "K";
  vars_["AWS_SECRET_ACCESS_KEY"] = "SUPERSECRET";
  vars_["AWS_ENDPOINT_URL"] = "not a url";
  Result<ResolvedConfig> r = Resolve();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "not a url"));
  EXPECT_FALSE(Contains(r.status().message(), "SUPERSECRET"));

  vars_.erase("AWS_ENDPOINT_URL");
  Write("credentials", "[default]\naws_secret_access_key = SUPERSECRET\ngarbage line\n");
  r = Resolve();
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(Contains(r.status().message(), "credentials:3")) << r.status().message();
  EXPECT_FALSE(Contains(r.status().message(), "SUPERSECRET"));
}

TEST_F(S3ResolveTest, ReadEnvironmentFalseUsesOnlyOptions) {
  vars_["AWS_ACCESS_KEY_ID"] = "K";
  vars_["AWS_SECRET_ACCESS_KEY"] = "S";
  S3Options o;
  o.read_environment = false;
  EXPECT_FALSE(Resolve(o).ok());
  o.access_key = "A";
  o.secret_key = "B";
  o.endpoint = "http://127.0.0.1:1";
  Result<ResolvedConfig> rc = Resolve(o);
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(rc->options.access_key, "A");
  EXPECT_EQ(rc->credential_source, "S3Options");
}

TEST(S3Xml, ElementsAndText) {
  std::string xml =
      "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
      "<KeyCount>2</KeyCount><Contents><Key>a&amp;b &lt;c&gt; &#x1F600;&#65;</Key></Contents>"
      "<Contents><Key>plain</Key></Contents><Contents><Key/></Contents>"
      "<IsTruncated>false</IsTruncated></ListBucketResult>";
  std::vector<std::string_view> contents = XmlElements(xml, "Contents");
  ASSERT_EQ(contents.size(), 3u);
  EXPECT_EQ(XmlText(contents[0], "Key").value(), "a&b <c> \xF0\x9F\x98\x80" "A");
  EXPECT_EQ(XmlText(contents[1], "Key").value(), "plain");
  EXPECT_EQ(XmlText(contents[2], "Key").value(), "");
  EXPECT_EQ(XmlText(xml, "KeyCount").value(), "2");
  EXPECT_EQ(XmlText(xml, "Key").value(), XmlText(contents[0], "Key").value());  // not <KeyCount>
  EXPECT_FALSE(XmlText(xml, "NextContinuationToken").has_value());
}

TEST(S3Xml, MalformedInputIsHarmless) {
  for (std::string_view bad : {"<Key>unterminated", "<Key", "<", "</Key>", "<Key>&#xFFFFFFFFF;</Key>",
                               "<Key>&#0;&bogus;&</Key>", "<Key attr=\"x\">v</Key>"}) {
    std::optional<std::string> t = XmlText(bad, "Key");
    if (t) EXPECT_LE(t->size(), bad.size() + 4) << bad;
  }
  EXPECT_EQ(XmlText("<Key attr=\"x\">v</Key>", "Key").value(), "v");
  EXPECT_EQ(XmlUnescape("&#0;&bogus;&"), "&#0;&bogus;&");
  EXPECT_EQ(XmlEscape("a&<>\"'"), "a&amp;&lt;&gt;&quot;&apos;");
}

TEST(S3Retry, WhatIsRetried) {
  HttpResponse r;
  r.status = 503;
  EXPECT_TRUE(IsRetryable(r, "SlowDown"));
  r.status = 500;
  EXPECT_TRUE(IsRetryable(r, "InternalError"));
  r.status = 429;
  EXPECT_TRUE(IsRetryable(r, ""));
  r.status = 400;
  EXPECT_TRUE(IsRetryable(r, "RequestTimeout"));
  EXPECT_TRUE(IsRetryable(r, "IncompleteBody"));
  r.status = 409;
  EXPECT_TRUE(IsRetryable(r, "OperationAborted"));
  for (long s : {400L, 403L, 404L, 409L, 412L, 416L}) {
    r.status = s;
    EXPECT_FALSE(IsRetryable(r, "AccessDenied")) << s;
  }
  HttpResponse t;
  t.transport_error = 56;  // CURLE_RECV_ERROR: connection reset
  EXPECT_TRUE(IsRetryable(t, ""));
  t.transport_error = 28;  // CURLE_OPERATION_TIMEDOUT
  EXPECT_TRUE(IsRetryable(t, ""));
  t.transport_error = 3;  // CURLE_URL_MALFORMAT
  EXPECT_FALSE(IsRetryable(t, ""));
  t.transport_error = 23;  // CURLE_WRITE_ERROR after a body larger than asked for
  t.sink_overflow = true;
  EXPECT_FALSE(IsRetryable(t, ""));
}

TEST(S3Retry, FullJitterStaysWithinTheCap) {
  using std::chrono::milliseconds;
  for (int retry = 0; retry < 40; ++retry) {
    milliseconds d = BackoffDelay(retry, milliseconds(100), milliseconds(2000));
    EXPECT_GE(d.count(), 0);
    EXPECT_LE(d.count(), std::min<int64_t>(2000, int64_t{100} << std::min(retry, 30)));
  }
  EXPECT_EQ(BackoffDelay(3, milliseconds(0), milliseconds(100)).count(), 0);
}

}  // namespace
}  // namespace deltasync::s3
