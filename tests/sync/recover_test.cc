// A publisher always moves forward when given the complete weights: when the
// newest state cannot be rebuilt because objects of the bucket are damaged or
// missing, Publisher::Open opens degraded and the next Publish() commits a
// recovered, anchor-only version (issue 10, reproduction 2). Damage is made
// the way the bucket contract allows: a damaged copy renamed over the object.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include "deltasync/history.h"
#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/retention.h"
#include "deltasync/verify.h"
#include "testing/bucket_util.h"
#include "testing/fault_store.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::OpenDirStore;
using testing::RandomModel;
using testing::ReadManifest;
using testing::TempDir;

enum class Damage { kDelete, kFlip };

PublisherOptions Plain() { return {}; }  // anchors at 1, 10, 20, ...

PublisherOptions CumulativeAdaptive() {
  PublisherOptions options;
  options.anchor_interval = 100;
  options.cumulative_interval = 4;
  options.anchor_max_fraction = 50;  // computed every version, never reached here
  return options;
}

struct Bucket {
  explicit Bucket(PublisherOptions options) : store(OpenDirStore(tmp.Sub("bucket"))), options(std::move(options)) {}

  Result<std::unique_ptr<Publisher>> Reopen() { return Publisher::Open(store, options); }

  // Publishes from..to through `pub`, stepping the model before each.
  void PublishRange(Publisher& pub, uint64_t from, uint64_t to) {
    for (uint64_t v = from; v <= to; ++v) {
      if (v > 1) model.Step(0.05);
      auto stats = pub.Publish(v, model.Views());
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
      ASSERT_FALSE(stats->recovered);
      hashes[v] = stats->state_hash;
    }
  }

  void Damage(const std::string& key, deltasync::Damage how) {
    const std::string path = tmp.Sub("bucket") + "/" + key;
    if (how == Damage::kDelete) {
      ASSERT_TRUE(std::filesystem::remove(path)) << path;
      return;
    }
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(bytes.size(), 100u) << path;
    bytes[bytes.size() / 2] ^= 0x10;
    const std::string copy = tmp.Sub("damaged");
    std::ofstream(copy, std::ios::binary) << bytes;
    std::filesystem::rename(copy, path);
  }

  TempDir tmp;
  std::shared_ptr<Store> store;
  PublisherOptions options;
  RandomModel model{11};
  std::map<uint64_t, StateHash> hashes;
};

const std::string kStep12 = "ds/deltas/step_000012.safetensors";

class RecoverAfterDamageTest : public ::testing::TestWithParam<std::tuple<Damage, uint64_t, bool>> {};

