// Every HTTP route of the daemon against a running daemon on a real
// loopback socket: status codes, schemas, pause/resume, TRL's choreography,
// /update_weights' 200/404/409/500, /healthz' 503 reasons, /metrics.
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <atomic>

#include "server/server_test_util.h"
#include "testing/fault_store.h"

namespace deltasync::testing {
namespace {

using nlohmann::json;

TEST(HttpRoutesTest, StatusHealthzAndMetricsOfAFollowingDaemon) {
  TestBucket bucket;
  bucket.PublishRange(1, 6);
  auto daemon = StartFollowing(bucket.store(), 6);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();

  json s = StatusOf(addr);
  EXPECT_EQ(s["version"], 6);
  EXPECT_EQ(s["state_hash"], bucket.hash(6).Hex());
  EXPECT_EQ(s["latest_version"], 6);
  EXPECT_EQ(s["lag_versions"], 0);
  EXPECT_EQ(s["lag_seconds"], 0.0);
  EXPECT_EQ(s["paused"], false);
  EXPECT_EQ(s["in_weight_update"], false);
  EXPECT_TRUE(s["last_error"].is_null());
  EXPECT_TRUE(s["updated_at"].is_number());
  EXPECT_TRUE(s["export_error"].is_null());

  HttpReply health = HttpGet(addr, "/healthz");
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(health.json["ok"], true);
  EXPECT_EQ(health.json["version"], 6);

  HttpReply metrics = HttpGet(addr, "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_EQ(Header(metrics, "Content-Type").rfind("text/plain; version=0.0.4", 0), 0u) << Header(metrics, "Content-Type");
  const std::string& m = metrics.body;
  // From nothing to 6: the anchor of 4, then the deltas of 5 and 6.
  EXPECT_NE(m.find("deltasync_versions_applied_total 3\n"), std::string::npos) << m;
  EXPECT_NE(m.find("deltasync_held_version 6\n"), std::string::npos) << m;
  EXPECT_NE(m.find("deltasync_apply_seconds_count 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("deltasync_apply_seconds_bucket{le=\"+Inf\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("# TYPE deltasync_apply_seconds histogram"), std::string::npos) << m;
  EXPECT_EQ(m.find("deltasync_bytes_downloaded_total 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("deltasync_http_requests_total{route=\"/healthz\",code=\"200\"} 1"), std::string::npos) << m;
}

TEST(HttpRoutesTest, HealthzIs503UntilAVersionIsHeld) {
  TestBucket bucket;  // nothing published yet: no manifest
  auto daemon = StartDaemon(DaemonOptions(bucket.store()));
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  // There is no manifest yet: the daemon waits for the first version, which
  // is no error (/status has no last_error), and /healthz says so.
  HttpReply health;
  ASSERT_TRUE(WaitUntil([&] {
    health = HttpGet(addr, "/healthz");
    return health.json.contains("reason") &&
           health.json["reason"].get<std::string>().find("waiting for the first version") != std::string::npos;
  }));
  EXPECT_EQ(health.status, 503);
  EXPECT_EQ(health.json["ok"], false);
  EXPECT_NE(health.json["reason"].get<std::string>().find("no verified version held yet"), std::string::npos);
  json s = StatusOf(addr);
  EXPECT_EQ(s["version"], 0);
  EXPECT_TRUE(s["state_hash"].is_null());
  EXPECT_TRUE(s["updated_at"].is_null());
  EXPECT_TRUE(s["last_error"].is_null()) << s.dump();

  bucket.Publish(1);
  ASSERT_TRUE(WaitForVersion(addr, 1));
  EXPECT_EQ(HttpGet(addr, "/healthz").status, 200);
  EXPECT_TRUE(StatusOf(addr)["last_error"].is_null());
  // Waiting was never counted as an error.
  EXPECT_EQ(HttpGet(addr, "/metrics").body.find("deltasync_errors_total{stage=\"manifest\",kind=\"not_found\"}"),
            std::string::npos);
}

TEST(HttpRoutesTest, HealthzIs503WhenTheManifestCannotBeReadAndRecovers) {
  TestBucket bucket;
  bucket.PublishRange(1, 2);
  auto faulty = std::make_shared<FaultStore>(bucket.store());
  auto broken = std::make_shared<std::atomic<bool>>(false);
  faulty->fail_read = [broken](std::string_view key) {
    return broken->load() && key == kManifestKey ? Status::IOError("injected: bucket unreachable") : Status::OK();
  };
  ServerOptions options = DaemonOptions(faulty);
  options.stale_after_seconds = 0.3;
  auto daemon = StartDaemon(options);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  ASSERT_TRUE(WaitForVersion(addr, 2));
  ASSERT_TRUE(WaitUntil([&] { return HttpGet(addr, "/healthz").status == 200; }));

  broken->store(true);
  ASSERT_TRUE(WaitUntil([&] { return HttpGet(addr, "/healthz").status == 503; }));
  HttpReply health = HttpGet(addr, "/healthz");
  EXPECT_NE(health.json["reason"].get<std::string>().find("no successful read of manifest.json"), std::string::npos)
      << health.body;
  EXPECT_NE(health.json["reason"].get<std::string>().find("injected: bucket unreachable"), std::string::npos);
  json s = StatusOf(addr);
  EXPECT_EQ(s["version"], 2) << "keeps its last good version";
  EXPECT_EQ(s["last_error"]["stage"], "manifest");
  EXPECT_EQ(s["last_error"]["kind"], "io_error");

  broken->store(false);
  bucket.Publish(3);
  ASSERT_TRUE(WaitForVersion(addr, 3));
  EXPECT_TRUE(WaitUntil([&] { return HttpGet(addr, "/healthz").status == 200; }));
}

TEST(HttpRoutesTest, PauseHoldsTheVersionAndResumeReleasesIt) {
  TestBucket bucket;
  bucket.PublishRange(1, 3);
  auto daemon = StartFollowing(bucket.store(), 3);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();

  HttpReply paused = HttpPost(addr, "/pause?mode=keep", "");
  ASSERT_EQ(paused.status, 200) << paused.body;
  EXPECT_EQ(paused.json["paused"], true);
  EXPECT_EQ(paused.json["mode"], "keep");
  EXPECT_EQ(paused.json["version"], 3);
  bucket.PublishRange(4, 5);
  EXPECT_EQ(HttpPost(addr, "/notify", R"({"version": 5})").status, 202);
  // The watcher keeps reading the manifest while paused (that is how the
  // lag is known); once it has seen 5, it must still hold 3.
  ASSERT_TRUE(WaitUntil([&] { return StatusOf(addr)["latest_version"] == 5; }));
  json s = StatusOf(addr);
  EXPECT_EQ(s["version"], 3);
  EXPECT_EQ(s["paused"], true);
  EXPECT_EQ(s["lag_versions"], 2);
  EXPECT_GE(s["lag_seconds"].get<double>(), 0.0);
  EXPECT_NE(HttpGet(addr, "/metrics").body.find("deltasync_paused 1\n"), std::string::npos);

  HttpReply resumed = HttpPost(addr, "/resume", "");
  ASSERT_EQ(resumed.status, 200);
  EXPECT_EQ(resumed.json["paused"], false);
  ASSERT_TRUE(WaitForVersion(addr, 5));
  EXPECT_EQ(StatusOf(addr)["state_hash"], bucket.hash(5).Hex());
  EXPECT_EQ(StatusOf(addr)["paused"], false);

  // Every mode TRL and vLLM use is accepted; anything else is a 400.
  for (const char* mode : {"wait", "abort"}) {
    EXPECT_EQ(HttpPost(addr, std::string("/pause?mode=") + mode, "").status, 200) << mode;
  }
  EXPECT_EQ(HttpPost(addr, "/pause?mode=forever", "").status, 400);
  EXPECT_EQ(HttpPost(addr, "/resume", "{}").status, 200);
}

// A daemon that followed `bucket` to version 2 and was paused there, then
// versions 3 to `last` published; nullptr (with a failure) otherwise.
std::unique_ptr<Server> PausedAtTwo(TestBucket& bucket, uint64_t last) {
  bucket.PublishRange(1, 2);
  std::unique_ptr<Server> daemon = StartFollowing(bucket.store(), 2);
  if (!daemon || HttpPost(daemon->address(), "/pause", "").status != 200) {
    ADD_FAILURE() << "no daemon paused at version 2";
    return nullptr;
  }
  bucket.PublishRange(3, last);
  return daemon;
}

TEST(HttpRoutesTest, UpdateWeightsMovesToTheObjectsVersionAndAnswersWhenHeld) {
  TestBucket bucket;  // anchors at 1, 4, 8
  auto daemon = PausedAtTwo(bucket, 7);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();

  HttpReply moved = HttpPost(addr, "/update_weights", UpdateWeightsBody(DeltaKey(5)));
  ASSERT_EQ(moved.status, 200) << moved.body;
  EXPECT_EQ(moved.json["version"], 5);
  EXPECT_EQ(moved.json["moved"], true);
  EXPECT_EQ(moved.json["from_version"], 2);
  EXPECT_EQ(moved.json["state_hash"], bucket.hash(5).Hex());
  EXPECT_EQ(moved.json["deltas_applied"], 3);
  EXPECT_GT(moved.json["bytes_downloaded"].get<uint64_t>(), 0u);
  EXPECT_EQ(moved.json["compact_applies"], 0);  // TRL's gap_delta
  EXPECT_EQ(moved.json["held_applies"], 0);
  EXPECT_EQ(moved.json["stale_applies"], 0);
  // Answered when held: /status agrees at once, and the pause still holds.
  EXPECT_EQ(StatusOf(addr)["version"], 5);
  EXPECT_EQ(StatusOf(addr)["paused"], true);

  HttpReply same = HttpPost(addr, "/update_weights", UpdateWeightsBody(DeltaKey(5)));
  EXPECT_EQ(same.status, 200);
  EXPECT_EQ(same.json["moved"], false);
  EXPECT_EQ(same.json["version"], 5);

  HttpReply older = HttpPost(addr, "/update_weights", UpdateWeightsBody(AnchorKey(4)));
  EXPECT_EQ(older.status, 409) << older.body;
  EXPECT_EQ(older.json["error"], "conflict");
  EXPECT_NE(older.json["message"].get<std::string>().find("version 4"), std::string::npos);

  HttpReply unknown = HttpPost(addr, "/update_weights", UpdateWeightsBody(DeltaKey(99)));
  EXPECT_EQ(unknown.status, 404) << unknown.body;
  EXPECT_EQ(unknown.json["error"], "not_found");
  EXPECT_EQ(HttpPost(addr, "/update_weights", UpdateWeightsBody("manifest.json")).status, 404);

  // The manifest is read afresh: a version published after the pause, named
  // by its anchor, is found.
  bucket.Publish(8);
  HttpReply anchor = HttpPost(addr, "/update_weights", UpdateWeightsBody(AnchorKey(8)));
  EXPECT_EQ(anchor.status, 200) << anchor.body;
  EXPECT_EQ(anchor.json["version"], 8);
  EXPECT_EQ(anchor.json["state_hash"], bucket.hash(8).Hex());
  EXPECT_EQ(StatusOf(addr)["version"], 8);

  // Keys that would leave the bucket never reach the store.
  for (const char* key : {"../outside.safetensors", "/etc/passwd", "deltas/../../x", "a\\b", ""}) {
    HttpReply bad = HttpPost(addr, "/update_weights", UpdateWeightsBody(key));
    EXPECT_EQ(bad.status, 400) << key << ": " << bad.body;
  }
}

// A compact bucket: /update_weights and /metrics count the compact applies
// in place and those that started from the class totals the replica held
// (the first after an anchor fills them; the next is held).
TEST(HttpRoutesTest, UpdateWeightsAndMetricsCountHeldCompactApplies) {
  TestBucket bucket(1, {.anchor_interval = 4, .encoding = IndexEncoding::kCompact});
  auto daemon = PausedAtTwo(bucket, 3);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();

  HttpReply moved = HttpPost(addr, "/update_weights", UpdateWeightsBody(CompactDeltaKey(3)));
  ASSERT_EQ(moved.status, 200) << moved.body;
  EXPECT_EQ(moved.json["version"], 3);
  EXPECT_EQ(moved.json["state_hash"], bucket.hash(3).Hex());
  EXPECT_EQ(moved.json["compact_applies"], 1);
  EXPECT_EQ(moved.json["held_applies"], 1);
  EXPECT_EQ(moved.json["stale_applies"], 0);

  const std::string m = HttpGet(addr, "/metrics").body;
  // Version 2 (its anchor's first compact apply fills the totals) and 3.
  EXPECT_NE(m.find("deltasync_compact_applies_total 2\n"), std::string::npos) << m;
  EXPECT_NE(m.find("deltasync_held_applies_total 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("deltasync_stale_applies_total 0\n"), std::string::npos) << m;
  EXPECT_NE(m.find("# TYPE deltasync_held_applies_total counter"), std::string::npos) << m;
}

TEST(HttpRoutesTest, TrlChoreographyWorksUnchanged) {
  TestBucket bucket;
  bucket.PublishRange(1, 2);
  auto daemon = StartFollowing(bucket.store(), 2);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();

  for (uint64_t v = 3; v <= 5; ++v) {
    bucket.Publish(v);  // 1. upload (here: publish) while inference runs
    bool anchor = v == 4;
    std::string key = anchor ? AnchorKey(v) : DeltaKey(v);
    ASSERT_EQ(HttpPost(addr, "/pause?mode=keep", "").status, 200);
    HttpReply start = HttpPost(addr, "/start_weight_update",
                               json{{"is_checkpoint_format", anchor}}.dump());
    ASSERT_EQ(start.status, 200) << start.body;
    EXPECT_EQ(start.json["is_checkpoint_format"], anchor);
    EXPECT_EQ(StatusOf(addr)["in_weight_update"], true);
    HttpReply update = HttpPost(addr, "/update_weights",
                                json{{"update_info", {{"repo_id", "org/run"}, {"filename", key},
                                                      {"update_kind", anchor ? "dense" : "sparse_flat"}}}}
                                    .dump());
    ASSERT_EQ(update.status, 200) << update.body;
    EXPECT_EQ(update.json["version"], v);
    HttpReply finish = HttpPost(addr, "/finish_weight_update", "{}");
    ASSERT_EQ(finish.status, 200) << finish.body;
    EXPECT_EQ(finish.json["version"], v);
    EXPECT_EQ(finish.json["state_hash"], bucket.hash(v).Hex());
    ASSERT_EQ(HttpPost(addr, "/resume", "").status, 200);
    EXPECT_EQ(StatusOf(addr)["in_weight_update"], false);
  }
}

TEST(HttpRoutesTest, AWeightUpdateBracketHoldsTheWatcher) {
  TestBucket bucket;
  bucket.PublishRange(1, 2);
  auto daemon = StartFollowing(bucket.store(), 2);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  ASSERT_EQ(HttpPost(addr, "/start_weight_update", R"({"is_checkpoint_format": false})").status, 200);
  bucket.Publish(3);
  ASSERT_TRUE(WaitUntil([&] { return StatusOf(addr)["latest_version"] == 3; }));
  EXPECT_EQ(StatusOf(addr)["version"], 2) << "the trainer's /update_weights decides inside a bracket";
  ASSERT_EQ(HttpPost(addr, "/finish_weight_update", "").status, 200);
  EXPECT_TRUE(WaitForVersion(addr, 3));
}

TEST(HttpRoutesTest, NotifyWakesADaemonThatWouldNotPollForAnHour) {
  TestBucket bucket;
  bucket.Publish(1);
  ServerOptions options = DaemonOptions(bucket.store());
  options.poll_seconds = 3600;  // only the first read happens by itself
  auto daemon = StartDaemon(options);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  ASSERT_TRUE(WaitForVersion(addr, 1));
  bucket.PublishRange(2, 3);
  HttpReply notified = HttpPost(addr, "/notify", R"({"version": 3})");
  ASSERT_EQ(notified.status, 202) << notified.body;
  EXPECT_EQ(notified.json["notified"], 3);
  EXPECT_TRUE(WaitForVersion(addr, 3));
  EXPECT_EQ(StatusOf(addr)["state_hash"], bucket.hash(3).Hex());
  // A version already held is accepted and changes nothing.
  EXPECT_EQ(HttpPost(addr, "/notify", R"({"version": 2})").status, 202);
}

TEST(HttpRoutesTest, MalformedBodiesAre400AndTheDaemonKeepsServing) {
  TestBucket bucket;
  bucket.Publish(1);
  auto daemon = StartFollowing(bucket.store(), 1);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();

  const std::string deep = std::string(20000, '[') + std::string(20000, ']');
  struct Case {
    const char* path;
    std::string body;
  };
  std::vector<Case> cases = {
      {"/notify", "{"},
      {"/notify", "[1, 2]"},
      {"/notify", "null"},
      {"/notify", "{}"},
      {"/notify", R"({"version": 0})"},
      {"/notify", R"({"version": -1})"},
      {"/notify", R"({"version": 1.5})"},
      {"/notify", R"({"version": "3"})"},
      {"/notify", deep},
      {"/start_weight_update", "{}"},
      {"/start_weight_update", R"({"is_checkpoint_format": "yes"})"},
      {"/start_weight_update", "not json"},
      {"/update_weights", "{}"},
      {"/update_weights", R"({"update_info": "deltas/step_000001.safetensors"})"},
      {"/update_weights", R"({"update_info": {}})"},
      {"/update_weights", R"({"update_info": {"filename": 7}})"},
      {"/update_weights", R"({"update_info": {"filename": "anchors/step_000001.safetensors", "update_kind": "x"}})"},
      {"/update_weights", R"({"update_info": {"filename": "anchors/step_000001.safetensors", "repo_id": 1}})"},
      {"/finish_weight_update", "[]"},
      {"/finish_weight_update", "{\"a\":"},
      {"/pause", "\"keep\""},
      {"/resume", "{} trailing"},
      {"/notify", std::string("{\"version\": 1}\0", 15)},
  };
  for (const Case& c : cases) {
    HttpReply r = HttpPost(addr, c.path, c.body);
    EXPECT_EQ(r.status, 400) << c.path << " " << c.body.substr(0, 80) << " -> " << r.body;
    EXPECT_EQ(r.json["error"], "bad_request") << c.path;
    EXPECT_TRUE(r.json["message"].is_string()) << c.path;
  }
  EXPECT_EQ(HttpGet(addr, "/status").status, 200);
  EXPECT_EQ(HttpGet(addr, "/healthz").status, 200);
  // Valid ones still work after all that.
  EXPECT_EQ(HttpPost(addr, "/update_weights", UpdateWeightsBody(AnchorKey(1))).status, 200);
}

TEST(HttpRoutesTest, OversizedBodiesAre413AndTheDaemonKeepsServing) {
  TestBucket bucket;
  bucket.Publish(1);
  ServerOptions options = DaemonOptions(bucket.store());
  options.max_body_bytes = 1024;
  auto daemon = StartDaemon(options);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();

  // With a Content-Length over the cap.
  std::string big = R"({"version": 1, "pad": ")" + std::string(2000, 'x') + "\"}";
  HttpReply sized = HttpPost(addr, "/notify", big);
  EXPECT_EQ(sized.status, 413) << sized.body;
  EXPECT_EQ(sized.json["error"], "payload_too_large");

  // Chunked, without a length: capped while reading.
  auto c = Client(addr);
  httplib::Result chunked = c->Post(
      "/notify",
      [&](size_t offset, httplib::DataSink& sink) {
        if (offset >= 1 << 20) {
          sink.done();
          return true;
        }
        std::string chunk(4096, ' ');
        return sink.write(chunk.data(), chunk.size());
      },
      "application/json");
  // The daemon answers 413 and closes; depending on timing the client sees
  // the answer or a reset mid-upload. Either way the body was refused.
  if (chunked) EXPECT_EQ(chunked->status, 413) << chunked->body;

  // At the cap exactly, the body is read (and judged on its JSON).
  std::string at_cap = R"({"version": 1, "pad": ")";
  at_cap += std::string(1024 - at_cap.size() - 2, 'x') + "\"}";
  ASSERT_EQ(at_cap.size(), 1024u);
  EXPECT_EQ(HttpPost(addr, "/notify", at_cap).status, 202);
  EXPECT_EQ(HttpGet(addr, "/status").status, 200);
  EXPECT_NE(HttpGet(addr, "/metrics").body.find("route=\"/notify\",code=\"413\""), std::string::npos);
}

TEST(HttpRoutesTest, MutatingRoutesNeedTheTokenAndItIsNeverLogged) {
  TestBucket bucket;
  bucket.Publish(1);
  const std::string token = "tok-3f9a8c1e5b7d2046";
  ServerOptions options = DaemonOptions(bucket.store());
  options.token = token;
  auto lines = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  options.log = [lines, mu](LogLevel, std::string_view line) {
    std::lock_guard lock(*mu);
    lines->emplace_back(line);
  };
  auto daemon = StartDaemon(options);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  ASSERT_TRUE(WaitForVersion(addr, 1));

  std::vector<std::pair<std::string, std::string>> posts = {
      {"/pause", ""},
      {"/resume", ""},
      {"/start_weight_update", R"({"is_checkpoint_format": true})"},
      {"/finish_weight_update", "{}"},
      {"/update_weights", UpdateWeightsBody(AnchorKey(1))},
      {"/notify", R"({"version": 1})"},
  };
  for (const auto& [path, body] : posts) {
    HttpReply none = HttpPost(addr, path, body);
    EXPECT_EQ(none.status, 401) << path;
    EXPECT_EQ(none.json["error"], "unauthorized");
    EXPECT_EQ(Header(none, "WWW-Authenticate"), "Bearer realm=\"deltasync\"");
    EXPECT_EQ(HttpPost(addr, path, body, token + "x").status, 401) << path;
    EXPECT_EQ(HttpPost(addr, path, body, token.substr(0, token.size() - 1)).status, 401) << path;
    auto basic = Client(addr);
    basic->set_basic_auth("user", token);
    EXPECT_EQ(ToReply(basic->Post(path.c_str(), body, "application/json")).status, 401) << path;
    HttpReply good = HttpPost(addr, path, body, token);
    EXPECT_TRUE(good.status == 200 || good.status == 202) << path << ": " << good.body;
  }
  // Reads stay open.
  EXPECT_EQ(HttpGet(addr, "/status").status, 200);
  EXPECT_EQ(HttpGet(addr, "/healthz").status, 200);
  EXPECT_EQ(HttpGet(addr, "/metrics").status, 200);

  daemon->Stop();
  std::lock_guard lock(*mu);
  EXPECT_FALSE(lines->empty());
  for (const std::string& line : *lines) EXPECT_EQ(line.find(token), std::string::npos) << line;
}

TEST(HttpRoutesTest, UnknownRoutesAndWrongMethods) {
  TestBucket bucket;
  bucket.Publish(1);
  auto daemon = StartDaemon(DaemonOptions(bucket.store()));
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();

  HttpReply missing = HttpGet(addr, "/nope");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.json["error"], "not_found");
  HttpReply get_pause = HttpGet(addr, "/pause");
  EXPECT_EQ(get_pause.status, 405);
  EXPECT_EQ(Header(get_pause, "Allow"), "POST");
  HttpReply post_status = HttpPost(addr, "/status", "{}");
  EXPECT_EQ(post_status.status, 405);
  EXPECT_EQ(Header(post_status, "Allow"), "GET, HEAD");
  EXPECT_EQ(ToReply(Client(addr)->Head("/status")).status, 200);
  EXPECT_EQ(HttpGet(addr, "/status").status, 200);
  // Each answer is counted before it is written: a scrape right after sees
  // all of them (unknown paths under one label, so they cannot grow /metrics).
  const std::string m = HttpGet(addr, "/metrics").body;
  EXPECT_NE(m.find("deltasync_http_requests_total{route=\"other\",code=\"404\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("deltasync_http_requests_total{route=\"/pause\",code=\"405\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("deltasync_http_requests_total{route=\"/status\",code=\"405\"} 1\n"), std::string::npos) << m;
  EXPECT_NE(m.find("deltasync_http_requests_total{route=\"/status\",code=\"200\"} 2\n"), std::string::npos) << m;
}

// A POST without Content-Length has no body (HTTP/1.1); the daemon must
// answer it at once rather than wait for the client to close.
TEST(HttpRoutesTest, PostWithoutContentLengthIsAnsweredAsAnEmptyBody) {
  TestBucket bucket;
  bucket.Publish(1);
  auto daemon = StartDaemon(DaemonOptions(bucket.store()));
  ASSERT_TRUE(daemon);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(daemon->port()));
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
  std::string request = "POST /resume HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  char buf[512] = {};
  ssize_t n = ::recv(fd, buf, sizeof buf - 1, 0);
  ::close(fd);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, 12), "HTTP/1.1 200") << buf;
}

TEST(HttpRoutesTest, UpdateWeightsFailsLoudlyAndKeepsTheLastGoodVersion) {
  TestBucket bucket;
  bucket.PublishRange(1, 2);
  auto daemon = StartFollowing(bucket.store(), 2);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  ASSERT_EQ(HttpPost(addr, "/pause", "").status, 200);
  bucket.PublishRange(3, 3);
  // Damage the delta of 3 in place: same size, different bytes.
  auto blob = bucket.store()->Get(DeltaKey(3));
  ASSERT_TRUE(blob.ok());
  std::vector<uint8_t> bytes(blob->data(), blob->data() + blob->size());
  bytes[bytes.size() - 1] ^= 0x01;
  ASSERT_TRUE(bucket.store()->Put(DeltaKey(3), ByteSpan(bytes)).ok());

  HttpReply failed = HttpPost(addr, "/update_weights", UpdateWeightsBody(DeltaKey(3)));
  EXPECT_EQ(failed.status, 500) << failed.body;
  EXPECT_EQ(failed.json["error"], "integrity");
  EXPECT_EQ(failed.json["version"], 2);
  EXPECT_EQ(failed.json["state_hash"], bucket.hash(2).Hex());
  EXPECT_NE(failed.json["message"].get<std::string>().find(DeltaKey(3)), std::string::npos);
  json s = StatusOf(addr);
  EXPECT_EQ(s["version"], 2);
  EXPECT_EQ(s["last_error"]["stage"], "update");
  EXPECT_EQ(s["last_error"]["kind"], "integrity");
  // Still a verified version and a fresh manifest: healthy, and lagging.
  EXPECT_EQ(HttpGet(addr, "/healthz").status, 200);
  EXPECT_EQ(s["lag_versions"], 1);
  EXPECT_NE(HttpGet(addr, "/metrics").body.find("deltasync_errors_total{stage=\"update\",kind=\"integrity\"} 1"),
            std::string::npos);
}

}  // namespace
}  // namespace deltasync::testing
