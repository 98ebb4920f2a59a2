// Session 48 review of the serve daemon's /notify and /status (H4): a notify is only a wake-up,
// never a version the daemon claims; /status read during updates never pairs a version with
// another version's state hash.
#include <atomic>
#include <thread>
#include <utility>
#include <vector>

#include "server/server_test_util.h"

namespace deltasync::testing {
namespace {

TEST(ServeReview, ANotifyForAVersionNotInTheBucketMovesNothing) {
  TestBucket bucket;
  bucket.Publish(1);
  ServerOptions options = DaemonOptions(bucket.store());
  options.poll_seconds = 3600;  // only /notify wakes it
  auto daemon = StartDaemon(options);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  ASSERT_TRUE(WaitForVersion(addr, 1));
  EXPECT_EQ(HttpPost(addr, "/notify", R"({"version": 9})").status, 202);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  nlohmann::json status = StatusOf(addr);
  EXPECT_EQ(status["version"], 1) << status.dump();
  EXPECT_EQ(status["state_hash"], bucket.hash(1).Hex());
  // The bucket then reaches a lower version than the notify named: the daemon takes that one.
  bucket.PublishRange(2, 3);
  EXPECT_EQ(HttpPost(addr, "/notify", R"({"version": 3})").status, 202);
  ASSERT_TRUE(WaitForVersion(addr, 3));
  status = StatusOf(addr);
  EXPECT_EQ(status["version"], 3);
  EXPECT_EQ(status["state_hash"], bucket.hash(3).Hex());
}

TEST(ServeReview, StatusDuringConcurrentNotifiesAlwaysPairsAVersionWithItsHash) {
  TestBucket bucket;
  bucket.Publish(1);
  ServerOptions options = DaemonOptions(bucket.store());
  options.poll_seconds = 3600;
  auto daemon = StartDaemon(options);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  ASSERT_TRUE(WaitForVersion(addr, 1));
  constexpr uint64_t kLast = 9;
  std::atomic<bool> done{false};
  std::vector<std::pair<uint64_t, std::string>> seen;  // (version, state_hash) from /status
  std::thread reader([&] {
    while (!done.load()) {
      nlohmann::json s = StatusOf(addr);
      if (s.is_object() && s["version"].is_number_unsigned() && s["state_hash"].is_string())
        seen.emplace_back(s["version"].get<uint64_t>(), s["state_hash"].get<std::string>());
    }
  });
  std::vector<std::thread> notifiers;
  std::atomic<uint64_t> published{1};
  for (int t = 0; t < 3; ++t) {
    notifiers.emplace_back([&] {
      while (!done.load()) HttpPost(addr, "/notify", "{\"version\": " + std::to_string(published.load()) + "}");
    });
  }
  for (uint64_t v = 2; v <= kLast; ++v) {
    bucket.Publish(v);
    published = v;
    HttpPost(addr, "/notify", "{\"version\": " + std::to_string(v) + "}");
  }
  EXPECT_TRUE(WaitForVersion(addr, kLast));
  done = true;
  reader.join();
  for (auto& t : notifiers) t.join();
  EXPECT_EQ(StatusOf(addr)["state_hash"], bucket.hash(kLast).Hex());
  ASSERT_FALSE(seen.empty());
  uint64_t previous = 0;
  for (const auto& [version, hash] : seen) {
    ASSERT_GE(version, 1u);
    ASSERT_LE(version, kLast);
    EXPECT_EQ(hash, bucket.hash(version).Hex()) << "version " << version;
    EXPECT_GE(version, previous) << "the held version went backwards";
    previous = version;
  }
}

}  // namespace
}  // namespace deltasync::testing
