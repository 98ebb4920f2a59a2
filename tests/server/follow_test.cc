// Daemons following a bucket: several replicas ending bit-exact with the
// trainer, the Publisher's /notify, damage that the watcher survives, and
// the notifier's fire-and-forget contract.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "deltasync/plan.h"
#include "deltasync/safetensors.h"
#include "server/out_dir.h"
#include "server/server_test_util.h"
#include "sync/notifier.h"

namespace deltasync::testing {
namespace {

using nlohmann::json;

// The tensors of a safetensors file equal the model's, byte for byte.
void ExpectFileEqualsModel(const std::string& path, RandomModel& model) {
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  std::vector<TensorView> want = model.Views();
  ASSERT_EQ(file->tensors().size(), want.size());
  for (const TensorView& w : want) {
    const TensorView* got = nullptr;
    for (const TensorView& t : file->tensors()) {
      if (t.name == w.name) got = &t;
    }
    ASSERT_NE(got, nullptr) << w.name;
    EXPECT_EQ(got->dtype, w.dtype) << w.name;
    EXPECT_EQ(got->shape, w.shape) << w.name;
    EXPECT_TRUE(std::equal(got->data.begin(), got->data.end(), w.data.begin(), w.data.end())) << w.name;
  }
}

TEST(FollowTest, TwoDaemonsFollowingOneBucketEndBitExact) {
  TestBucket bucket(7);
  bucket.Publish(1);
  std::vector<std::unique_ptr<Server>> daemons;
  for (int i = 0; i < 2; ++i) {
    ServerOptions options = DaemonOptions(bucket.store());
    options.out_dir = bucket.tmp().Sub("out" + std::to_string(i));
    options.keep = 1;
    // One of each --out layout.
    options.out_layout = i == 0 ? OutLayout::kFolder : OutLayout::kFile;
    daemons.push_back(StartDaemon(options));
    ASSERT_TRUE(daemons.back());
  }
  // Publish while they follow, with gaps and changing sparsity; they see
  // some versions one by one and skip others.
  std::mt19937_64 rng(7);
  uint64_t version = 1;
  for (int i = 0; i < 30; ++i) {
    version += 1 + rng() % 2;
    bucket.Publish(version, std::uniform_real_distribution<double>(0.0, 0.3)(rng));
    if (i % 7 == 0) ASSERT_TRUE(WaitForVersion(daemons[0]->address(), version));
  }
  for (size_t i = 0; i < daemons.size(); ++i) {
    const std::string addr = daemons[i]->address();
    ASSERT_TRUE(WaitForVersion(addr, version)) << "daemon " << i;
    json s = StatusOf(addr);
    EXPECT_EQ(s["version"], version);
    EXPECT_EQ(s["state_hash"], bucket.hash(version).Hex()) << "daemon " << i;
    EXPECT_EQ(s["lag_versions"], 0);
    // The --out folder's or file's weights: the trainer's, bit for bit.
    const std::string file = bucket.tmp().Sub("out" + std::to_string(i)) + "/" +
                             (i == 0 ? server::OutDirSink::FolderName(version) + "/model.safetensors"
                                     : server::OutDirSink::FileName(version));
    ASSERT_TRUE(WaitUntil([&] { return std::filesystem::exists(file); }));
    ExpectFileEqualsModel(file, bucket.model());
  }
}

TEST(FollowTest, ThePublisherNotifiesDaemonsThatWouldNotPoll) {
  TempDir tmp;
  auto store = OpenDirStore(tmp.Sub("bucket"));
  RandomModel model(3);
  // Version 1 first, so the daemons start on something.
  {
    auto p = Publisher::Open(store, {.anchor_interval = 4});
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE((*p)->Publish(1, model.Views()).ok());
  }
  const std::string token = "notify-token-77";
  std::vector<std::unique_ptr<Server>> daemons;
  for (int i = 0; i < 2; ++i) {
    ServerOptions options = DaemonOptions(store);
    options.poll_seconds = 3600;  // moves only when told
    options.token = token;
    daemons.push_back(StartDaemon(options));
    ASSERT_TRUE(daemons.back());
    ASSERT_TRUE(WaitForVersion(daemons.back()->address(), 1));
  }
  PublisherOptions options{.anchor_interval = 4};
  // Both URL forms: bare origin, and with a trailing slash.
  options.notify_urls = {"http://" + daemons[0]->address(), "http://" + daemons[1]->address() + "/"};
  options.notify_token = token;
  auto publisher = Publisher::Open(store, options);
  ASSERT_TRUE(publisher.ok()) << publisher.status().ToString();
  StateHash last;
  for (uint64_t v = 2; v <= 6; ++v) {
    model.Step(0.05);
    auto stats = (*publisher)->Publish(v, model.Views());
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    last = stats->state_hash;
  }
  for (auto& d : daemons) {
    ASSERT_TRUE(WaitForVersion(d->address(), 6));
    EXPECT_EQ(StatusOf(d->address())["state_hash"], last.Hex());
    EXPECT_NE(HttpGet(d->address(), "/metrics").body.find("route=\"/notify\",code=\"202\""), std::string::npos);
  }
}

// Fire and forget: a replica that takes forever to answer /notify must not
// hold up Publish. The replica here blocks until the test releases it after
// Publish returned; had Publish waited for it, the handler would time out
// instead (and Publish would have taken 30 s).
TEST(FollowTest, PublishNeverWaitsForASlowReplica) {
  httplib::Server slow;
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  std::atomic<int> released_in_time{0}, timed_out{0};
  slow.Post("/notify", [&](const httplib::Request&, httplib::Response& res) {
    std::unique_lock lock(mu);
    if (cv.wait_for(lock, std::chrono::seconds(30), [&] { return released; })) {
      released_in_time++;
    } else {
      timed_out++;
    }
    res.status = 202;
  });
  int port = slow.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread server([&] { slow.listen_after_bind(); });

  {
    TempDir tmp;
    RandomModel model(5);
    PublisherOptions options;
    options.notify_urls = {"http://127.0.0.1:" + std::to_string(port)};
    auto publisher = Publisher::Open(OpenDirStore(tmp.Sub("bucket")), options);
    ASSERT_TRUE(publisher.ok());
    ASSERT_TRUE((*publisher)->Publish(1, model.Views()).ok());
    model.Step(0.05);
    ASSERT_TRUE((*publisher)->Publish(2, model.Views()).ok());
    {
      std::lock_guard lock(mu);
      released = true;
    }
    cv.notify_all();
    // Destroying the publisher delivers what is pending, then joins.
  }
  slow.stop();
  server.join();
  EXPECT_GE(released_in_time.load(), 1);
  EXPECT_EQ(timed_out.load(), 0);
}

TEST(FollowTest, NotifierCountsFailuresAndLogsOncePerUrl) {
  TestBucket bucket;
  bucket.Publish(1);
  auto daemon = StartDaemon(DaemonOptions(bucket.store()));
  ASSERT_TRUE(daemon);
  // A port nothing listens on: bind one, note it, close it.
  int dead_port = 0;
  {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa), 0);
    ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len), 0);
    dead_port = ntohs(sa.sin_port);
    ::close(fd);
  }
  ::testing::internal::CaptureStderr();
  {
    Notifier notifier({"http://" + daemon->address(), "http://127.0.0.1:" + std::to_string(dead_port),
                       "ftp://example.com"},
                      "");
    for (uint64_t v = 1; v <= 3; ++v) {
      notifier.Notify(v);
      ASSERT_TRUE(notifier.Flush(60));
    }
    EXPECT_EQ(notifier.delivered(), 3u);
    EXPECT_EQ(notifier.failed(), 6u);
  }
  std::string err = ::testing::internal::GetCapturedStderr();
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t at = err.find(needle); at != std::string::npos; at = err.find(needle, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("127.0.0.1:" + std::to_string(dead_port)), 1u) << err;
  EXPECT_EQ(count("ftp://example.com"), 1u) << err;
  EXPECT_EQ(count(daemon->address()), 0u) << err;
}

