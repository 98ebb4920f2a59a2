// SummarizeHistory: roles, sizes, changed fractions and totals of a
// manifest, and IsoUtcTime.
#include "deltasync/history.h"

#include <gtest/gtest.h>

#include "deltasync/publisher.h"
#include "deltasync/side_files.h"
#include "testing/bucket_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::OpenDirStore;
using testing::RandomModel;
using testing::ReadManifest;
using testing::TempDir;

TEST(HistoryTest, RolesSizesAndTotals) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  PublisherOptions options;
  options.anchor_interval = 4;
  options.cumulative_interval = 2;
  auto publisher = Publisher::Open(store, options);
  ASSERT_TRUE(publisher.ok());
  RandomModel model(3);
  for (uint64_t v = 1; v <= 5; ++v) {
    if (v > 1) model.Step(0.04);
    ASSERT_TRUE((*publisher)->Publish(v, model.Views()).ok());
  }
  const Manifest m = ReadManifest(*store);
  const History h = SummarizeHistory(m);
  ASSERT_EQ(h.versions.size(), 5u);

  // 1: anchor; 3: step + cumulative from 1; 4: step + anchor.
  auto roles = [&](size_t i) {
    std::string s;
    for (const ObjectSummary& o : h.versions[i].objects) s += std::string(ObjectRoleName(o.role)) + " ";
    return s;
  };
  EXPECT_EQ(roles(0), "anchor ");
  EXPECT_EQ(roles(1), "delta ");
  EXPECT_EQ(roles(2), "delta cumulative ");
  EXPECT_EQ(roles(3), "delta anchor ");
  EXPECT_EQ(roles(4), "delta ");
  EXPECT_EQ(h.versions[2].objects[1].object->base_version, 1u);

  const VersionSummary& two = h.versions[1];
  EXPECT_EQ(two.entry->version, 2u);
  EXPECT_EQ(two.encoding, "compact");
  EXPECT_EQ(two.bytes, two.entry->objects[0].size);
  ASSERT_TRUE(two.changed_fraction.has_value());
  EXPECT_DOUBLE_EQ(*two.changed_fraction, double(*two.entry->changed_elements) / two.entry->total_elements);
  EXPECT_GT(*two.changed_fraction, 0.02);
  ASSERT_TRUE(two.bytes_per_changed_element.has_value());
  EXPECT_DOUBLE_EQ(*two.bytes_per_changed_element, double(two.bytes) / *two.entry->changed_elements);
  EXPECT_FALSE(h.versions[0].bytes_per_changed_element.has_value());  // an anchor only

  uint64_t bytes = 0;
  for (const VersionEntry& v : m.versions) {
    for (const ObjectEntry& o : v.objects) bytes += o.size;
  }
  EXPECT_EQ(h.totals.versions, 5u);
  EXPECT_EQ(h.totals.objects, 7u);
  EXPECT_EQ(h.totals.anchors, 2u);
  EXPECT_EQ(h.totals.deltas, 4u);
  EXPECT_EQ(h.totals.cumulative, 1u);
  EXPECT_EQ(h.totals.bytes, bytes);
  EXPECT_EQ(h.totals.anchor_bytes + h.totals.delta_bytes + h.totals.cumulative_bytes, bytes);
}

TEST(HistoryTest, SideFileChangesPerListingAndDistinctObjectsInTotals) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  auto publisher = Publisher::Open(store, PublisherOptions{});
  ASSERT_TRUE(publisher.ok());
  auto file = [](const std::string& name, const std::string& text) {
    return SideFile{name, Blob::FromVector({text.begin(), text.end()})};
  };
  const std::vector<std::vector<SideFile>> sets = {
      {file("config.json", "aa"), file("vocab.txt", "vvv")},   // 1
      {},                                                      // 2: unchanged (nullopt)
      {file("config.json", "bbbb"), file("merges.txt", "m")},  // 3
  };
  RandomModel model(3);
  for (uint64_t v = 1; v <= 3; ++v) {
    if (v > 1) model.Step(0.04);
    std::optional<std::span<const SideFile>> files;
    if (v != 2) files = std::span<const SideFile>(sets[v - 1]);
    ASSERT_TRUE((*publisher)->Publish(v, model.Views(), files).ok());
  }
  const Manifest m = ReadManifest(*store);
  const History h = SummarizeHistory(m);
  ASSERT_TRUE(h.versions[0].files.has_value());
  EXPECT_EQ(h.versions[0].files->count, 2u);
  EXPECT_EQ(h.versions[0].files->bytes, 5u);
  EXPECT_EQ(h.versions[0].files->added, (std::vector<std::string>{"config.json", "vocab.txt"}));
  EXPECT_FALSE(h.versions[1].files.has_value());
  ASSERT_TRUE(h.versions[2].files.has_value());
  EXPECT_EQ(h.versions[2].files->bytes, 5u);
  EXPECT_EQ(h.versions[2].files->added, (std::vector<std::string>{"merges.txt"}));
  EXPECT_EQ(h.versions[2].files->changed, (std::vector<std::string>{"config.json"}));
  EXPECT_EQ(h.versions[2].files->removed, (std::vector<std::string>{"vocab.txt"}));
  EXPECT_EQ(h.totals.file_objects, 4u);
  EXPECT_EQ(h.totals.file_bytes, 10u);
  EXPECT_EQ(h.totals.objects, 3u) << "side files are not objects";
}

TEST(HistoryTest, IsoUtcTime) {
  EXPECT_EQ(IsoUtcTime(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(IsoUtcTime(1738326896789), "2025-01-31T12:34:56.789Z");
}

}  // namespace
}  // namespace deltasync
