// LocalStore: the conformance suite over a fresh directory per test, plus what
// only a directory can get wrong (symlinks, temporary files, crashes, parent
// directories).
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "deltasync/store.h"
#include "deltasync/temp_file.h"
#include "store/store_conformance.h"
#include "testing/test_bytes.h"

namespace deltasync::testing {
namespace {

using testing::Span;
using testing::Str;

namespace fs = std::filesystem;

// The prefix LocalStore gives its temporary files (docs/format.md, "Temporary files").
constexpr std::string_view kTempPrefix = ".tmp-";


std::string MakeTempDir() {
  std::string tmpl = ::testing::TempDir() + "ds_local_store_XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return "";
  return tmpl;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void WriteFile(const std::string& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Every file name under `dir`, as the OS sees it (not through the store).
std::vector<std::string> RawNames(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

bool AnyTempFile(const std::string& dir) {
  for (const std::string& name : RawNames(dir)) {
    if (IsTempName(name)) return true;
  }
  return false;
}

std::shared_ptr<Store> MakeLocalStore() {
  std::string dir = MakeTempDir();
  if (dir.empty()) return nullptr;
  Result<std::unique_ptr<LocalStore>> store = LocalStore::Open(dir + "/bucket");
  if (!store.ok()) return nullptr;
  // The directory goes when the last user of the store does.
  return std::shared_ptr<Store>(store->release(), [dir](Store* s) {
    delete s;
    std::error_code ec;
    fs::remove_all(dir, ec);
  });
}

INSTANTIATE_TEST_SUITE_P(Local, StoreConformanceTest,
                         ::testing::Values(StoreFactory{"local", MakeLocalStore}), StoreFactoryName);

class LocalStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = MakeTempDir();
    ASSERT_FALSE(tmp_.empty());
    root_ = tmp_ + "/bucket";
    Result<std::unique_ptr<LocalStore>> store = LocalStore::Open(root_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    root_ = store_->root();
  }
  void TearDown() override {
    store_.reset();
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }

  std::string tmp_;   // scratch space outside the store
  std::string root_;  // the store's (real, absolute) root
  std::unique_ptr<LocalStore> store_;
};

TEST_F(LocalStoreTest, OpenMakesAbsoluteRealRoot) {
  // Relative path with "." and ".." parts, created on the way.
  std::string rel = fs::relative(tmp_).string() + "/x/./y/../z";
  Result<std::unique_ptr<LocalStore>> store = LocalStore::Open(rel);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->root(), fs::canonical(tmp_).string() + "/x/z");
  EXPECT_EQ((*store)->Describe(), "file://" + (*store)->root());
  EXPECT_TRUE(fs::is_directory(tmp_ + "/x/y"));
  EXPECT_EQ(store_->Describe(), "file://" + root_);
}

TEST_F(LocalStoreTest, OpenRefusesMissingOrNonDirectoryRoot) {
  Result<std::unique_ptr<LocalStore>> missing = LocalStore::Open(tmp_ + "/nope", /*create=*/false);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_FALSE(fs::exists(tmp_ + "/nope"));

  WriteFile(tmp_ + "/file", "x");
  for (bool create : {false, true}) {
    Result<std::unique_ptr<LocalStore>> file = LocalStore::Open(tmp_ + "/file", create);
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), ErrorCode::kInvalidArgument) << file.status().ToString();
    EXPECT_NE(file.status().message().find("not a directory"), std::string::npos);
  }
  // A file in the middle of the path.
  EXPECT_FALSE(LocalStore::Open(tmp_ + "/file/sub").ok());
  EXPECT_EQ(LocalStore::Open("").status().code(), ErrorCode::kInvalidArgument);
}

TEST_F(LocalStoreTest, ObjectsArePlainFilesUnderTheRoot) {
  ASSERT_TRUE(store_->Put("deltas/step_000003.safetensors", Span("payload")).ok());
  EXPECT_EQ(ReadFile(root_ + "/deltas/step_000003.safetensors"), "payload");
  EXPECT_FALSE(AnyTempFile(root_));
}

// An object of several writeback steps (temp_file.h), in parts that are not
// multiples of a step, reads back byte for byte.
TEST_F(LocalStoreTest, ObjectOfManyWritebackStepsReadsBackExactly) {
  const size_t step = TempFile::kWritebackStep;
  std::string data(3 * step + 12345, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 2654435761u) >> 13);
  const std::string_view all(data);
  const ByteSpan parts[] = {Span(all.substr(0, 7)), Span(all.substr(7, 2 * step)), Span(all.substr(7 + 2 * step))};
  ASSERT_TRUE(store_->Put("anchors/big.safetensors", parts).ok());
  Result<Blob> back = store_->Get("anchors/big.safetensors");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(Str(*back) == data);
  EXPECT_FALSE(AnyTempFile(root_));
}