// Publish 1-12, damage the step delta of 12, publish the next version with
// the full weights from a new publisher: it is committed anchor-only, and
// replicas (one that held 11, a fresh one) reach it and what follows.
TEST_P(RecoverAfterDamageTest, TheNextFullVersionIsCommittedAsARecoveredAnchor) {
  const auto [damage, next, cumulative] = GetParam();
  Bucket b(cumulative ? CumulativeAdaptive() : Plain());
  auto held = Replica::Create(b.store);
  {
    auto first = b.Reopen();
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    b.PublishRange(**first, 1, 11);
    ASSERT_TRUE(held->Update().ok());
    b.PublishRange(**first, 12, 12);
  }
  ASSERT_EQ(ReadManifest(*b.store).Find(12)->anchor(), nullptr);  // 12 has a delta route only
  b.Damage(kStep12, damage);

  auto opened = b.Reopen();
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Publisher& pub = **opened;
  ASSERT_TRUE(pub.degraded());
  EXPECT_NE(pub.degraded_reason().find("version 12"), std::string::npos) << pub.degraded_reason();
  EXPECT_NE(pub.degraded_reason().find(kStep12), std::string::npos) << pub.degraded_reason();
  EXPECT_NE(pub.degraded_reason().find("anchor-only"), std::string::npos) << pub.degraded_reason();
  EXPECT_EQ(pub.latest_version(), 12u);
  EXPECT_TRUE(pub.state().tensors().empty());

  b.model.Step(0.05);
  Result<PublishStats> recovered = pub.Publish(next, b.model.Views());
  ASSERT_TRUE(recovered.ok()) << recovered.status().ToString();
  EXPECT_TRUE(recovered->recovered);
  EXPECT_TRUE(recovered->wrote_anchor);
  EXPECT_FALSE(recovered->wrote_delta);
  EXPECT_EQ(recovered->cumulative_bytes, 0u);
  EXPECT_FALSE(recovered->changed_elements.has_value());
  EXPECT_EQ(recovered->state_hash, HashTensors(b.model.Views()));
  EXPECT_FALSE(pub.degraded());
  b.hashes[next] = recovered->state_hash;

  const Manifest m = ReadManifest(*b.store);
  const VersionEntry& entry = *m.Find(next);
  ASSERT_EQ(entry.objects.size(), 1u);
  EXPECT_EQ(entry.objects[0].kind, PatchKind::kAnchor);
  EXPECT_FALSE(entry.changed_elements.has_value());
  const History history = SummarizeHistory(m);
  EXPECT_FALSE(history.versions.back().changed_fraction.has_value());

  // Normal again: deltas from the recovered version (and, with cumulative
  // deltas, one from it as the last anchor).
  b.PublishRange(pub, next + 1, next + 4);
  const Manifest after = ReadManifest(*b.store);
  EXPECT_EQ(after.Find(next + 1)->delta()->base_version, next);
  if (cumulative) {
    bool from_recovered = false;
    for (const ObjectEntry& o : after.Find(next + 4)->objects) from_recovered |= o.base_version == next;
    EXPECT_TRUE(from_recovered) << "no cumulative delta from the recovered anchor";
  }

  for (uint64_t target : {next, next + 4}) {
    Result<UpdateStats> moved = held->Update(target);
    ASSERT_TRUE(moved.ok()) << moved.status().ToString();
    EXPECT_EQ(HashState(held->state()), b.hashes[target]);
    auto fresh = Replica::Create(b.store);
    Result<UpdateStats> fresh_moved = fresh->Update(target);
    ASSERT_TRUE(fresh_moved.ok()) << fresh_moved.status().ToString();
    EXPECT_EQ(HashState(fresh->state()), b.hashes[target]);
  }
  EXPECT_EQ(HashState(held->state()), HashTensors(b.model.Views()));

  // A later publisher (the stateless CLI) opens normally and goes on.
  b.options = {};
  auto later = b.Reopen();
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  EXPECT_FALSE((*later)->degraded());
  b.PublishRange(**later, next + 5, next + 5);

  // verify reports the damage truthfully: 12 bad, the recovered version and
  // its successors verified.
  Result<VerifyReport> report = VerifyBucket(*b.store, VerifyOptions{std::nullopt, true, 0});
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->bad_objects.size(), 1u);
  EXPECT_EQ(report->bad_objects[0].key, kStep12);
  EXPECT_EQ(report->unreachable, std::vector<uint64_t>{12});
  EXPECT_EQ(report->verified.back(), next + 5);
  EXPECT_EQ(report->recovered, std::vector<uint64_t>{next});
}

INSTANTIATE_TEST_SUITE_P(, RecoverAfterDamageTest,
                         ::testing::Combine(::testing::Values(Damage::kDelete, Damage::kFlip),
                                            ::testing::Values(uint64_t{13}, uint64_t{20}), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == Damage::kDelete ? "Deleted" : "Flipped") +
                                  "Version" + std::to_string(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "Cumulative" : "Plain");
                         });

// Damage that can be routed around is routed around: no degraded mode.
TEST(RecoverTest, DamageWithAnotherRouteDoesNotDegrade) {
  Bucket b(CumulativeAdaptive());
  {
    auto first = b.Reopen();
    ASSERT_TRUE(first.ok());
    b.PublishRange(**first, 1, 9);
  }
  std::string cumulative;
  const Manifest m = ReadManifest(*b.store);
  for (const ObjectEntry& o : m.Find(9)->objects) {
    if (o.base_version == 1u) cumulative = o.key;
  }
  ASSERT_FALSE(cumulative.empty());
  b.Damage(cumulative, Damage::kFlip);
  auto opened = b.Reopen();
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_FALSE((*opened)->degraded()) << (*opened)->degraded_reason();
  b.PublishRange(**opened, 10, 10);
  auto replica = Replica::Create(b.store);
  ASSERT_TRUE(replica->Update().ok());
  EXPECT_EQ(HashState(replica->state()), HashTensors(b.model.Views()));
}

