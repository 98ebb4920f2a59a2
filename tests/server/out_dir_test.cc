// --out DIR --keep N: one complete model folder per version (with its side
// files, fetched once per change) or, with --out-layout file, one safetensors
// file; the newest N kept; the latest link and latest.json switched last;
// other entries untouched; failures reported, retried, and the previous
// latest left intact.
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <span>

#include "deltasync/manifest.h"
#include "deltasync/patch.h"
#include "deltasync/safetensors.h"
#include "deltasync/temp_file.h"
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

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

json LatestJson(const std::string& out) {
  std::ifstream in(out + "/latest.json");
  return json::parse(in, nullptr, false);
}

std::vector<SideFile> Files(std::initializer_list<std::pair<std::string, std::string>> files) {
  std::vector<SideFile> out;
  for (const auto& [name, text] : files) out.push_back(SideFile{name, Blob::FromVector({text.begin(), text.end()})});
  return out;
}

// The version's folder: its weights (model_version v, the trainer's state),
// exactly `side` besides model.safetensors, and latest -> it.
void ExpectFolder(const std::string& out, uint64_t v, const StateHash& want,
                  const std::map<std::string, std::string>& side) {
  const std::string dir = out + "/" + server::OutDirSink::FolderName(v);
  auto [hash, model_version] = HashOfFile(dir + "/model.safetensors");
  EXPECT_EQ(hash, want) << v;
  EXPECT_EQ(model_version, v);
  std::map<std::string, std::string> got;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string n = e.path().filename().string();
    if (n != "model.safetensors") got[n] = ReadText(e.path().string());
  }
  EXPECT_EQ(got, side) << v;
  EXPECT_EQ(fs::read_symlink(out + "/latest"), server::OutDirSink::FolderName(v)) << "relative link";
  json latest = LatestJson(out);
  ASSERT_TRUE(latest.is_object());
  EXPECT_EQ(latest["version"], v);
  EXPECT_EQ(latest["dir"], server::OutDirSink::FolderName(v));
  EXPECT_EQ(latest["file"], server::OutDirSink::FolderName(v) + "/model.safetensors");
  EXPECT_EQ(latest["state_hash"], want.Hex());
  EXPECT_EQ(latest["size"], fs::file_size(dir + "/model.safetensors"));
}