TEST(FollowTest, ADamagedDeltaKeepsTheLastGoodVersionUntilAnAnchorPassesIt) {
  TestBucket bucket;  // anchors at 1, 4, 8
  bucket.PublishRange(1, 2);
  auto daemon = StartFollowing(bucket.store(), 2);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  ASSERT_EQ(HttpPost(addr, "/pause", "").status, 200);
  bucket.Publish(3);
  ASSERT_TRUE(bucket.store()->Delete(DeltaKey(3)).ok());  // lost object
  ASSERT_EQ(HttpPost(addr, "/resume", "").status, 200);

  ASSERT_TRUE(WaitUntil([&] { return !StatusOf(addr)["last_error"].is_null(); }));
  json s = StatusOf(addr);
  EXPECT_EQ(s["version"], 2);
  EXPECT_EQ(s["last_error"]["stage"], "update");
  EXPECT_EQ(s["last_error"]["kind"], "not_found");
  EXPECT_NE(s["last_error"]["message"].get<std::string>().find(DeltaKey(3)), std::string::npos);
  ASSERT_EQ(s["bad_objects"].size(), 1u);
  EXPECT_EQ(s["bad_objects"][0]["key"], DeltaKey(3));
  EXPECT_EQ(s["bad_objects"][0]["kind"], "not_found");
  EXPECT_EQ(HttpGet(addr, "/healthz").status, 200) << "a verified version and a fresh manifest";

  // Deltas after the hole cannot help; the anchor of 4 can.
  bucket.Publish(4);
  ASSERT_TRUE(WaitForVersion(addr, 4));
  EXPECT_EQ(StatusOf(addr)["state_hash"], bucket.hash(4).Hex());
  ASSERT_TRUE(WaitUntil([&] { return StatusOf(addr)["last_error"].is_null(); }));
  bucket.Publish(5);
  EXPECT_TRUE(WaitForVersion(addr, 5));
  EXPECT_EQ(StatusOf(addr)["state_hash"], bucket.hash(5).Hex());
}

