// `deltasync serve` as a process: the "listening on" line, clean stops on
// SIGTERM/SIGINT, usage errors, a daemon killed with SIGKILL in the middle
// of an update that comes back on a verified version (with complete --out
// folders only), and `deltasync publish --notify`.
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "deltasync/patch.h"
#include "deltasync/safetensors.h"
#include "deltasync/shm.h"
#include "server/out_dir.h"
#include "server/server_test_util.h"

namespace deltasync::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

#define REQUIRE_CLI() \
  if (!fs::exists(CliPath())) GTEST_FAIL() << CliPath() << " is missing: build the deltasync target first"

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// Runs the CLI to completion; returns the wait status and fills `output`.
int RunCli(const std::vector<std::string>& args, std::string* output = nullptr) {
  ChildProcess child;
  std::vector<std::string> argv = {CliPath()};
  argv.insert(argv.end(), args.begin(), args.end());
  if (!child.Start(argv)) return -1;
  int status = child.Wait();
  if (output) *output = child.Output();
  return status;
}

int ExitCode(int wait_status) { return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1; }

TEST(ProcessTest, PrintsListeningOnAndStopsCleanlyOnSigtermAndSigint) {
  REQUIRE_CLI();
  TestBucket bucket;
  bucket.Publish(1);
  const std::string token = "proc-token-5150";
  const std::string token_file = WriteFile(bucket.tmp().Sub("token"), token + "\n");
  for (int sig : {SIGTERM, SIGINT}) {
    const std::string shm = UniqueShmName("proc");
    ChildProcess child;
    ASSERT_TRUE(child.Start({CliPath(), "serve", "--bucket", bucket.dir(), "--listen", "127.0.0.1:0", "--poll",
                             "0.05", "--token-file", token_file, "--shm", shm, "--threads", "1"}));
    const std::string addr = child.WaitForAddress();
    ASSERT_TRUE(std::regex_match(addr, std::regex(R"(127\.0\.0\.1:[1-9][0-9]*)"))) << child.Output();
    ASSERT_TRUE(WaitForVersion(addr, 1)) << child.Output();
    EXPECT_EQ(StatusOf(addr)["state_hash"], bucket.hash(1).Hex());
    EXPECT_EQ(HttpPost(addr, "/pause", "").status, 401);
    EXPECT_EQ(HttpPost(addr, "/pause", "", token).status, 200);

    child.Signal(sig);
    int status = child.Wait();
    EXPECT_TRUE(WIFEXITED(status)) << child.Output();
    EXPECT_EQ(ExitCode(status), 0) << child.Output();
    std::string out = child.Output();
    EXPECT_NE(out.find("stopping"), std::string::npos) << out;
    EXPECT_EQ(out.find(token), std::string::npos) << "the token was printed: " << out;
    EXPECT_EQ(ShmReader::Open(shm).status().code(), ErrorCode::kNotFound) << "the --shm name is removed";
  }
}

TEST(ProcessTest, UsageAndStartupErrors) {
  REQUIRE_CLI();
  TestBucket bucket;
  bucket.Publish(1);
  std::string out;
  EXPECT_EQ(ExitCode(RunCli({"serve"}, &out)), 2) << out;
  EXPECT_EQ(ExitCode(RunCli({"serve", "--bucket", bucket.dir(), "--keep", "3"}, &out)), 2) << out;
  EXPECT_EQ(ExitCode(RunCli({"serve", "--bucket", bucket.dir(), "--tls-cert", "x.pem"}, &out)), 2) << out;
  EXPECT_EQ(ExitCode(RunCli({"serve", "--bucket", bucket.dir(), "--poll", "0"}, &out)), 2) << out;

  EXPECT_EQ(ExitCode(RunCli({"serve", "--bucket", bucket.dir(), "--listen", "nonsense"}, &out)), 1);
  EXPECT_NE(out.find("deltasync: error: --listen 'nonsense'"), std::string::npos) << out;
  EXPECT_EQ(ExitCode(RunCli({"serve", "--bucket", bucket.tmp().Sub("missing/dir"), "--listen", "127.0.0.1:0"},
                            &out)),
            1);
  EXPECT_NE(out.find("deltasync: error:"), std::string::npos) << out;
  EXPECT_EQ(ExitCode(RunCli({"serve", "--bucket", bucket.dir(), "--token-file", bucket.tmp().Sub("nope")}, &out)), 1);
  EXPECT_NE(out.find("token file"), std::string::npos) << out;
  WriteFile(bucket.tmp().Sub("empty"), "\n");
  EXPECT_EQ(ExitCode(RunCli({"serve", "--bucket", bucket.dir(), "--token-file", bucket.tmp().Sub("empty")}, &out)),
            1);
  EXPECT_NE(out.find("empty"), std::string::npos) << out;

  // A port already taken.
  auto daemon = StartDaemon(DaemonOptions(bucket.store()));
  ASSERT_TRUE(daemon);
  EXPECT_EQ(ExitCode(RunCli({"serve", "--bucket", bucket.dir(), "--listen", daemon->address()}, &out)), 1);
  EXPECT_NE(out.find("cannot listen on " + daemon->address()), std::string::npos) << out;
}