TEST(OutDirTest, OneModelFolderPerVersionWithItsSideFilesAndALatestLink) {
  TestBucket bucket;
  const std::vector<SideFile> v1_files = Files({{"config.json", "{\"rope_theta\": 1}"}});
  const std::vector<SideFile> v3_files = Files({{"config.json", "{\"rope_theta\": 3}"}, {"tokenizer.json", "{}"}});
  bucket.Publish(1, 0.05, std::span<const SideFile>(v1_files));
  const std::string out = bucket.tmp().Sub("out");
  fs::create_directories(out + "/step_abc");
  std::ofstream(out + "/notes.txt") << "the engine's own file";
  std::ofstream(out + "/step_000001.safetensors") << "a file, not the layout's kind: never touched";
  ServerOptions options = DaemonOptions(bucket.store());
  options.out_dir = out;
  options.keep = 2;
  auto daemon = StartDaemon(options);
  ASSERT_TRUE(daemon);
  const std::string addr = daemon->address();
  ASSERT_TRUE(WaitForVersion(addr, 1));
  ASSERT_EQ(HttpPost(addr, "/pause", "").status, 200);
  bucket.Publish(2);  // the side files of version 1, unchanged
  bucket.Publish(3, 0.05, std::span<const SideFile>(v3_files));
  bucket.Publish(4);
  const std::map<std::string, std::string> side1 = {{"config.json", "{\"rope_theta\": 1}"}};
  const std::map<std::string, std::string> side3 = {{"config.json", "{\"rope_theta\": 3}"}, {"tokenizer.json", "{}"}};
  ExpectFolder(out, 1, bucket.hash(1), side1);
  for (uint64_t v = 2; v <= 4; ++v) {
    HttpReply r = HttpPost(addr, "/update_weights", UpdateWeightsBody(DeltaKey(v)));
    ASSERT_EQ(r.status, 200) << r.body;
    // Answered when held: the folder and the link are there already.
    ExpectFolder(out, v, bucket.hash(v), v < 3 ? side1 : side3);
    if (v == 3) {
      // Fetched once per change: version 4 lists the same objects, so it
      // needs none of them from the bucket.
      for (const auto& e : fs::recursive_directory_iterator(bucket.dir() + "/ds/files")) {
        if (e.is_regular_file()) fs::rename(e.path(), e.path().string() + ".away");
      }
    }
  }
  std::vector<std::string> want = {"step_000001.safetensors", "step_000003", "step_000004", "step_abc"};
  EXPECT_EQ(StepFiles(out), want);
  EXPECT_TRUE(fs::exists(out + "/notes.txt"));
  for (const auto& e : fs::directory_iterator(out)) {
    EXPECT_NE(e.path().filename().string()[0], '.') << "nothing left beside: " << e.path();
  }

  // A side file that cannot be fetched: the export fails, is reported, and
  // the previous version stays what latest and latest.json name, whole.
  const std::vector<SideFile> v5_files = Files({{"config.json", "{\"rope_theta\": 5}"}});
  bucket.Publish(5, 0.05, std::span<const SideFile>(v5_files));
  std::string key;
  for (const auto& e : fs::recursive_directory_iterator(bucket.dir() + "/ds/files")) {
    if (e.is_regular_file() && e.path().extension() != ".away") key = e.path().string();
  }
  ASSERT_FALSE(key.empty());
  fs::rename(key, key + ".away");
  HttpReply r = HttpPost(addr, "/update_weights", UpdateWeightsBody(DeltaKey(5)));
  EXPECT_EQ(r.status, 500) << r.body;
  json s = StatusOf(addr);
  EXPECT_EQ(s["version"], 5) << "the replica moved; the folder lags";
  EXPECT_EQ(s["last_error"]["stage"], "export");
  EXPECT_NE(s["export_error"].get<std::string>().find("config.json"), std::string::npos) << s.dump();
  EXPECT_FALSE(fs::exists(out + "/step_000005"));
  ExpectFolder(out, 4, bucket.hash(4), side3);

  // Back in place: the next cycle exports it.
  fs::rename(key + ".away", key);
  ASSERT_EQ(HttpPost(addr, "/resume", "").status, 200);
  ASSERT_TRUE(WaitUntil([&] { return StatusOf(addr)["export_error"].is_null(); }));
  ExpectFolder(out, 5, bucket.hash(5), {{"config.json", "{\"rope_theta\": 5}"}});
  EXPECT_EQ(StepFiles(out), (std::vector<std::string>{"step_000001.safetensors", "step_000004", "step_000005",
                                                       "step_abc"}));
}

