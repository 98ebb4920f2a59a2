// Publishing when the system refuses to start a thread part way
// (std::thread throwing std::system_error, EAGAIN at the thread limit): the
// folder's per-file parts used to std::terminate (started, joinable worker
// threads destroyed), and a publish whose checksum thread could not start
// threw out of Publish with the publisher's state half advanced. Now the
// work runs on the threads that did start, with the same result. The refusal
// is the test hook of common/thread_start.h (RLIMIT_NPROC does not bind root).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/thread_start.h"
#include "deltasync/folder_parts.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "testing/bucket_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::OpenDirStore;
using testing::RandomModel;
using testing::TempDir;

struct RefuseThreadStarts {
  explicit RefuseThreadStarts(int after) { FailThreadStartsAfterForTesting(after); }
  ~RefuseThreadStarts() { FailThreadStartsAfterForTesting(-1); }
};

TEST(ThreadRefused, FolderPartsAndTheirPublishersRunOnTheThreadsThatStarted) {
  TempDir dir;
  auto store = OpenDirStore(dir.path() + "/bucket");
  auto single = OpenDirStore(dir.path() + "/single");
  PublisherOptions options;
  options.anchor_interval = 2;
  options.threads = 4;
  auto reference = Publisher::Open(single, options);
  ASSERT_TRUE(reference.ok());
  RandomModel model(5);
  StateHash last;
  for (uint64_t v = 1; v <= 3; ++v) {
    if (v > 1) model.Step(0.03);
    const std::string ckpt = dir.path() + "/ckpt-" + std::to_string(v);
    HfWriteOptions write;
    write.max_shard_bytes = 10'000;
    ASSERT_TRUE(WriteHfFolder(ckpt, model.Views(), {}, write).ok());
    Result<HfFolder> folder = ReadHfFolder(ckpt);
    ASSERT_TRUE(folder.ok()) << folder.status().ToString();
    ASSERT_GE(folder->shards.size(), 3u);
    Result<FolderPartsStats> stats = [&] {
      RefuseThreadStarts refuse(static_cast<int>(v) - 1);  // 0, 1, 2 threads start
      return PublishFolderParts(store, v, *folder, options);
    }();
    ASSERT_TRUE(stats.ok()) << "version " << v << ": " << stats.status().ToString();
    Result<PublishStats> ref = (*reference)->Publish(v, model.Views());
    ASSERT_TRUE(ref.ok());
    EXPECT_EQ(stats->stats.state_hash, ref->state_hash) << "version " << v;
    last = ref->state_hash;
  }
  std::unique_ptr<Replica> replica = Replica::Create(store);
  ASSERT_TRUE(replica->Update(3).ok());
  EXPECT_EQ(replica->state_hash(), last);
}

// A delta large enough for the checksum thread (1 MiB and more), whose start
// is refused: the checksum runs after the write instead.
TEST(ThreadRefused, ABigDeltaPublishesWhenItsChecksumThreadCannotStart) {
  TempDir dir;
  auto store = OpenDirStore(dir.path() + "/bucket");
  PublisherOptions options;
  options.encoding = IndexEncoding::kRaw;
  options.threads = 2;
  auto publisher = Publisher::Open(store, options);
  ASSERT_TRUE(publisher.ok());
  std::vector<uint16_t> w(1 << 20, 0x3F80);
  TensorView t{"w", DType::kBF16, {w.size()}, ByteSpan(reinterpret_cast<const uint8_t*>(w.data()), w.size() * 2)};
  ASSERT_TRUE((*publisher)->Publish(1, {&t, 1}).ok());
  for (size_t i = 0; i < w.size(); i += 2) w[i] = 0x4000;  // half the elements: a delta of several MiB
  Result<PublishStats> two = [&] {
    RefuseThreadStarts refuse(0);
    return (*publisher)->Publish(2, {&t, 1});
  }();
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_GE(two->delta_bytes, uint64_t{1} << 20);
  std::unique_ptr<Replica> replica = Replica::Create(store);
  ASSERT_TRUE(replica->Update(2).ok());
  EXPECT_EQ(replica->state_hash(), two->state_hash);
}

}  // namespace
}  // namespace deltasync
