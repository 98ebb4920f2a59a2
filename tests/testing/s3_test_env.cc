#include "testing/s3_test_env.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>

#include "store/s3_client.h"
#include "store/s3_config.h"

namespace deltasync::testing {

std::optional<S3TestServer> FindS3TestServer() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v == nullptr ? "" : v;
  };
  S3TestServer s;
  s.endpoint = env("AWS_ENDPOINT_URL_S3");
  if (s.endpoint.empty()) s.endpoint = env("AWS_ENDPOINT_URL");
  if (s.endpoint.empty()) return std::nullopt;
  s.access_key = env("AWS_ACCESS_KEY_ID");
  s.secret_key = env("AWS_SECRET_ACCESS_KEY");
  s.region = env("AWS_REGION");
  if (s.region.empty()) s.region = "us-east-1";
  constexpr std::string_view kLoopback = "http://127.0.0.1:";
  if (s.endpoint.compare(0, kLoopback.size(), kLoopback) == 0) {
    s.loopback_port = static_cast<uint16_t>(std::atoi(s.endpoint.c_str() + kLoopback.size()));
  }
  return s;
}

S3Options S3TestOptions(const S3TestServer& server) {
  S3Options o;
  o.endpoint = server.endpoint;
  o.region = server.region;
  o.access_key = server.access_key;
  o.secret_key = server.secret_key;
  o.read_environment = false;
  o.backoff_base = std::chrono::milliseconds(10);
  o.backoff_max = std::chrono::milliseconds(200);
  return o;
}

std::string UniqueBucketName(std::string_view tag) {
  static std::atomic<int> counter{0};
  return "ds-test-" + std::string(tag) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(counter.fetch_add(1));
}

void RemoveBucket(const S3TestServer& server, const std::string& bucket) {
  S3Options o = S3TestOptions(server);
  Result<std::unique_ptr<S3Store>> store = S3Store::Open("s3://" + bucket, o);
  if (!store.ok()) return;
  size_t aborted = 0;
  (void)(*store)->AbortStaleUploads(std::chrono::seconds(0), &aborted);
  Result<std::vector<std::string>> keys = (*store)->List("");
  if (keys.ok()) {
    for (const std::string& k : *keys) (void)(*store)->Delete(k);
  }
  Result<s3::ResolvedConfig> config = s3::ResolveConfig(o, bucket, s3::ProcessEnvironment());
  if (!config.ok()) return;
  s3::S3Client client(std::move(*config), bucket, "");
  (void)client.Send(s3::S3Call("DELETE", ""));
}

std::shared_ptr<S3Store> MakeTestBucket(const S3TestServer& server, S3Options options, std::string_view tag,
                                        std::string_view prefix) {
  std::string bucket = UniqueBucketName(tag);
  options.create_bucket = true;
  std::string url = "s3://" + bucket + (prefix.empty() ? "" : "/" + std::string(prefix));
  Result<std::unique_ptr<S3Store>> store = S3Store::Open(url, options);
  if (!store.ok()) {
    ADD_FAILURE() << "cannot create test bucket " << bucket << ": " << store.status().ToString();
    return nullptr;
  }
  return std::shared_ptr<S3Store>(std::move(store).value().release(), [server, bucket](S3Store* s) {
    delete s;
    RemoveBucket(server, bucket);
  });
}

}  // namespace deltasync::testing