// An outage is not damage: Open fails as it always did, nothing degrades.
TEST(RecoverTest, AStoreFailureStillFailsOpen) {
  Bucket b(Plain());
  {
    auto first = b.Reopen();
    ASSERT_TRUE(first.ok());
    b.PublishRange(**first, 1, 12);
  }
  auto faulty = std::make_shared<testing::FaultStore>(b.store);
  faulty->fail_read = [&](std::string_view key) {
    return key == kStep12 ? Status::IOError("injected: connection reset") : Status::OK();
  };
  Result<std::unique_ptr<Publisher>> opened = Publisher::Open(faulty, b.options);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), ErrorCode::kIOError) << opened.status().ToString();
  EXPECT_NE(opened.status().message().find("rebuilding version 12"), std::string::npos) << opened.status().ToString();
  faulty->fail_read = nullptr;
  opened = Publisher::Open(faulty, b.options);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_FALSE((*opened)->degraded());
}

TEST(RecoverTest, ChangesAreRefusedUntilTheFullWeightsArePublished) {
  Bucket b(Plain());
  {
    auto first = b.Reopen();
    ASSERT_TRUE(first.ok());
    b.PublishRange(**first, 1, 12);
  }
  b.Damage(kStep12, Damage::kDelete);
  auto opened = b.Reopen();
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Publisher& pub = **opened;
  ASSERT_TRUE(pub.degraded());

  std::vector<TensorChanges> changes(1);
  for (const TensorView& t : b.model.Views()) {
    if (t.dtype == DType::kBF16) changes[0].name = t.name;
  }
  changes[0].dtype = DType::kBF16;
  changes[0].indices = {0};
  changes[0].values = {0x80, 0x3f};  // 1.0
  Result<PublishStats> refused = pub.PublishChanges(13, changes);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("full weights"), std::string::npos) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find(kStep12), std::string::npos) << refused.status().ToString();
  EXPECT_EQ(ReadManifest(*b.store).Latest()->version, 12u);

  // Another model (a different element count) is not taken as the recovery.
  RandomModel other(3, /*with_fp32=*/false);
  Result<PublishStats> wrong = pub.Publish(13, other.Views());
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), ErrorCode::kInvalidArgument) << wrong.status().ToString();
  EXPECT_TRUE(pub.degraded());

  b.model.Step(0.05);
  Result<PublishStats> full = pub.Publish(13, b.model.Views());
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_TRUE(full->recovered);
  Result<PublishStats> sparse = pub.PublishChanges(14, changes);
  ASSERT_TRUE(sparse.ok()) << sparse.status().ToString();
  EXPECT_EQ(sparse->changed_elements, 1u);
  EXPECT_TRUE(sparse->wrote_delta);
}

// A recovered publish that fails (the anchor upload) commits nothing and
// leaves the publisher degraded; the retry commits.
TEST(RecoverTest, AFailedRecoveredPublishStaysDegraded) {
  Bucket b(Plain());
  {
    auto first = b.Reopen();
    ASSERT_TRUE(first.ok());
    b.PublishRange(**first, 1, 12);
  }
  b.Damage(kStep12, Damage::kDelete);
  auto faulty = std::make_shared<testing::FaultStore>(b.store);
  faulty->fail_write = [](std::string_view key) {
    return key.starts_with("ds/anchors/") ? Status::IOError("injected: upload failed") : Status::OK();
  };
  auto opened = Publisher::Open(faulty, b.options);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Publisher& pub = **opened;
  ASSERT_TRUE(pub.degraded());
  b.model.Step(0.05);
  Result<PublishStats> failed = pub.Publish(13, b.model.Views());
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), ErrorCode::kIOError) << failed.status().ToString();
  EXPECT_TRUE(pub.degraded());
  EXPECT_EQ(pub.latest_version(), 12u);
  EXPECT_EQ(ReadManifest(*b.store).Latest()->version, 12u);

  faulty->fail_write = nullptr;
  Result<PublishStats> retried = pub.Publish(13, b.model.Views());
  ASSERT_TRUE(retried.ok()) << retried.status().ToString();
  EXPECT_TRUE(retried->recovered);
  EXPECT_FALSE(pub.degraded());
  auto replica = Replica::Create(b.store);
  ASSERT_TRUE(replica->Update().ok());
  EXPECT_EQ(HashState(replica->state()), HashTensors(b.model.Views()));
}

