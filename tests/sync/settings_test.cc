// The bucket's stored settings (encoding, anchor cadence, cumulative deltas,
// adaptive anchors) and the version rules of new publishes: cap at 2^53-1,
// no jump of more than 1,000,000 without allow_version_jump.
#include <gtest/gtest.h>

#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "testing/bucket_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::OpenDirStore;
using testing::RandomModel;
using testing::ReadManifest;
using testing::TempDir;

void ExpectError(const Status& s, ErrorCode code, std::string_view needle) {
  EXPECT_EQ(s.code(), code) << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

class SettingsTest : public ::testing::Test {
 protected:
  std::unique_ptr<Publisher> Open(PublisherOptions options) {
    Result<std::unique_ptr<Publisher>> p = Publisher::Open(store_, std::move(options));
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(*p) : nullptr;
  }
  void Publish(Publisher& p, uint64_t version) {
    model_.Step(0.01);
    Result<PublishStats> s = p.Publish(version, model_.Views());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
  }
  Status OpenStatus(PublisherOptions options) { return Publisher::Open(store_, std::move(options)).status(); }

  TempDir dir_;
  std::shared_ptr<Store> store_ = OpenDirStore(dir_.path());
  RandomModel model_{7};
};

TEST_F(SettingsTest, ANewBucketStoresWhatItWasPublishedWith) {
  auto p = Open({});
  EXPECT_EQ(p->settings(), BucketSettings{});
  Publish(*p, 1);
  Manifest m = ReadManifest(*store_);
  ASSERT_TRUE(m.settings.has_value());
  EXPECT_EQ(*m.settings, BucketSettings{});

  TempDir other;
  auto store = OpenDirStore(other.path());
  auto q = Publisher::Open(store, {.anchor_interval = 3, .encoding = IndexEncoding::kGapDelta,
                                   .cumulative_interval = 2, .anchor_max_fraction = 0.5});
  ASSERT_TRUE(q.ok());
  ASSERT_TRUE((*q)->Publish(1, model_.Views()).ok());
  m = ReadManifest(*store);
  EXPECT_EQ(*m.settings, (BucketSettings{IndexEncoding::kGapDelta, 3, 2, 0.5}));
  EXPECT_EQ(m.anchor_interval, 3u);  // the top-level copy for older readers
}

TEST_F(SettingsTest, ALaterPublisherUsesTheBucketsSettings) {
  const BucketSettings stored{IndexEncoding::kGapDelta, 3, 2, 0};
  Publish(*Open({.anchor_interval = 3, .encoding = IndexEncoding::kGapDelta, .cumulative_interval = 2}), 1);
  // A stateless second process that repeats nothing: the bucket's settings.
  auto p = Open({});
  EXPECT_EQ(p->settings(), stored);
  EXPECT_TRUE(p->changed_settings().empty());
  Publish(*p, 2);
  Manifest m = ReadManifest(*store_);
  EXPECT_EQ(m.versions.back().delta()->key, DeltaKey(2));  // gap_delta, not ds/
  EXPECT_EQ(m.versions.back().delta()->encoding, IndexEncoding::kGapDelta);
  EXPECT_EQ(*m.settings, stored);
  // Repeating the stored values is fine.
  EXPECT_TRUE(OpenStatus({.anchor_interval = 3, .encoding = IndexEncoding::kGapDelta}).ok());
}

TEST_F(SettingsTest, ADifferentExplicitSettingIsRefusedNamingTheWayOut) {
  Publish(*Open({.anchor_interval = 3, .encoding = IndexEncoding::kGapDelta}), 1);
  ExpectError(OpenStatus({.encoding = IndexEncoding::kCompact}), ErrorCode::kFailedPrecondition,
              "bucket " + store_->Describe() + " uses encoding gap_delta, not compact; leave out --encoding");
  ExpectError(OpenStatus({.encoding = IndexEncoding::kCompact}), ErrorCode::kFailedPrecondition,
              "pass --change-settings (Python: change_settings=True) to change it");
  ExpectError(OpenStatus({.anchor_interval = 5}), ErrorCode::kFailedPrecondition,
              "uses anchor_interval 3, not 5; leave out --anchor-interval");
  ExpectError(OpenStatus({.cumulative_interval = 4}), ErrorCode::kFailedPrecondition,
              "uses cumulative_interval 0, not 4; leave out --cumulative-every");
  ExpectError(OpenStatus({.anchor_max_fraction = 0.25}), ErrorCode::kFailedPrecondition,
              "uses anchor_max_fraction 0, not 0.25; leave out --anchor-max-fraction");
  ExpectError(OpenStatus({.anchor_interval = 0}), ErrorCode::kInvalidArgument, "anchor interval must be at least 1");
  EXPECT_EQ(*ReadManifest(*store_).settings, (BucketSettings{IndexEncoding::kGapDelta, 3, 0, 0}));
}

TEST_F(SettingsTest, ChangeSettingsStoresTheNewValuesAndReplicasFollow) {
  Publish(*Open({.anchor_interval = 3, .encoding = IndexEncoding::kGapDelta}), 1);
  auto p = Open({.anchor_interval = 4, .encoding = IndexEncoding::kCompact, .change_settings = true});
  EXPECT_EQ(p->changed_settings(),
            (std::vector<std::string>{"encoding gap_delta -> compact", "anchor_interval 3 -> 4"}));
  EXPECT_EQ(ReadManifest(*store_).settings->encoding, IndexEncoding::kGapDelta);  // stored with the next version
  Publish(*p, 2);
  Manifest m = ReadManifest(*store_);
  EXPECT_EQ(*m.settings, (BucketSettings{IndexEncoding::kCompact, 4, 0, 0}));
  EXPECT_EQ(m.versions.back().delta()->key, CompactDeltaKey(2));
  auto replica = Replica::Create(store_);
  ASSERT_TRUE(replica->Update().ok());
  EXPECT_EQ(replica->state_hash(), m.versions.back().state_hash);
  // From now on the new values are the bucket's.
  EXPECT_EQ(Open({})->settings().encoding, IndexEncoding::kCompact);
}

// A manifest from before "settings" existed: its anchor_interval and the
// encoding of its newest delta are what the bucket uses.
TEST_F(SettingsTest, OlderManifestsWithoutSettings) {
  {
    auto p = Open({.anchor_interval = 3, .encoding = IndexEncoding::kGapDelta});
    Publish(*p, 1);
    Publish(*p, 2);
  }
  Manifest old = ReadManifest(*store_);
  old.settings.reset();
  std::string json = old.ToJson();
  ASSERT_EQ(json.find("settings"), std::string::npos);
  ASSERT_TRUE(store_->Put(kManifestKey, ByteSpan(reinterpret_cast<const uint8_t*>(json.data()), json.size())).ok());

  auto p = Open({});
  EXPECT_EQ(p->settings(), (BucketSettings{IndexEncoding::kGapDelta, 3, 0, 0}));
  ExpectError(OpenStatus({.encoding = IndexEncoding::kRaw}), ErrorCode::kFailedPrecondition,
              "uses encoding gap_delta, not raw");
  ExpectError(OpenStatus({.anchor_interval = 10}), ErrorCode::kFailedPrecondition, "uses anchor_interval 3, not 10");
  // What it does not know it takes from the options, and stores.
  auto q = Open({.cumulative_interval = 2});
  Publish(*q, 3);
  EXPECT_EQ(*ReadManifest(*store_).settings, (BucketSettings{IndexEncoding::kGapDelta, 3, 2, 0}));
}

TEST_F(SettingsTest, VersionsAreCappedAt2To53Minus1) {
  auto p = Open({});
  ExpectError(p->Publish(kMaxPublishVersion + 1, model_.Views()).status(), ErrorCode::kInvalidArgument,
              "version 9007199254740992 is above 2^53-1 (9007199254740991)");
  ExpectError(p->Publish(UINT64_MAX, model_.Views()).status(), ErrorCode::kInvalidArgument, "above 2^53-1");
  EXPECT_EQ(p->latest_version(), 0u);
  EXPECT_FALSE(store_->Get(kManifestKey).ok());
  Publish(*p, kMaxPublishVersion);  // the first version may be anywhere up to the cap
  EXPECT_EQ(p->latest_version(), kMaxPublishVersion);
}

TEST_F(SettingsTest, AJumpOfMoreThanAMillionNeedsAllowVersionJump) {
  auto p = Open({});
  Publish(*p, 5);
  ExpectError(p->Publish(5 + kMaxVersionJump + 1, model_.Views()).status(), ErrorCode::kInvalidArgument,
              "version 1000006 is 1000001 past the newest version 5 in " + store_->Describe() +
                  " (more than 1000000); if that is intended, pass --allow-version-jump (Python: "
                  "allow_version_jump=True)");
  EXPECT_EQ(p->latest_version(), 5u);
  ExpectError(p->PublishChanges(5 + kMaxVersionJump + 1, {}).status(), ErrorCode::kInvalidArgument,
              "--allow-version-jump");
  Publish(*p, 5 + kMaxVersionJump);  // exactly a million is allowed

  auto q = Open({.allow_version_jump = true});
  Publish(*q, kMaxPublishVersion);
  ExpectError(q->Publish(kMaxPublishVersion + 1, model_.Views()).status(), ErrorCode::kInvalidArgument,
              "above 2^53-1");
}

}  // namespace
}  // namespace deltasync
