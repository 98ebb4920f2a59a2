// --out DIR --keep N: one complete safetensors file per version, the newest
// N kept, latest.json last, other files untouched, failures reported and
// retried.
#include <filesystem>
#include <fstream>

#include "deltasync/patch.h"
#include "deltasync/safetensors.h"
#include "server/out_dir.h"
#include "server/server_test_util.h"

namespace deltasync::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<std::string> StepFiles(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n.rfind("step_", 0) == 0) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The file's full state hash and model_version. A plain checkpoint:
// transformers refuses any "format" but "pt".
std::pair<StateHash, uint64_t> HashOfFile(const std::string& path) {
  auto file = SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  if (!file.ok()) return {};
  const Metadata& meta = file->metadata();
  EXPECT_EQ(meta.count("format") ? meta.at("format") : "", "pt");
  EXPECT_TRUE(meta.count("model_version"));
  if (!meta.count("model_version")) return {};
  return {HashTensors(file->tensors()), std::stoull(meta.at("model_version"))};
}

TEST(OutDirTest, OneFilePerVersionNewestKeptOthersUntouched) {
  TestBucket bucket;
  bucket.Publish(1);
  const std::string out = bucket.tmp().Sub("out");
  fs::create_directories(out);
  std::ofstream(out + "/notes.txt") << "the engine's own file";
  std::ofstream(out + "/step_abc.safetensors") << "not ours either";
  ServerOptions options = DaemonOptions(bucket.store());
  options.out_dir = out;
  options.keep = 2;
  auto daemon = StartDaemon(options);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  ASSERT_TRUE(WaitForVersion(addr, 1));
  ASSERT_EQ(HttpPost(addr, "/pause", "").status, 200);
  bucket.PublishRange(2, 5);
  // Step by step, so that every version is held (and written) once.
  for (uint64_t v = 2; v <= 5; ++v) {
    HttpReply r = HttpPost(addr, "/update_weights", UpdateWeightsBody(DeltaKey(v)));
    ASSERT_EQ(r.status, 200) << r.body;
    // Answered when held: the file is there already.
    auto [hash, model_version] = HashOfFile(out + "/" + server::OutDirSink::FileName(v));
    EXPECT_EQ(hash, bucket.hash(v)) << v;
    EXPECT_EQ(model_version, v);
  }
  EXPECT_EQ(StepFiles(out), (std::vector<std::string>{"step_000004.safetensors", "step_000005.safetensors",
                                                       "step_abc.safetensors"}));
  EXPECT_TRUE(fs::exists(out + "/notes.txt"));

  std::ifstream in(out + "/latest.json");
  json latest = json::parse(in, nullptr, false);
  ASSERT_TRUE(latest.is_object());
  EXPECT_EQ(latest["version"], 5);
  EXPECT_EQ(latest["file"], "step_000005.safetensors");
  EXPECT_EQ(latest["state_hash"], bucket.hash(5).Hex());
  EXPECT_EQ(latest["size"], fs::file_size(out + "/step_000005.safetensors"));
}

TEST(OutDirTest, AFailedWriteIsReportedAndRetried) {
  TestBucket bucket;
  bucket.Publish(1);
  const std::string out = bucket.tmp().Sub("out");
  ServerOptions options = DaemonOptions(bucket.store());
  options.out_dir = out;
  auto daemon = StartDaemon(options);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  ASSERT_TRUE(WaitForVersion(addr, 1));
  ASSERT_TRUE(WaitUntil([&] { return fs::exists(out + "/step_000001.safetensors"); }));

  // A file where the directory was: every write fails (even as root).
  // Paused while swapping, so that no write is in flight.
  ASSERT_EQ(HttpPost(addr, "/pause", "").status, 200);
  fs::remove_all(out);
  std::ofstream(out) << "in the way";
  bucket.Publish(2);
  ASSERT_EQ(HttpPost(addr, "/resume", "").status, 200);
  ASSERT_TRUE(WaitUntil([&] { return !StatusOf(addr)["export_error"].is_null(); }));
  json s = StatusOf(addr);
  EXPECT_EQ(s["version"], 2) << "the replica moved; the file lags";
  EXPECT_EQ(s["last_error"]["stage"], "export");
  HttpReply health = HttpGet(addr, "/healthz");
  EXPECT_EQ(health.status, 503);
  EXPECT_NE(health.json["reason"].get<std::string>().find("--out"), std::string::npos) << health.body;

  fs::remove(out);
  fs::create_directories(out);
  ASSERT_TRUE(WaitUntil([&] { return HttpGet(addr, "/healthz").status == 200; }));
  EXPECT_EQ(HashOfFile(out + "/step_000002.safetensors").first, bucket.hash(2));
  EXPECT_TRUE(StatusOf(addr)["export_error"].is_null());
}

TEST(OutDirTest, BadOptionsAreRefusedAtStart) {
  TestBucket bucket;
  ServerOptions options = DaemonOptions(bucket.store());
  options.out_dir = bucket.tmp().Sub("out");
  options.keep = 0;
  options.listen = "127.0.0.1:0";
  auto server = Server::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("--keep"), std::string::npos);
}

}  // namespace
}  // namespace deltasync::testing
