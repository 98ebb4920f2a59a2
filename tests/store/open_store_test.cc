// OpenStore: which bucket URLs open what.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "deltasync/store.h"

namespace deltasync {
namespace {

namespace fs = std::filesystem;

class OpenStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "ds_open_store_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = fs::canonical(tmpl).string();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_F(OpenStoreTest, FileUrlAndPlainPathOpenALocalStore) {
  Result<std::shared_ptr<Store>> by_url = OpenStore("file://" + dir_ + "/b1");
  ASSERT_TRUE(by_url.ok()) << by_url.status().ToString();
  EXPECT_EQ((*by_url)->Describe(), "file://" + dir_ + "/b1");

  Result<std::shared_ptr<Store>> by_path = OpenStore(dir_ + "/b2");
  ASSERT_TRUE(by_path.ok()) << by_path.status().ToString();
  EXPECT_EQ((*by_path)->Describe(), "file://" + dir_ + "/b2");
  ASSERT_TRUE((*by_path)->Put("k", ByteSpan()).ok());
  EXPECT_TRUE(fs::exists(dir_ + "/b2/k"));
}

TEST_F(OpenStoreTest, CreateFalseNeedsAnExistingDirectory) {
  EXPECT_EQ(OpenStore(dir_ + "/missing", /*create=*/false).status().code(), ErrorCode::kNotFound);
  EXPECT_FALSE(fs::exists(dir_ + "/missing"));
  EXPECT_TRUE(OpenStore("file://" + dir_, /*create=*/false).ok());
}

TEST_F(OpenStoreTest, S3UrlWithoutBucketIsRefusedByName) {
  Result<std::shared_ptr<Store>> s3 = OpenStore("s3://");
  ASSERT_FALSE(s3.ok());
  EXPECT_EQ(s3.status().code(), ErrorCode::kInvalidArgument) << s3.status().ToString();
  EXPECT_NE(s3.status().message().find("s3://"), std::string::npos) << s3.status().message();
}

TEST_F(OpenStoreTest, OtherUrlsAreRefusedByName) {
  for (std::string url : {"gs://bucket/x", "https://example.com/b", "file://relative/dir", "file://", ""}) {
    SCOPED_TRACE(url);
    Result<std::shared_ptr<Store>> r = OpenStore(url);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    if (!url.empty()) {
      EXPECT_NE(r.status().message().find("'" + url + "'"), std::string::npos) << r.status().message();
    }
  }
}

// A misspelt or unknown scheme must never become a relative directory
// ("./s3:/mybucket/run1"): it is refused, naming the accepted forms, and
// nothing is created.
TEST_F(OpenStoreTest, MalformedSchemesAreRefusedAndCreateNothing) {
  const std::string cwd = fs::current_path().string();
  fs::current_path(dir_);
  struct Case {
    std::string url, hint;
  };
  for (const Case& c : {Case{"s3:/mybucket/run1", "s3://mybucket/run1"}, Case{"S3://bucket", "s3://bucket"},
                        Case{"s3:bucket", "s3://bucket"}, Case{"file:/data/x", "file:///data/x"},
                        Case{"FILE:///data/x", "file:///data/x"}, Case{"run:1", "./run:1"},
                        Case{"hdfs:/x", "./hdfs:/x"}}) {
    SCOPED_TRACE(c.url);
    Result<std::shared_ptr<Store>> r = OpenStore(c.url);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    const std::string msg = r.status().message();
    EXPECT_NE(msg.find("'" + c.url + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.hint), std::string::npos) << msg;
    EXPECT_NE(msg.find("file:///abs/dir or s3://bucket/prefix"), std::string::npos) << msg;
  }
  EXPECT_TRUE(fs::is_empty(dir_));
  // A colon after a '/' is part of a path.
  EXPECT_TRUE(OpenStore("./run:1").ok());
  EXPECT_TRUE(OpenStore("sub/a:b").ok());
  EXPECT_TRUE(fs::is_directory(dir_ + "/run:1"));
  EXPECT_TRUE(fs::is_directory(dir_ + "/sub/a:b"));
  fs::current_path(cwd);
}

}  // namespace
}  // namespace deltasync