// What a SIGKILLed daemon left (temporary files, a half-built or half-pruned
// folder, a link) goes at the next start when its writer is gone from this
// host; a live writer's, another host's and names the daemon never writes stay.
TEST(OutDirTest, LeftoversOfAKilledDaemonAreRemovedAtStartOnlyWhenItsWriterIsGone) {
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string host = TempNameHost(), me = std::to_string(::getpid()), gone = std::to_string(dead);
  auto name = [](const std::string& h, const std::string& pid, const std::string& base) {
    return ".tmp-" + h + "-" + pid + "-0123456789abcdef-" + base;
  };
  for (OutLayout layout : {OutLayout::kFile, OutLayout::kFolder}) {
    TestBucket bucket;
    const std::string out = bucket.tmp().Sub("out");
    fs::create_directories(out);
    const std::vector<std::string> removed = {
        name(host, gone, "step_000003.safetensors"), name(host, gone, "latest.json"),
        name(host, gone, "step_000004"), name(host, gone, "latest"),
        ".tmp\\step_000005.safetensors." + gone + ".0123456789abcdef", ".step_000006.tmp-" + gone + "-1234abcd"};
    const std::vector<std::string> kept = {
        name(host, me, "step_000007.safetensors"), name(host + "x", gone, "step_000008.safetensors"),
        name(host, gone, "notes.txt"), ".tmp\\step_000009.safetensors." + me + ".0123456789abcdef",
        ".step_000010.tmp-" + me + "-1234abcd"};
    for (const std::string& n : {removed[0], removed[1], removed[4], kept[0], kept[1], kept[2], kept[3]}) {
      std::ofstream(out + "/" + n) << "partial";
    }
    fs::create_directories(out + "/" + removed[2] + "/inner");
    std::ofstream(out + "/" + removed[2] + "/inner/model.safetensors") << "partial";
    fs::create_directory_symlink("step_000002", out + "/" + removed[3]);
    fs::create_directories(out + "/" + removed[5]);
    fs::create_directories(out + "/" + kept[4]);

    auto sink = server::OutDirSink::Open(out, 2, layout, bucket.store());
    ASSERT_TRUE(sink.ok()) << sink.status().ToString();
    for (const std::string& n : removed) EXPECT_FALSE(fs::exists(fs::symlink_status(out + "/" + n))) << n;
    for (const std::string& n : kept) EXPECT_TRUE(fs::exists(out + "/" + n)) << n;
  }
}

TEST(OutDirTest, ALatestThatIsNotALinkIsRefusedAtStart) {
  TestBucket bucket;
  ServerOptions options = DaemonOptions(bucket.store());
  options.out_dir = bucket.tmp().Sub("out");
  options.listen = "127.0.0.1:0";
  fs::create_directories(options.out_dir + "/latest");
  std::ofstream(options.out_dir + "/latest/model.safetensors") << "someone's model";
  auto server = Server::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(server.status().message().find(options.out_dir + "/latest exists and is not a symlink"),
            std::string::npos)
      << server.status().ToString();
  EXPECT_TRUE(fs::exists(options.out_dir + "/latest/model.safetensors"));
}

// Two daemons on one --out (of two buckets, or one lagging behind the
// other) would replace each other's step folders and point latest back at
// an older version, each reporting its own state: the second is refused
// at start, for as long as the first holds the directory.
TEST(OutDirTest, ASecondDaemonOnTheSameOutIsRefusedWhileTheFirstRuns) {
  TestBucket first(1);
  TestBucket second(2);
  first.Publish(1);
  second.Publish(1);
  ServerOptions options = DaemonOptions(first.store());
  options.out_dir = first.tmp().Sub("out");
  options.listen = "127.0.0.1:0";
  auto running = Server::Start(options);
  ASSERT_TRUE(running.ok()) << running.status().ToString();
  ServerOptions other = DaemonOptions(second.store());
  other.out_dir = options.out_dir;
  other.listen = "127.0.0.1:0";
  auto refused = Server::Start(other);
  ASSERT_FALSE(refused.ok()) << "two daemons on one --out";
  EXPECT_EQ(refused.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("is in use by another running daemon"), std::string::npos)
      << refused.status().ToString();
  running->reset();
  auto after = Server::Start(other);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
}

