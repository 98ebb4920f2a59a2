// CheckOutsideBucket against a bucket directory reached by a second path
// (session 50, H4): a bind mount of it (a container that sees the host's
// bucket at another path) is not found by comparing resolved paths, so an
// output path through it was let write over the bucket's files. Needs mount
// permission (root in a container allowing it); skipped otherwise.
#include <sys/mount.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "deltasync/store.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

namespace fs = std::filesystem;

class BindMount {
 public:
  BindMount(const std::string& from, const std::string& to) : to_(to) {
    mounted_ = ::mount(from.c_str(), to.c_str(), nullptr, MS_BIND, nullptr) == 0;
    if (!mounted_) error_ = std::strerror(errno);
  }
  ~BindMount() {
    if (mounted_) ::umount(to_.c_str());
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  std::string to_, error_;
  bool mounted_ = false;
};

TEST(OutsideBucket, APathThroughABindMountOfTheBucketIsRefused) {
  testing::TempDir tmp;
  const std::string dir = tmp.Sub("bucket"), other = tmp.Sub("seen-elsewhere"), parent = tmp.Sub("parent");
  fs::create_directories(dir);
  fs::create_directories(other);
  fs::create_directories(parent + "/inner");
  auto store = OpenStore(dir);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  BindMount mount(dir, other);
  if (!mount.mounted()) GTEST_SKIP() << "cannot bind-mount here: " << mount.error();
  for (const std::string& out : {other + "/manifest.json", other, other + "/fresh/sub"}) {
    Status s = CheckOutsideBucket(store->get(), out, "-o");
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << out << ": " << s.ToString();
  }
  // A folder that holds the bucket through a second path: the bucket's parent, bind-mounted.
  BindMount holder(tmp.path(), parent + "/inner");
  ASSERT_TRUE(holder.mounted()) << holder.error();
  Status s = CheckOutsideBucket(store->get(), parent + "/inner", "--hf-dir");
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << s.ToString();
  // Outside it still passes.
  EXPECT_TRUE(CheckOutsideBucket(store->get(), parent + "/elsewhere", "-o").ok());
}

}  // namespace
}  // namespace deltasync
