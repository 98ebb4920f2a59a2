// A checkpoint FILE written into while it is published (`deltasync publish
// FILE`): the publisher maps it and reads it in place, so a trainer saving
// into it meanwhile would have the version mix two saves (hashed from what
// was read, so every replica would verify it "bit-exact" against a state the
// trainer never had), and a save that starts by truncating it would kill the
// publisher with SIGBUS. Publish(..., file.CheckUnchanged) refuses both, with
// nothing committed and the publisher's state unchanged.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "deltasync/publisher.h"
#include "deltasync/safetensors.h"
#include "deltasync/state_hash.h"
#include "testing/bucket_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::OpenDirStore;
using testing::RandomModel;
using testing::TempDir;

struct Bucket {
  TempDir dir;
  std::shared_ptr<Store> store = OpenDirStore(dir.path() + "/bucket");
  std::unique_ptr<Publisher> publisher;
  RandomModel model{11};
  std::string ckpt = dir.path() + "/model.safetensors";
  std::vector<std::string> objects;
  StateHash v1;

  // Version 1 published from the file; the file then holds the next save.
  void PublishFirst(IndexEncoding encoding) {
    PublisherOptions options;
    options.encoding = encoding;
    options.threads = 2;
    auto opened = Publisher::Open(store, options);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    publisher = std::move(*opened);
    ASSERT_TRUE(WriteSafetensorsFile(ckpt, {}, model.Views()).ok());
    Result<SafetensorsFile> file = SafetensorsFile::Open(ckpt);
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    Result<PublishStats> first = publisher->Publish(1, file->tensors(), std::nullopt, [&] { return file->CheckUnchanged(); });
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    v1 = HashState(publisher->state());
    model.Step(0.05);
    ASSERT_TRUE(WriteSafetensorsFile(ckpt, {}, model.Views()).ok());
    Result<std::vector<std::string>> listed = store->List("");
    ASSERT_TRUE(listed.ok()) << listed.status().ToString();
    objects = *listed;
  }

  // Version 2 from `file` must be refused, naming the file, with nothing
  // of it committed or uploaded.
  void ExpectRefused(const SafetensorsFile& file, const std::string& how) {
    Result<PublishStats> torn = publisher->Publish(2, file.tensors(), std::nullopt, [&] { return file.CheckUnchanged(); });
    ASSERT_FALSE(torn.ok()) << "a file written into while it was read was published";
    EXPECT_EQ(torn.status().code(), ErrorCode::kFailedPrecondition) << torn.status().ToString();
    EXPECT_NE(torn.status().message().find(ckpt + " changed while it was read (" + how), std::string::npos)
        << torn.status().ToString();
    EXPECT_NE(torn.status().message().find("version 2 not published"), std::string::npos) << torn.status().ToString();
    EXPECT_EQ(publisher->latest_version(), 1u);
    EXPECT_EQ(HashState(publisher->state()), v1) << "the refused version changed the publisher's state";
    EXPECT_EQ(testing::ReadManifest(*store).Latest()->version, 1u);
    Result<std::vector<std::string>> after = store->List("");
    ASSERT_TRUE(after.ok()) << after.status().ToString();
    EXPECT_EQ(*after, objects) << "the refused version uploaded objects";
  }
};

class PublishFileChanged : public ::testing::TestWithParam<IndexEncoding> {};

// The next save overwrites the file in place, half of it, from another
// thread, after the publisher mapped the file and before it reads it: what
// it would read is half one save, half the other.
TEST_P(PublishFileChanged, AFileRewrittenInPlaceWhileReadIsNotPublished) {
  Bucket s;
  ASSERT_NO_FATAL_FAILURE(s.PublishFirst(GetParam()));
  Result<SafetensorsFile> file = SafetensorsFile::Open(s.ckpt);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_TRUE(file->CheckUnchanged().ok());
  s.model.Step(0.2);
  Result<std::vector<uint8_t>> next = SerializeSafetensors({}, s.model.Views());
  ASSERT_TRUE(next.ok());
  ASSERT_EQ(next->size(), file->blob().size()) << "the same layout, so only the bytes differ";
  std::thread writer([&] {
    const int fd = ::open(s.ckpt.c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    const size_t half = next->size() / 2;
    ASSERT_EQ(::pwrite(fd, next->data() + half, next->size() - half, static_cast<off_t>(half)),
              static_cast<ssize_t>(next->size() - half));
    ::close(fd);
  });
  writer.join();
  ASSERT_NO_FATAL_FAILURE(s.ExpectRefused(*file, "it was written to"));
}

// A save that starts by truncating the file (open with O_TRUNC) while the
// publisher has it mapped: reading the cut pages raised SIGBUS, which killed
// the process; now they read as zeros and the publish is refused.
TEST_P(PublishFileChanged, AFileCutWhileMappedIsNotPublishedAndDoesNotKillTheProcess) {
  Bucket s;
  ASSERT_NO_FATAL_FAILURE(s.PublishFirst(GetParam()));
  Result<SafetensorsFile> file = SafetensorsFile::Open(s.ckpt);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const uint64_t size = file->blob().size();
  ASSERT_GT(size, 3u * 4096);
  std::thread writer([&] { ASSERT_EQ(::truncate(s.ckpt.c_str(), 4096), 0); });
  writer.join();
  ASSERT_NO_FATAL_FAILURE(s.ExpectRefused(*file, "its size went from " + std::to_string(size) + " to 4096 bytes"));
  EXPECT_TRUE(file->blob().cut()) << "the cut pages were read";
}

INSTANTIATE_TEST_SUITE_P(Encodings, PublishFileChanged,
                         testing::AllEncodings(), testing::EncodingParamName);

}  // namespace
}  // namespace deltasync