TEST_F(LocalStoreTest, NotFoundMessageNamesStoreAndKey) {
  Result<Blob> got = store_->Get("deltas/step_000003.safetensors");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().message(),
            "file://" + root_ + ": object 'deltas/step_000003.safetensors' not found");
}

TEST_F(LocalStoreTest, SymlinkedDirectoryPointingOutsideIsRefused) {
  std::string outside = tmp_ + "/outside";
  fs::create_directory(outside);
  WriteFile(outside + "/secret", "secret");
  fs::create_directory_symlink(outside, root_ + "/evil");
  fs::create_directory(root_ + "/a");
  fs::create_directory_symlink(outside, root_ + "/a/evil");

  for (std::string key : {"evil/secret", "a/evil/secret"}) {
    SCOPED_TRACE(key);
    Result<Blob> get = store_->Get(key);
    ASSERT_FALSE(get.ok());
    EXPECT_EQ(get.status().code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(get.status().message().find("symlink"), std::string::npos) << get.status().message();
    EXPECT_EQ(store_->GetRange(key, 0, 1).status().code(), ErrorCode::kFailedPrecondition);
    EXPECT_EQ(store_->Size(key).status().code(), ErrorCode::kFailedPrecondition);
    EXPECT_EQ(store_->Delete(key).code(), ErrorCode::kFailedPrecondition);
    std::string new_key = key.substr(0, key.rfind('/')) + "/planted";
    EXPECT_EQ(store_->Put(new_key, Span("x")).code(), ErrorCode::kFailedPrecondition);
    // Nor through a directory that does not exist yet below the link.
    EXPECT_EQ(store_->Put(key.substr(0, key.rfind('/')) + "/new/dir/x", Span("x")).code(),
              ErrorCode::kFailedPrecondition);
  }
  EXPECT_EQ(ReadFile(outside + "/secret"), "secret");
  EXPECT_EQ(RawNames(outside), std::vector<std::string>{"secret"});
  EXPECT_EQ(store_->List("").value(), std::vector<std::string>{});
  EXPECT_EQ(store_->List("evil/").value(), std::vector<std::string>{});
}

TEST_F(LocalStoreTest, SymlinkedFileIsRefused) {
  WriteFile(tmp_ + "/target", "outside");
  fs::create_symlink(tmp_ + "/target", root_ + "/link");
  EXPECT_EQ(store_->Get("link").status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(store_->GetRange("link", 0, 1).status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(store_->Size("link").status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(store_->Put("link", Span("overwritten")).code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(store_->Delete("link").code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(ReadFile(tmp_ + "/target"), "outside");
  EXPECT_TRUE(fs::is_symlink(root_ + "/link"));
  EXPECT_EQ(store_->List("").value(), std::vector<std::string>{});
}

TEST_F(LocalStoreTest, TemporaryFilesAreNeverListed) {
  ASSERT_TRUE(store_->Put("deltas/step_000001.safetensors", Span("1")).ok());
  WriteFile(root_ + "/" + std::string(kTempPrefix) + "manifest.json.123.abc", "partial");
  WriteFile(root_ + "/deltas/" + std::string(kTempPrefix) + "step_000002.safetensors.9.f", "partial");
  WriteFile(root_ + "/deltas/.tmp\\step_000003.safetensors.9.0123456789abcdef", "partial");  // older releases
  EXPECT_EQ(store_->List("").value(), std::vector<std::string>{"deltas/step_000001.safetensors"});
  EXPECT_EQ(store_->List("deltas/").value(), std::vector<std::string>{"deltas/step_000001.safetensors"});
  EXPECT_EQ(store_->List(".").value(), std::vector<std::string>{});
}

TEST_F(LocalStoreTest, NonRegularFilesAreNotObjects) {
  ASSERT_EQ(::mkfifo((root_ + "/fifo").c_str(), 0644), 0);
  EXPECT_EQ(store_->List("").value(), std::vector<std::string>{});
  EXPECT_EQ(store_->Get("fifo").status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->Size("fifo").status().code(), ErrorCode::kNotFound);
}

// The write fails midway (the file-size limit applies to root too), after the
// old object exists: it must survive untouched, and no temporary file remain.
TEST_F(LocalStoreTest, FailedPutLeavesOldObjectIntact) {
  ASSERT_TRUE(store_->Put("deltas/step_000001.safetensors", Span("old object")).ok());
  std::vector<uint8_t> big(1 << 20, 0x5a);

  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead
  struct rlimit small = saved;
  small.rlim_cur = 64 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  Status put = store_->Put("deltas/step_000001.safetensors", big);
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, old_handler);

  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.code(), ErrorCode::kIOError);
  EXPECT_NE(put.message().find("deltas/step_000001.safetensors"), std::string::npos) << put.message();
  EXPECT_NE(put.message().find("write failed"), std::string::npos) << put.message();
  EXPECT_EQ(Str(store_->Get("deltas/step_000001.safetensors").value()), "old object");
  EXPECT_FALSE(AnyTempFile(root_));
}

TEST_F(LocalStoreTest, PutOverADirectoryOfObjectsFails) {
  ASSERT_TRUE(store_->Put("d/x", Span("inner")).ok());
  Status put = store_->Put("d", Span("would hide d/x"));
  EXPECT_EQ(put.code(), ErrorCode::kFailedPrecondition) << put.ToString();
  EXPECT_EQ(Str(store_->Get("d/x").value()), "inner");
  EXPECT_FALSE(AnyTempFile(root_));
}

TEST_F(LocalStoreTest, PutBelowAnObjectFails) {
  ASSERT_TRUE(store_->Put("a", Span("object")).ok());
  Status put = store_->Put("a/b", Span("x"));
  EXPECT_EQ(put.code(), ErrorCode::kFailedPrecondition) << put.ToString();
  EXPECT_NE(put.message().find("'a' is an object"), std::string::npos) << put.message();
  EXPECT_EQ(Str(store_->Get("a").value()), "object");
}

// A writer died between creating its temporary file and the rename: the
// leftover is invisible, the committed object still reads, and writing again works.
TEST_F(LocalStoreTest, LeftoverTemporaryFileFromACrashIsHarmless) {
  const std::string key = "deltas/step_000001.safetensors";
  ASSERT_TRUE(store_->Put(key, Span("committed")).ok());
  std::string leftover = root_ + "/deltas/" + std::string(kTempPrefix) + "step_000001.safetensors.4242.dead";
  WriteFile(leftover, "half-writ");

  EXPECT_EQ(store_->List("").value(), std::vector<std::string>{key});
  EXPECT_EQ(Str(store_->Get(key).value()), "committed");
  EXPECT_EQ(store_->Size(key).value(), 9u);
  ASSERT_TRUE(store_->Put(key, Span("rewritten")).ok());
  EXPECT_EQ(Str(store_->Get(key).value()), "rewritten");
  ASSERT_TRUE(store_->Delete(key).ok());
  EXPECT_EQ(store_->List("").value(), std::vector<std::string>{});
  EXPECT_EQ(ReadFile(leftover), "half-writ");  // not ours to remove: it might be live
}

TEST_F(LocalStoreTest, DeleteRemovesEmptyParentsButNotTheRoot) {
  ASSERT_TRUE(store_->Put("a/b/c/obj", Span("1")).ok());
  ASSERT_TRUE(store_->Put("a/keep", Span("2")).ok());
  ASSERT_TRUE(store_->Delete("a/b/c/obj").ok());
  EXPECT_FALSE(fs::exists(root_ + "/a/b"));
  EXPECT_TRUE(fs::exists(root_ + "/a/keep"));
  ASSERT_TRUE(store_->Delete("a/keep").ok());
  EXPECT_FALSE(fs::exists(root_ + "/a"));
  EXPECT_TRUE(fs::is_directory(root_));
  ASSERT_TRUE(store_->Put("top", Span("3")).ok());
  ASSERT_TRUE(store_->Delete("top").ok());
  EXPECT_TRUE(fs::is_directory(root_));
}

// Delete removes the directory it empties; a Put racing it into that same
// directory must still succeed.
TEST_F(LocalStoreTest, PutRacingDeleteInTheSameDirectory) {
  std::atomic<int> failures{0};
  auto churn = [&](std::string key) {
    for (int i = 0; i < 300; ++i) {
      if (Status s = store_->Put(key, Span(key)); !s.ok()) {
        ++failures;
        ADD_FAILURE() << s.ToString();
      }
      if (!store_->Delete(key).ok()) ++failures;
    }
  };
  std::thread t1(churn, "d/e/one"), t2(churn, "d/e/two");
  t1.join();
  t2.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store_->List("").value(), std::vector<std::string>{});
}

}  // namespace
}  // namespace deltasync::testing
