// LocalStore::RemoveStaleTemporaries (`deltasync gc --temp-older-than`): a
// leftover goes only when it is old enough and its writer is not a live
// process of this host; objects and other files are never touched.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "deltasync/store.h"
#include "deltasync/temp_file.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

namespace fs = std::filesystem;
using std::chrono::hours;
using std::chrono::seconds;

// A pid that ran and is gone (reaped).
pid_t DeadPid() {
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

std::string NewName(const std::string& host, long pid, const std::string& base) {
  return ".tmp-" + host + "-" + std::to_string(pid) + "-0123456789abcdef-" + base;
}

// Writes `bytes` bytes at `path`, last modified `age` ago.
void Leave(const std::string& path, size_t bytes, seconds age) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << std::string(bytes, 'x');
  auto when = std::chrono::system_clock::now() - age;
  struct timespec times[2];
  times[0].tv_sec = times[1].tv_sec = std::chrono::system_clock::to_time_t(when);
  times[0].tv_nsec = times[1].tv_nsec = 0;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path;
}

class LocalTemporariesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<LocalStore>> store = LocalStore::Open(dir_.Sub("bucket"));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
    root_ = store_->root();
  }
  bool Exists(const std::string& rel) const { return fs::exists(fs::symlink_status(root_ + "/" + rel)); }

  testing::TempDir dir_;
  std::unique_ptr<LocalStore> store_;
  std::string root_;
};

TEST_F(LocalTemporariesTest, RemovesOldLeftoversOfDeadWritersOnly) {
  const pid_t dead = DeadPid();
  const std::string host = TempNameHost();
  ASSERT_TRUE(store_->Put("ds/anchors/step_000001.safetensors", ByteSpan()).ok());
  const std::string old_dead = "ds/anchors/" + NewName(host, dead, "step_000002.safetensors");
  const std::string young_dead = "ds/" + NewName(host, dead, "manifest.json");
  const std::string old_live = "ds/deltas/" + NewName(host, ::getpid(), "step_000003.safetensors");
  const std::string old_legacy = "ds/.tmp\\manifest.json." + std::to_string(dead) + ".0123456789abcdef";
  const std::string old_legacy_live = ".tmp\\x." + std::to_string(::getpid()) + ".0123456789abcdef";
  Leave(root_ + "/" + old_dead, 1000, hours(2));
  Leave(root_ + "/" + young_dead, 10, seconds(0));
  Leave(root_ + "/" + old_live, 10, hours(2));
  Leave(root_ + "/" + old_legacy, 24, hours(2));
  Leave(root_ + "/" + old_legacy_live, 10, hours(2));
  // Not temporaries, or not files: never touched.
  Leave(root_ + "/ds/.tmp-notes.txt", 5, hours(2));
  Leave(root_ + "/ds/keep.json", 5, hours(2));
  fs::create_directories(root_ + "/" + NewName(host, dead, "folder"));

  Result<LocalStore::TempCleanup> dry = store_->RemoveStaleTemporaries(hours(1), /*dry_run=*/true);
  ASSERT_TRUE(dry.ok()) << dry.status().ToString();
  EXPECT_EQ(dry->removed_files, 2u);
  EXPECT_EQ(dry->removed_bytes, 1024u);
  EXPECT_EQ(dry->kept_files, 3u);
  EXPECT_TRUE(Exists(old_dead));

  Result<LocalStore::TempCleanup> hour = store_->RemoveStaleTemporaries(hours(1));
  ASSERT_TRUE(hour.ok()) << hour.status().ToString();
  EXPECT_EQ(hour->removed_files, 2u);
  EXPECT_EQ(hour->removed_bytes, 1024u);
  EXPECT_EQ(hour->kept_files, 3u);
  EXPECT_FALSE(Exists(old_dead));
  EXPECT_FALSE(Exists(old_legacy));
  EXPECT_TRUE(Exists(young_dead));  // too young
  EXPECT_TRUE(Exists(old_live));    // its writer (this process) runs
  EXPECT_TRUE(Exists(old_legacy_live));

  // Age 0: whatever is not a live writer's goes, however young.
  Result<LocalStore::TempCleanup> zero = store_->RemoveStaleTemporaries(seconds(0));
  ASSERT_TRUE(zero.ok()) << zero.status().ToString();
  EXPECT_EQ(zero->removed_files, 1u);
  EXPECT_EQ(zero->kept_files, 2u);
  EXPECT_FALSE(Exists(young_dead));
  EXPECT_TRUE(Exists(old_live));
  EXPECT_TRUE(Exists(old_legacy_live));
  EXPECT_TRUE(Exists("ds/.tmp-notes.txt"));
  EXPECT_TRUE(Exists("ds/keep.json"));
  EXPECT_TRUE(Exists(NewName(host, dead, "folder")));
  EXPECT_EQ(store_->List("").value(), std::vector<std::string>({"ds/anchors/step_000001.safetensors", "ds/keep.json"}));
}

// Another host's pid says nothing here: only the age decides.
TEST_F(LocalTemporariesTest, AnotherHostsLeftoversGoByAgeOnly) {
  const std::string other = TempNameHost() + "x";
  const std::string old_name = NewName(other, ::getpid(), "a.safetensors");
  const std::string young_name = NewName(other, DeadPid(), "b.safetensors");
  Leave(root_ + "/" + old_name, 7, hours(3));
  Leave(root_ + "/" + young_name, 7, seconds(30));
  Result<LocalStore::TempCleanup> r = store_->RemoveStaleTemporaries(hours(1));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->removed_files, 1u);
  EXPECT_EQ(r->kept_files, 1u);
  EXPECT_FALSE(Exists(old_name));
  EXPECT_TRUE(Exists(young_name));
}

// A live writer's file through the real helper survives an age-0 sweep.
TEST_F(LocalTemporariesTest, OpenTempFileOfThisProcessIsKept) {
  TempFile tmp;
  ASSERT_EQ(tmp.Create(root_ + "/obj"), 0);
  Result<LocalStore::TempCleanup> r = store_->RemoveStaleTemporaries(seconds(0));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->removed_files, 0u);
  EXPECT_EQ(r->kept_files, 1u);
  EXPECT_TRUE(fs::exists(tmp.path()));
}

}  // namespace
}  // namespace deltasync