// A daemon stuck on a missing step delta moves on when a restarted trainer
// publishes the full weights as a recovered, anchor-only version.
TEST(FollowTest, ADaemonFollowsThroughARecoveredVersion) {
  TestBucket bucket;  // anchors at 1, 4, 8
  bucket.PublishRange(1, 5);
  auto daemon = StartFollowing(bucket.store(), 5);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  ASSERT_EQ(HttpPost(addr, "/pause", "").status, 200);
  bucket.Publish(6);
  ASSERT_TRUE(bucket.store()->Delete(DeltaKey(6)).ok());  // lost object
  ASSERT_EQ(HttpPost(addr, "/resume", "").status, 200);
  ASSERT_TRUE(WaitUntil([&] { return !StatusOf(addr)["last_error"].is_null(); }));
  EXPECT_EQ(StatusOf(addr)["version"], 5);

  auto restarted = Publisher::Open(bucket.store());
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  ASSERT_TRUE((*restarted)->degraded());
  for (uint64_t v : {7, 8, 9}) {
    bucket.model().Step(0.05);
    Result<PublishStats> stats = (*restarted)->Publish(v, bucket.model().Views());
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->recovered, v == 7);
    ASSERT_TRUE(WaitForVersion(addr, v));
    EXPECT_EQ(StatusOf(addr)["state_hash"], stats->state_hash.Hex()) << "version " << v;
  }
  EXPECT_TRUE(StatusOf(addr)["last_error"].is_null());
}

TEST(FollowTest, ADamagedCumulativeDeltaIsRoutedAroundAndReportedOnce) {
  TestBucket bucket(1, {.anchor_interval = 100, .cumulative_interval = 4});
  bucket.PublishRange(1, 9);
  // The cumulative delta 1->9, the cheapest route from nothing: one byte
  // flipped, in a copy renamed over the object.
  std::string cumulative;
  const Manifest manifest = testing::ReadManifest(*bucket.store());
  for (const ObjectEntry& o : manifest.Find(9)->objects) {
    if (o.base_version == 1u) cumulative = o.key;
  }
  ASSERT_FALSE(cumulative.empty());
  {
    Result<CatchUpPlan> plan = PlanCatchUp(manifest, std::nullopt, 9);
    ASSERT_TRUE(plan.ok());
    ASSERT_EQ(plan->steps.size(), 2u) << "the fresh route is anchor 1 + the cumulative delta 1->9";
    ASSERT_EQ(plan->steps[1].object.key, cumulative);
  }
  {
    const std::string path = bucket.dir() + "/" + cumulative;
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes[bytes.size() / 2] ^= 0x01;
    std::ofstream(bucket.tmp().Sub("damaged"), std::ios::binary) << bytes;
    std::filesystem::rename(bucket.tmp().Sub("damaged"), path);
  }
  auto daemon = StartDaemon(DaemonOptions(bucket.store()));
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  ASSERT_TRUE(WaitForVersion(addr, 9));
  json s = StatusOf(addr);
  EXPECT_EQ(s["state_hash"], bucket.hash(9).Hex());
  EXPECT_EQ(s["lag_versions"], 0);
  EXPECT_TRUE(s["last_error"].is_null()) << s.dump();
  ASSERT_EQ(s["bad_objects"].size(), 1u) << s.dump();
  EXPECT_EQ(s["bad_objects"][0]["key"], cumulative);
  EXPECT_EQ(s["bad_objects"][0]["version"], 9);
  EXPECT_EQ(s["bad_objects"][0]["kind"], "integrity");
  EXPECT_NE(HttpGet(addr, "/metrics").body.find("deltasync_bad_objects 1\n"), std::string::npos);
  // Still listed (and not fetched again) after later versions.
  bucket.PublishRange(10, 11);
  ASSERT_TRUE(WaitForVersion(addr, 11));
  EXPECT_EQ(StatusOf(addr)["bad_objects"].size(), 1u);
}

TEST(FollowTest, ARolledBackBucketIsRefusedAndTheVersionKept) {
  TestBucket bucket;
  bucket.PublishRange(1, 3);
  auto daemon = StartFollowing(bucket.store(), 3);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  // Replace the manifest with one that stops at 2.
  auto blob = bucket.store()->Get(kManifestKey);
  ASSERT_TRUE(blob.ok());
  auto m = Manifest::Parse(blob->bytes());
  ASSERT_TRUE(m.ok());
  m->versions.pop_back();
  std::string text = m->ToJson();
  ASSERT_TRUE(bucket.store()->Put(kManifestKey, ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size())).ok());
  ASSERT_TRUE(WaitUntil([&] { return !StatusOf(addr)["last_error"].is_null(); }));
  json s = StatusOf(addr);
  EXPECT_EQ(s["version"], 3);
  EXPECT_EQ(s["last_error"]["kind"], "integrity");
  EXPECT_EQ(s["last_error"]["stage"], "manifest");
}

}  // namespace
}  // namespace deltasync::testing
