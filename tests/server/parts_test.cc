// The daemon's small parts on their own: --listen parsing, bearer checks,
// request schemas, --shm names, the metrics exposition.
#include <gtest/gtest.h>

#include <cstring>
#include <sstream>

#include "server/auth.h"
#include "server/listen_address.h"
#include "server/metrics.h"
#include "server/requests.h"
#include "server/shm_export.h"

namespace deltasync::server {
namespace {

TEST(ListenAddressTest, ParsesHostPortAndBracketedIpv6) {
  auto a = ParseListenAddress("127.0.0.1:8470");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8470);
  EXPECT_EQ(a->ToString(), "127.0.0.1:8470");
  auto v6 = ParseListenAddress("[::1]:0");
  ASSERT_TRUE(v6.ok());
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->WithPort(9000), "[::1]:9000");
  // A bare port is on loopback.
  auto port_only = ParseListenAddress("8471");
  ASSERT_TRUE(port_only.ok());
  EXPECT_EQ(port_only->ToString(), "127.0.0.1:8471");
  for (const char* bad :
       {"", "84x0", "65536", ":8470", "host:", "host:65536", "host:-1", "host:80x", "::1:80", "[]:1"}) {
    auto r = ParseListenAddress(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    }
  }
}

TEST(AuthTest, BearerMatchesOnlyTheExactToken) {
  EXPECT_TRUE(BearerMatches("Bearer abc", "abc"));
  EXPECT_FALSE(BearerMatches("Bearer abd", "abc"));
  EXPECT_FALSE(BearerMatches("Bearer ab", "abc"));
  EXPECT_FALSE(BearerMatches("Bearer abcd", "abc"));
  EXPECT_FALSE(BearerMatches("bearer abc", "abc"));
  EXPECT_FALSE(BearerMatches("Basic abc", "abc"));
  EXPECT_FALSE(BearerMatches("", "abc"));
  EXPECT_FALSE(BearerMatches("Bearer ", ""));
  EXPECT_TRUE(IsValidToken("a-Z_0.9~"));
  EXPECT_FALSE(IsValidToken(""));
  EXPECT_FALSE(IsValidToken("two words"));
  EXPECT_FALSE(IsValidToken("line\nbreak"));
  EXPECT_FALSE(IsValidToken(std::string(4097, 'a')));
}

TEST(RequestsTest, UpdateWeightsSchema) {
  auto ok = ParseUpdateWeights(
      R"({"update_info": {"repo_id": "r", "filename": "deltas/step_000002.safetensors", "update_kind": "sparse_flat"}, "extra": 1})");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->filename, "deltas/step_000002.safetensors");
  EXPECT_EQ(ok->repo_id, "r");
  EXPECT_EQ(ok->update_kind, "sparse_flat");
  EXPECT_TRUE(ParseUpdateWeights(R"({"update_info": {"filename": "a"}})").ok());
  for (const char* bad : {R"({})", R"({"update_info": null})", R"({"update_info": {"filename": null}})",
                          R"({"update_info": {"filename": "a", "update_kind": 1}})",
                          R"({"update_info": {"filename": "a/../b"}})", R"([])", ""}) {
    auto r = ParseUpdateWeights(bad);
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << bad;
  }
}

TEST(RequestsTest, NotifyStartAndOptionalBodies) {
  EXPECT_EQ(*ParseNotify(R"({"version": 18446744073709551615})"), UINT64_MAX);
  EXPECT_FALSE(ParseNotify(R"({"version": 18446744073709551616})").ok());
  EXPECT_FALSE(ParseNotify(R"({"version": 1e3})").ok());
  EXPECT_TRUE(*ParseStartWeightUpdate(R"({"is_checkpoint_format": true})"));
  EXPECT_FALSE(*ParseStartWeightUpdate(R"({"is_checkpoint_format": false})"));
  EXPECT_FALSE(ParseStartWeightUpdate(R"({"is_checkpoint_format": 1})").ok());
  EXPECT_TRUE(ParseOptionalObject("").ok());
  EXPECT_TRUE(ParseOptionalObject(" \r\n").ok());
  EXPECT_TRUE(ParseOptionalObject(R"({"anything": [1]})").ok());
  EXPECT_FALSE(ParseOptionalObject("1").ok());
  std::string keep = "keep", bogus = "bogus";
  EXPECT_EQ(*ParsePauseMode(nullptr), "keep");
  EXPECT_EQ(*ParsePauseMode(&keep), "keep");
  EXPECT_FALSE(ParsePauseMode(&bogus).ok());
}