// Retention keeps what a fresh replica needs: the recovered anchor is an
// anchor like any other.
TEST(RecoverTest, GcAfterARecoveryKeepsTheRecoveredChain) {
  Bucket b(Plain());
  {
    auto first = b.Reopen();
    ASSERT_TRUE(first.ok());
    b.PublishRange(**first, 1, 12);
  }
  b.Damage(kStep12, Damage::kDelete);
  auto opened = b.Reopen();
  ASSERT_TRUE(opened.ok());
  b.model.Step(0.05);
  ASSERT_TRUE((*opened)->Publish(13, b.model.Views()).ok());
  b.PublishRange(**opened, 14, 15);

  Result<PruneStats> pruned = PruneVersions(*b.store, 1);
  ASSERT_TRUE(pruned.ok()) << pruned.status().ToString();
  EXPECT_EQ(pruned->kept_anchors, std::vector<uint64_t>{13});
  const Manifest m = ReadManifest(*b.store);
  EXPECT_EQ(m.versions.front().version, 13u);
  EXPECT_FALSE(m.versions.front().changed_elements.has_value());
  auto replica = Replica::Create(b.store);
  ASSERT_TRUE(replica->Update().ok());
  EXPECT_EQ(replica->version(), 15u);
  EXPECT_EQ(HashState(replica->state()), HashTensors(b.model.Views()));
}

// The manifest marks a recovered version `"recovered": true` and keeps
// changed_elements (= total_elements) for readers that require it.
TEST(RecoverTest, ManifestMarksARecoveredVersion) {
  Manifest m;
  for (uint64_t v : {1, 2}) {
    VersionEntry e;
    e.version = v;
    e.total_elements = 1000;
    e.changed_elements = v == 1 ? std::optional<uint64_t>(1000) : std::nullopt;
    e.objects.push_back(ObjectEntry{PatchKind::kAnchor, CompressedAnchorKey(v), IndexEncoding::kCompact, 10,
                                    std::string(32, 'a'), std::nullopt});
    m.versions.push_back(e);
  }
  const std::string json = m.ToJson();
  EXPECT_NE(json.find(R"("version":2,"state_hash":"00000000000000000000000000000000","total_elements":1000,)"
                      R"("changed_elements":1000,"recovered":true,)"),
            std::string::npos)
      << json;
  EXPECT_EQ(json.find("\"recovered\":false"), std::string::npos);
  auto parse = [](const std::string& text) {
    return Manifest::Parse(ByteSpan(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  };
  Result<Manifest> back = parse(json);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->versions[0].changed_elements, 1000u);
  EXPECT_FALSE(back->versions[1].changed_elements.has_value());

  std::string not_bool = json;
  not_bool.replace(not_bool.find("\"recovered\":true"), 16, "\"recovered\":1");
  Result<Manifest> bad = parse(not_bool);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'recovered' must be true or false"), std::string::npos) << bad.status().ToString();

  // A recovered version has no route but its anchor.
  Manifest no_anchor = m;
  no_anchor.versions[1].objects[0] = ObjectEntry{PatchKind::kDelta, CompactDeltaKey(2), IndexEncoding::kCompact, 10,
                                                 std::string(32, 'b'), 1};
  Result<Manifest> refused = parse(no_anchor.ToJson());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("a recovered version has no anchor"), std::string::npos)
      << refused.status().ToString();
}

}  // namespace
}  // namespace deltasync