TEST(OutDirTest, FileLayoutOneFilePerVersionNewestKeptOthersUntouched) {
  TestBucket bucket;
  bucket.Publish(1);
  const std::string out = bucket.tmp().Sub("out");
  fs::create_directories(out);
  std::ofstream(out + "/notes.txt") << "the engine's own file";
  std::ofstream(out + "/step_abc.safetensors") << "not ours either";
  ServerOptions options = DaemonOptions(bucket.store());
  options.out_dir = out;
  options.keep = 2;
  options.out_layout = OutLayout::kFile;
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

  json latest = LatestJson(out);
  ASSERT_TRUE(latest.is_object());
  EXPECT_EQ(latest["version"], 5);
  EXPECT_FALSE(latest.contains("dir"));
  EXPECT_FALSE(fs::exists(out + "/latest")) << "no link in the file layout";
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
  ASSERT_TRUE(WaitUntil([&] { return fs::exists(out + "/step_000001/model.safetensors"); }));

  // A file where the directory was: every write fails (even as root).
  // Paused while swapping, so that no write is in flight.
  ASSERT_EQ(HttpPost(addr, "/pause", "").status, 200);
  fs::remove_all(out);
  std::ofstream(out) << "in the way";
  bucket.Publish(2);
  ASSERT_EQ(HttpPost(addr, "/resume", "").status, 200);
  ASSERT_TRUE(WaitUntil([&] { return !StatusOf(addr)["export_error"].is_null(); }));
  json s = StatusOf(addr);
  EXPECT_EQ(s["version"], 2) << "the replica moved; the folder lags";
  EXPECT_EQ(s["last_error"]["stage"], "export");
  HttpReply health = HttpGet(addr, "/healthz");
  EXPECT_EQ(health.status, 503);
  EXPECT_NE(health.json["reason"].get<std::string>().find("--out"), std::string::npos) << health.body;

  fs::remove(out);
  fs::create_directories(out);
  ASSERT_TRUE(WaitUntil([&] { return HttpGet(addr, "/healthz").status == 200; }));
  EXPECT_EQ(HashOfFile(out + "/step_000002/model.safetensors").first, bucket.hash(2));
  EXPECT_EQ(fs::read_symlink(out + "/latest"), "step_000002");
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

// --out inside the local bucket (or holding it) is refused at start, as
// pull -o is (CheckOutsideBucket): with --out BUCKET/anchors --out-layout
// file the daemon wrote step_000001.safetensors over the bucket's anchor of
// version 1 and, with --keep 1, deleted it once version 2 was written.
TEST(OutDirTest, AnOutFolderInsideOrHoldingTheBucketIsRefusedAtStart) {
  TestBucket bucket;
  bucket.Publish(1);
  const std::string anchor = bucket.dir() + "/" + AnchorKey(1);
  ASSERT_TRUE(fs::exists(anchor));
  const std::string anchor_bytes = ReadText(anchor);
  fs::create_directory_symlink(bucket.dir(), bucket.tmp().Sub("link"));
  const std::vector<std::string> outs = {bucket.dir() + "/anchors", bucket.dir(), bucket.dir() + "/fresh/sub",
                                         bucket.tmp().Sub("link") + "/anchors", bucket.tmp().path()};
  for (const std::string& out : outs) {
    ServerOptions options = DaemonOptions(bucket.store());
    options.out_dir = out;
    options.keep = 1;
    options.out_layout = OutLayout::kFile;
    options.listen = "127.0.0.1:0";
    auto server = Server::Start(options);
    if (server.ok()) {
      ASSERT_TRUE(WaitForVersion((*server)->address(), 1));
      bucket.Publish(2);
      ASSERT_TRUE(WaitForVersion((*server)->address(), 2));
      (*server)->Stop();
      ADD_FAILURE() << "--out " << out << " started; after version 2 the bucket's anchor of version 1 is "
                    << (!fs::exists(anchor) ? "gone" : ReadText(anchor) == anchor_bytes ? "intact" : "replaced");
      return;
    }
    EXPECT_EQ(server.status().code(), ErrorCode::kInvalidArgument) << out;
    EXPECT_NE(server.status().message().find("--out " + out), std::string::npos) << server.status().ToString();
    EXPECT_NE(server.status().message().find("bucket"), std::string::npos) << server.status().ToString();
    EXPECT_EQ(ReadText(anchor), anchor_bytes);
  }
  EXPECT_FALSE(fs::exists(bucket.dir() + "/fresh")) << "nothing created in the bucket";
  // Beside the bucket is fine.
  ServerOptions beside = DaemonOptions(bucket.store());
  beside.out_dir = bucket.tmp().Sub("out");
  auto daemon = StartDaemon(beside);
  ASSERT_TRUE(daemon);
  EXPECT_TRUE(WaitForVersion(daemon->address(), 1));
}

}  // namespace
}  // namespace deltasync::testing