TEST(ShmNameTest, NormalizesAndRefuses) {
  EXPECT_EQ(*NormalizeShmName("weights"), "/weights");
  EXPECT_EQ(*NormalizeShmName("/w.1_a-b"), "/w.1_a-b");
  for (const char* bad : {"", "/", "a/b", "//a", ".", "..", "sp ace", "é"}) {
    EXPECT_FALSE(NormalizeShmName(bad).ok()) << bad;
  }
  EXPECT_FALSE(NormalizeShmName(std::string(201, 'a')).ok());
}

TEST(MetricsTest, RendersCountersHistogramAndGauges) {
  Metrics m;
  m.RecordUpdate({.anchors_applied = 1, .deltas_applied = 2, .bytes_downloaded = 1000, .apply_ms = 3,
                  .compact_applies = 2, .held_applies = 1});
  m.RecordUpdate({.deltas_applied = 1, .bytes_downloaded = 10, .apply_ms = 200, .compact_applies = 1,
                  .held_applies = 1});
  m.RecordUpdate({.deltas_applied = 1, .bytes_downloaded = 10, .apply_ms = 100000, .compact_applies = 4,
                  .held_applies = 3, .stale_applies = 1});
  m.RecordError("update", ErrorCode::kIntegrity);
  m.RecordError("update", ErrorCode::kIntegrity);
  m.RecordError("manifest", ErrorCode::kIOError);
  m.RecordRequest("/status", 200);
  FollowerSnapshot s;
  s.version = 7;
  s.latest_version = 9;
  s.lag_versions = 2;
  s.paused = true;
  std::string text = m.Render(s);
  for (const char* line : {
           "deltasync_versions_applied_total 5\n",
           "deltasync_bytes_downloaded_total 1020\n",
           "deltasync_compact_applies_total 7\n",
           "deltasync_held_applies_total 5\n",
           "deltasync_stale_applies_total 1\n",
           "deltasync_apply_seconds_bucket{le=\"0.005\"} 1\n",
           "deltasync_apply_seconds_bucket{le=\"0.1\"} 1\n",
           "deltasync_apply_seconds_bucket{le=\"0.25\"} 2\n",
           "deltasync_apply_seconds_bucket{le=\"30\"} 2\n",
           "deltasync_apply_seconds_bucket{le=\"+Inf\"} 3\n",
           "deltasync_apply_seconds_count 3\n",
           "deltasync_errors_total{stage=\"update\",kind=\"integrity\"} 2\n",
           "deltasync_errors_total{stage=\"manifest\",kind=\"io_error\"} 1\n",
           "deltasync_http_requests_total{route=\"/status\",code=\"200\"} 1\n",
           "deltasync_held_version 7\n",
           "deltasync_latest_version 9\n",
           "deltasync_lag_versions 2\n",
           "deltasync_paused 1\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "in:\n" << text;
  }
  // Every sample line belongs to a declared metric.
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::string name = line.substr(0, line.find_first_of("{ "));
    std::string base = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      if (base.size() > strlen(suffix) && base.substr(base.size() - strlen(suffix)) == suffix &&
          text.find("# TYPE " + base.substr(0, base.size() - strlen(suffix)) + " histogram") != std::string::npos) {
        base = base.substr(0, base.size() - strlen(suffix));
      }
    }
    EXPECT_NE(text.find("# TYPE " + base + " "), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace deltasync::server