// Big enough that loading and writing it takes a while, so SIGKILL lands
// inside an update (the daemon logs "loading"/"catching up" right before
// it starts moving, and "holding" once it holds the version).
class BigModel {
 public:
  BigModel() : rng_(99), a_(4 << 20), b_(1 << 20) {
    for (auto& x : a_) x = static_cast<uint16_t>(0x3c00 + rng_() % 512);
    for (auto& x : b_) x = static_cast<uint16_t>(0x3c00 + rng_() % 512);
  }
  void Step(double fraction) {
    for (auto* t : {&a_, &b_}) {
      uint64_t n = static_cast<uint64_t>(fraction * t->size());
      for (uint64_t i = 0; i < n; ++i) (*t)[rng_() % t->size()] ^= 1;
    }
  }
  std::vector<TensorView> Views() const {
    return {TensorView{"a.weight", DType::kBF16, {4096, 1024}, Bytes(a_)},
            TensorView{"b.weight", DType::kBF16, {1024, 1024}, Bytes(b_)}};
  }

 private:
  static ByteSpan Bytes(const std::vector<uint16_t>& v) {
    return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * 2};
  }
  std::mt19937_64 rng_;
  std::vector<uint16_t> a_, b_;
};

// Every step_* folder in `dir` is a complete model folder verified against
// the manifest; latest and latest.json, when present, name one of them.
void ExpectOnlyCompleteFolders(const std::string& dir, Store& bucket) {
  if (!fs::exists(dir)) return;
  auto blob = bucket.Get(kManifestKey);
  ASSERT_TRUE(blob.ok());
  auto manifest = Manifest::Parse(blob->bytes());
  ASSERT_TRUE(manifest.ok());
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.rfind("step_", 0) != 0) continue;
    ASSERT_TRUE(e.is_directory()) << name;
    // Published from a plain file: the folder is one model.safetensors.
    auto file = SafetensorsFile::Open(e.path().string() + "/model.safetensors");
    ASSERT_TRUE(file.ok()) << name << ": " << file.status().ToString();
    // A plain checkpoint (format "pt") naming its model_version.
    const Metadata& meta = file->metadata();
    ASSERT_TRUE(meta.count("format") && meta.at("format") == "pt") << name;
    ASSERT_TRUE(meta.count("model_version")) << name;
    const VersionEntry* v = manifest->Find(std::stoull(meta.at("model_version")));
    ASSERT_NE(v, nullptr) << name;
    EXPECT_EQ(server::OutDirSink::FolderName(v->version), name);
    EXPECT_EQ(HashTensors(file->tensors()), v->state_hash) << name;
  }
  if (fs::is_symlink(dir + "/latest")) {
    EXPECT_TRUE(fs::exists(dir + "/latest/model.safetensors")) << fs::read_symlink(dir + "/latest");
  }
  if (fs::exists(dir + "/latest.json")) {
    std::ifstream in(dir + "/latest.json");
    json latest = json::parse(in, nullptr, false);
    ASSERT_TRUE(latest.is_object()) << "latest.json is whole";
    EXPECT_TRUE(fs::exists(dir + "/" + latest["file"].get<std::string>()));
    EXPECT_TRUE(fs::is_directory(dir + "/" + latest["dir"].get<std::string>()));
  }
}

