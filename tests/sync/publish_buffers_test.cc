// A Publisher keeps its compact delta's stream buffers between versions
// (codec/stream_buffers.h): the deltas it writes with reused buffers must be
// the bytes a fresh Publisher writes for the same change, whether the change
// grows, shrinks or vanishes between versions.
#include <gtest/gtest.h>

#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "testing/bucket_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::OpenDirStore;
using testing::RandomModel;
using testing::ReadManifest;
using testing::TempDir;

std::vector<uint8_t> Bytes(Store& store, const std::string& key) {
  Result<Blob> blob = store.Get(key);
  EXPECT_TRUE(blob.ok()) << blob.status().ToString();
  if (!blob.ok()) return {};
  return std::vector<uint8_t>(blob->bytes().begin(), blob->bytes().end());
}

TEST(PublishBuffersTest, ReusedBuffersWriteTheBytesOfAFreshPublisher) {
  for (int container : {1, 2}) {
    for (int threads : {1, 2}) {
      TempDir dir;
      auto store = OpenDirStore(dir.path() + "/kept");
      PublisherOptions options;
      options.anchor_interval = 1000;
      options.encoding = IndexEncoding::kCompact;
      options.compact_container = container;
      options.threads = threads;
      auto kept = Publisher::Open(store, options);
      ASSERT_TRUE(kept.ok()) << kept.status().ToString();
      RandomModel model(21);
      ASSERT_TRUE((*kept)->Publish(1, model.Views()).ok());
      // Growing, shrinking, none, growing again; one version after
      // ReleaseBuffers.
      const double fractions[] = {0.02, 0.3, 0.001, 0.0, 0.2, 0.05, 0.4, 0.01};
      uint64_t version = 1;
      for (double f : fractions) {
        ++version;
        if (version == 7) (*kept)->ReleaseBuffers();
        std::vector<TensorView> before = model.Views();
        // The fresh publisher's base: the model before this step.
        TempDir fresh_dir;
        auto fresh_store = OpenDirStore(fresh_dir.path());
        auto fresh = Publisher::Open(fresh_store, options);
        ASSERT_TRUE(fresh.ok());
        ASSERT_TRUE((*fresh)->Publish(version - 1, before).ok());
        if (f > 0) model.Step(f);
        auto a = (*kept)->Publish(version, model.Views());
        ASSERT_TRUE(a.ok()) << a.status().ToString();
        auto b = (*fresh)->Publish(version, model.Views());
        ASSERT_TRUE(b.ok()) << b.status().ToString();
        EXPECT_EQ(a->state_hash, b->state_hash);
        EXPECT_EQ(a->changed_elements, b->changed_elements);
        const Manifest ma = ReadManifest(*store), mb = ReadManifest(*fresh_store);
        const VersionEntry* ea = ma.Find(version);
        const VersionEntry* eb = mb.Find(version);
        ASSERT_TRUE(ea && eb && ea->delta() && eb->delta());
        const ObjectEntry& oa = *ea->delta();
        const ObjectEntry& ob = *eb->delta();
        EXPECT_EQ(oa.key, ob.key);
        EXPECT_EQ(oa.size, ob.size);
        EXPECT_EQ(oa.xxh3_128, ob.xxh3_128);
        EXPECT_EQ(Bytes(*store, oa.key), Bytes(*fresh_store, ob.key))
            << "container " << container << ", " << threads << " threads, version " << version << " (" << f << ")";
      }
    }
  }
}

}  // namespace
}  // namespace deltasync