TEST(ProcessTest, KilledMidUpdateComesBackOnAVerifiedVersion) {
  REQUIRE_CLI();
  TempDir tmp;
  const std::string dir = tmp.Sub("bucket");
  auto store = OpenDirStore(dir);
  auto publisher = Publisher::Open(store, {.anchor_interval = 1000});
  ASSERT_TRUE(publisher.ok());
  BigModel model;
  std::map<uint64_t, StateHash> hashes;
  uint64_t version = 0;
  auto publish = [&](int n) {
    for (int i = 0; i < n; ++i) {
      if (version > 0) model.Step(0.05);
      auto stats = (*publisher)->Publish(++version, model.Views());
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
      hashes[version] = stats->state_hash;
    }
  };
  publish(20);
  const std::string out = tmp.Sub("out");
  const std::string shm = UniqueShmName("kill");
  const std::vector<std::string> args = {CliPath(), "serve",   "--bucket", dir,   "--listen", "127.0.0.1:0",
                                         "--out",   out,       "--keep",   "2",   "--shm",    shm,
                                         "--poll",  "0.02",    "--threads", "1"};
  for (int round = 0; round < 4; ++round) {
    ChildProcess child;
    ASSERT_TRUE(child.Start(args));
    if (round % 2 == 1) {
      // Killed while catching up five versions from one it holds (paused
      // while they are published, so that it moves in one go).
      const std::string addr = child.WaitForAddress();
      ASSERT_TRUE(child.WaitForLine("holding version")) << child.Output();
      ASSERT_EQ(HttpPost(addr, "/pause", "").status, 200);
      publish(5);
      ASSERT_EQ(HttpPost(addr, "/resume", "").status, 200);
      ASSERT_TRUE(child.WaitForLine("to version " + std::to_string(version))) << child.Output();
    } else {
      // Killed while loading its first version.
      ASSERT_TRUE(child.WaitForLine("loading version")) << child.Output();
    }
    child.Signal(SIGKILL);
    int status = child.Wait();
    EXPECT_TRUE(WIFSIGNALED(status));
    ExpectOnlyCompleteFolders(out, *store);
    publish(3);
  }

  ChildProcess child;
  ASSERT_TRUE(child.Start(args));
  const std::string addr = child.WaitForAddress();
  ASSERT_FALSE(addr.empty()) << child.Output();
  ASSERT_TRUE(WaitForVersion(addr, version)) << child.Output();
  json s = StatusOf(addr);
  EXPECT_EQ(s["version"], version);
  EXPECT_EQ(s["state_hash"], hashes[version].Hex());
  ASSERT_TRUE(WaitUntil([&] { return HttpGet(addr, "/healthz").status == 200; })) << StatusOf(addr).dump();
  ExpectOnlyCompleteFolders(out, *store);
  std::ifstream in(out + "/latest.json");
  EXPECT_EQ(json::parse(in, nullptr, false)["version"], version);
  auto reader = ShmReader::Open(shm);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto snap = (*reader)->Read();
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->version, version);
  std::vector<TensorView> views;
  for (const ShmTensor& t : snap->tensors) views.push_back(t.view());
  EXPECT_EQ(HashTensors(views), hashes[version]);
  child.Signal(SIGTERM);
  EXPECT_EQ(ExitCode(child.Wait()), 0);
}

TEST(ProcessTest, PublishNotifiesWithTheTokenFromAFile) {
  REQUIRE_CLI();
  TestBucket bucket;
  bucket.Publish(1);
  const std::string token = "cli-notify-token";
  ServerOptions options = DaemonOptions(bucket.store());
  options.poll_seconds = 3600;
  options.token = token;
  auto daemon = StartDaemon(options);
  ASSERT_TRUE(daemon);
  ASSERT_TRUE(WaitForVersion(daemon->address(), 1));

  // A full checkpoint of the next version, as a trainer would save it.
  bucket.model().Step(0.1);
  std::vector<TensorView> views = bucket.model().Views();
  auto encoded = EncodeAnchor(2, views);
  ASSERT_TRUE(encoded.ok());
  std::string checkpoint = bucket.tmp().Sub("ckpt.safetensors");
  {
    std::ofstream f(checkpoint, std::ios::binary);
    for (ByteSpan part : encoded->parts) f.write(reinterpret_cast<const char*>(part.data()), part.size());
  }
  std::string token_file = WriteFile(bucket.tmp().Sub("token"), token);
  std::string out;
  int status = RunCli({"publish", bucket.dir(), checkpoint, "--version", "2", "--anchor-interval", "4", "--notify",
                       "http://" + daemon->address(), "--notify-token-file", token_file},
                      &out);
  ASSERT_EQ(ExitCode(status), 0) << out;
  EXPECT_TRUE(WaitForVersion(daemon->address(), 2));
  EXPECT_EQ(StatusOf(daemon->address())["state_hash"], HashTensors(views).Hex());
}

}  // namespace
}  // namespace deltasync::testing
