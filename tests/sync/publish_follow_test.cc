// Publisher + Replica end to end on a LocalStore: bit-exactness over many
// versions, and "bit-exact or loud" under every kind of damage.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "codec/compact_container.h"
#include "deltasync/compact.h"
#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/safetensors.h"
#include "testing/fault_store.h"
#include "testing/bucket_util.h"
#include "testing/random_model.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::FaultStore;
using testing::RandomModel;
using testing::OpenDirStore;
using testing::ReadManifest;
using testing::TempDir;

// The expected published state: the model's tensors as they are (bf16 and F32).
void ExpectStateEquals(const WeightState& state, const RandomModel& model) {
  std::vector<TensorView> views = model.Views();
  ASSERT_EQ(state.tensors().size(), views.size());
  for (const TensorView& v : views) {
    const WeightState::Tensor* t = state.Find(v.name);
    ASSERT_NE(t, nullptr) << v.name;
    ASSERT_EQ(t->dtype, v.dtype) << v.name;
    ASSERT_EQ(t->shape, v.shape) << v.name;
    ASSERT_TRUE(std::equal(t->data.begin(), t->data.end(), v.data.begin(), v.data.end())) << v.name;
  }
}

void WriteManifest(Store& store, const Manifest& m) {
  std::string json = m.ToJson();
  ASSERT_TRUE(store.Put(kManifestKey, ByteSpan(reinterpret_cast<const uint8_t*>(json.data()), json.size())).ok());
}

TEST(PublishFollowTest, BitExactOverManyVersionsWithGapsAndRandomAnchors) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    TempDir dir;
    auto store = OpenDirStore(dir.path());
    std::mt19937_64 rng(seed);
    PublisherOptions options;
    options.anchor_interval = 1 + rng() % 7;
    const IndexEncoding encodings[] = {IndexEncoding::kCompact, IndexEncoding::kGapDelta, IndexEncoding::kRaw};
    options.encoding = encodings[seed % 3];
    auto publisher = Publisher::Open(store, options);
    ASSERT_TRUE(publisher.ok()) << publisher.status().ToString();
    RandomModel model(seed);
    auto follower = Replica::Create(store);
    std::vector<std::pair<uint64_t, StateHash>> history;
    std::vector<std::vector<uint8_t>> snapshots;  // serialized expected state per version

    uint64_t version = 0;
    for (int i = 0; i < 55; ++i) {
      version += 1 + rng() % 3;  // gaps are allowed
      if (i > 0) model.Step(std::uniform_real_distribution<double>(0.0, 0.2)(rng));
      auto stats = (*publisher)->Publish(version, model.Views());
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
      EXPECT_EQ(stats->state_hash, HashTensors(model.Views())) << "version " << version;
      history.emplace_back(version, stats->state_hash);

      auto update = follower->Update();
      ASSERT_TRUE(update.ok()) << update.status().ToString();
      ASSERT_EQ(follower->version(), version);
      ExpectStateEquals(follower->state(), model);
      EXPECT_EQ(HashState(follower->state()), stats->state_hash);
      if (i > 0) EXPECT_EQ(update->anchors_applied, 0u) << "a following replica must never re-download a full model";
    }
    // Fresh replicas catch up to arbitrary versions from the nearest anchor.
    for (int k = 0; k < 8; ++k) {
      auto [v, hash] = history[rng() % history.size()];
      auto fresh = Replica::Create(store);
      auto update = fresh->Update(v);
      ASSERT_TRUE(update.ok()) << update.status().ToString();
      EXPECT_EQ(fresh->version(), v);
      EXPECT_EQ(HashState(fresh->state()), hash);
      EXPECT_LE(update->deltas_applied, *options.anchor_interval);
    }
    // The manifest records an anchor every anchor_interval versions.
    Manifest m = ReadManifest(*store);
    uint64_t last_anchor = 0;
    for (const VersionEntry& e : m.versions) {
      bool due = last_anchor == 0 || e.version / *options.anchor_interval > last_anchor / *options.anchor_interval;
      EXPECT_EQ(e.anchor() != nullptr, due) << "version " << e.version;
      if (e.anchor()) last_anchor = e.version;
      if (e.version != m.versions.front().version) EXPECT_NE(e.delta(), nullptr);
    }
  }
}

// PublisherOptions::compact_stream_version and compact_container: deltas in
// stream version 2 and 3, container 1 and 2, in one bucket (a publisher
// restarted with another setting), and a replica follows across them
// bit-exactly.
TEST(PublishFollowTest, CompactStreamVersionsTwoAndThreeMix) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model(9);
  auto follower = Replica::Create(store);
  uint64_t version = 0;
  for (auto [stream_version, container] : {std::pair{2, 1}, {3, 2}, {2, 2}, {3, 1}}) {
    PublisherOptions options;
    options.anchor_interval = 100;
    options.encoding = IndexEncoding::kCompact;
    options.compact_stream_version = stream_version;
    options.compact_container = container;
    auto publisher = Publisher::Open(store, options);
    ASSERT_TRUE(publisher.ok()) << publisher.status().ToString();
    for (int i = 0; i < 3; ++i) {
      if (++version > 1) model.Step(0.1);
      auto stats = (*publisher)->Publish(version, model.Views());
      ASSERT_TRUE(stats.ok()) << stats.status().ToString();
      auto update = follower->Update();
      ASSERT_TRUE(update.ok()) << update.status().ToString();
      ExpectStateEquals(follower->state(), model);
      if (version == 1) continue;
      const std::string key = ReadManifest(*store).Find(version)->delta()->key;
      auto blob = store->Get(key);
      ASSERT_TRUE(blob.ok());
      auto file = SafetensorsFile::Parse(*blob, key);
      ASSERT_TRUE(file.ok());
      ASSERT_FALSE(file->tensors().empty());
      Result<compact::RawStreams> streams = compact::ReadContainer(*file);
      ASSERT_TRUE(streams.ok()) << streams.status().ToString();
      EXPECT_EQ(streams->container, container) << key;
      ASSERT_FALSE(streams->streams.empty());
      for (const compact::RawStream& t : streams->streams) EXPECT_EQ(t.bytes[0], stream_version) << key << " " << t.index;
    }
  }
}

TEST(PublishFollowTest, Fp32MastersAreRoundedToNearestEven) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  auto publisher = Publisher::Open(store);
  ASSERT_TRUE(publisher.ok());
  // 1.0 + 2^-8 is a tie between bf16 1.0 (even) and the next value: rounds down.
  // 1.0 + 2^-8 + 2^-20 is above the tie: rounds up.
  std::vector<float> w = {1.0f + 1.0f / 256, 1.0f + 1.0f / 256 + 1.0f / (1 << 20), -2.5f, 0.0f};
  TensorView t{"w", DType::kF32, {4}, ByteSpan(reinterpret_cast<const uint8_t*>(w.data()), 16)};
  ASSERT_TRUE((*publisher)->Publish(1, std::span<const TensorView>(&t, 1)).ok());
  const WeightState::Tensor* got = (*publisher)->state().Find("w");
  ASSERT_NE(got, nullptr);
  ASSERT_EQ(got->dtype, DType::kBF16);
  uint16_t v[4];
  std::memcpy(v, got->data.data(), 8);
  EXPECT_EQ(v[0], 0x3F80);
  EXPECT_EQ(v[1], 0x3F81);
  EXPECT_EQ(v[2], 0xC020);
  EXPECT_EQ(v[3], 0x0000);
}

// Each kind of damage, for TRL's gap_delta and for compact objects. Version
// 4 has no anchor, so its delta is the only route from 3: a damaged one is
// refused with nothing to route around (tests/sync/replan_test.cc covers
// the routing).
class DamageTest : public ::testing::TestWithParam<IndexEncoding> {
 protected:
  void SetUp() override {
    store_ = OpenDirStore(dir_.path());
    PublisherOptions options;
    options.anchor_interval = 100;
    options.encoding = GetParam();
    auto publisher = Publisher::Open(store_, options);
    ASSERT_TRUE(publisher.ok());
    publisher_ = std::move(*publisher);
    for (uint64_t v = 1; v <= 3; ++v) {
      if (v > 1) model_.Step(0.05);
      ASSERT_TRUE(publisher_->Publish(v, model_.Views()).ok());
    }
    replica_ = Replica::Create(store_);
    ASSERT_TRUE(replica_->Update().ok());
    ASSERT_EQ(replica_->version(), 3u);
    good_hash_ = HashState(replica_->state());
    model_.Step(0.05);
    ASSERT_TRUE(publisher_->Publish(4, model_.Views()).ok());  // a delta only
  }

  // The replica must still be on version 3, bit for bit.
  void ExpectStillOnGoodVersion() {
    EXPECT_EQ(replica_->version(), 3u);
    EXPECT_EQ(HashState(replica_->state()), good_hash_);
    EXPECT_EQ(replica_->state_hash(), good_hash_);
  }

  std::string DeltaKeyOf(uint64_t v) { return ReadManifest(*store_).Find(v)->delta()->key; }
  std::string AnchorKeyOf(uint64_t v) { return ReadManifest(*store_).Find(v)->anchor()->key; }

  void Rewrite(const std::string& key, const std::function<void(std::vector<uint8_t>&)>& edit) {
    auto blob = store_->Get(key);
    ASSERT_TRUE(blob.ok());
    std::vector<uint8_t> bytes(blob->bytes().begin(), blob->bytes().end());
    edit(bytes);
    ASSERT_TRUE(store_->Put(key, bytes).ok());
  }

  // Decodes version 4's delta (against the replica's state, version 3),
  // lets `edit` change it, re-encodes it in the same encoding and lists the
  // new object in the manifest: a well-formed delta whose content is wrong.
  void ReencodeDelta4(const std::function<void(std::vector<TensorChanges>&)>& edit) {
    const std::string key = DeltaKeyOf(4);
    auto blob = store_->Get(key);
    ASSERT_TRUE(blob.ok());
    auto file = SafetensorsFile::Parse(*blob, key);
    ASSERT_TRUE(file.ok());
    Result<EncodedPatch> encoded = Status::Internal("unset");
    if (GetParam() == IndexEncoding::kCompact) {
      auto delta = DecodeCompactDelta(*file, replica_->state(), good_hash_);
      ASSERT_TRUE(delta.ok()) << delta.status().ToString();
      ASSERT_FALSE(delta->changes.empty());
      edit(delta->changes);
      encoded = EncodeCompactDelta(delta->info, good_hash_, replica_->state(), delta->changes);
    } else {
      auto patch = DecodePatch(std::move(*file));
      ASSERT_TRUE(patch.ok());
      ASSERT_FALSE(patch->changes.empty());
      edit(patch->changes);
      encoded = EncodeDelta(patch->info, patch->changes);
    }
    ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
    ASSERT_TRUE(store_->Put(key, encoded->parts).ok());
    Manifest m = ReadManifest(*store_);
    for (ObjectEntry& obj : m.versions.back().objects) {
      if (obj.key != key) continue;
      obj.size = encoded->size;
      obj.xxh3_128 = Xxh3Hex(encoded->parts);
    }
    WriteManifest(*store_, m);
  }

  TempDir dir_;
  std::shared_ptr<Store> store_;
  std::unique_ptr<Publisher> publisher_;
  std::unique_ptr<Replica> replica_;
  RandomModel model_{7};
  StateHash good_hash_;
};

TEST_P(DamageTest, CorruptedDeltaIsRefused) {
  Rewrite(DeltaKeyOf(4), [](std::vector<uint8_t>& b) { b[b.size() - 3] ^= 0x40; });
  auto r = replica_->Update();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kIntegrity);
  EXPECT_NE(r.status().message().find("version 4"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("xxh3-128 mismatch"), std::string::npos) << r.status().message();
  ExpectStillOnGoodVersion();
  ASSERT_EQ(replica_->bad_objects().size(), 1u);
  EXPECT_EQ(replica_->bad_objects()[0].key, DeltaKeyOf(4));
}

TEST_P(DamageTest, TruncatedDeltaIsRefused) {
  Rewrite(DeltaKeyOf(4), [](std::vector<uint8_t>& b) { b.resize(b.size() / 2); });
  auto r = replica_->Update();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kIntegrity);
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos) << r.status().message();
  ExpectStillOnGoodVersion();
}

TEST_P(DamageTest, MissingDeltaIsRefused) {
  const std::string key = DeltaKeyOf(4);
  ASSERT_TRUE(store_->Delete(key).ok());
  auto r = replica_->Update();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.status().message().find(key), std::string::npos) << r.status().message();
  ExpectStillOnGoodVersion();
}

TEST_P(DamageTest, WrongStateHashInManifestIsRefused) {
  Manifest m = ReadManifest(*store_);
  m.versions.back().state_hash.lo ^= 1;
  WriteManifest(*store_, m);
  auto r = replica_->Update();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kIntegrity);
  EXPECT_NE(r.status().message().find("stays on version 3"), std::string::npos) << r.status().message();
  ExpectStillOnGoodVersion();
}

// A well-formed delta with matching object hash but the wrong content (a
// publisher bug): only the state hash can catch it.
TEST_P(DamageTest, ValidDeltaWithWrongContentIsCaughtByStateHash) {
  ReencodeDelta4([](std::vector<TensorChanges>& changes) { changes[0].values[0] ^= 0x01; });
  auto r = replica_->Update();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kIntegrity) << r.status().ToString();
  EXPECT_NE(r.status().message().find("state"), std::string::npos) << r.status().message();
  ExpectStillOnGoodVersion();
}

TEST_P(DamageTest, OutOfRangeIndexIsRefused) {
  if (GetParam() == IndexEncoding::kCompact) {
    GTEST_SKIP() << "a compact delta codes positions relative to its base and cannot express an index out of range "
                    "(its decoder's bounds are covered in tests/codec)";
  }
  std::string name;
  ReencodeDelta4([&](std::vector<TensorChanges>& changes) {
    changes[0].indices.back() = 1ull << 40;
    name = changes[0].name;
  });
  auto r = replica_->Update();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCorruption) << r.status().ToString();
  EXPECT_NE(r.status().message().find(name), std::string::npos) << r.status().message();
  ExpectStillOnGoodVersion();
}

// A compact delta is only valid on its exact base: version 5's delta (base
// 4) listed as version 4's (base 3) is refused before any byte changes.
TEST_P(DamageTest, CompactDeltaOnTheWrongBaseIsRefused) {
  if (GetParam() != IndexEncoding::kCompact) GTEST_SKIP() << "TRL deltas carry no base hash";
  model_.Step(0.05);
  ASSERT_TRUE(publisher_->Publish(5, model_.Views()).ok());
  auto five = store_->Get(DeltaKeyOf(5));
  ASSERT_TRUE(five.ok());
  const std::string key = DeltaKeyOf(4);
  ASSERT_TRUE(store_->Put(key, five->bytes()).ok());
  Manifest m = ReadManifest(*store_);
  for (ObjectEntry& obj : m.versions[3].objects) {
    if (obj.key != key) continue;
    obj.size = five->size();
    obj.xxh3_128 = Xxh3Hex(five->bytes());
  }
  m.versions.pop_back();  // version 5 unlisted, so the plan must go through 4's delta
  m.versions.back().objects.erase(
      std::remove_if(m.versions.back().objects.begin(), m.versions.back().objects.end(),
                     [](const ObjectEntry& o) { return o.kind == PatchKind::kAnchor; }),
      m.versions.back().objects.end());
  WriteManifest(*store_, m);
  auto r = replica_->Update(4);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find(good_hash_.Hex()), std::string::npos) << r.status().message();
  ExpectStillOnGoodVersion();
}

TEST_P(DamageTest, FreshReplicaRefusesCorruptAnchor) {
  Rewrite(AnchorKeyOf(1), [](std::vector<uint8_t>& b) { b[b.size() / 2] ^= 0x01; });
  auto fresh = Replica::Create(store_);
  auto r = fresh->Update(4);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kIntegrity);
  EXPECT_NE(r.status().message().find("anchor of version 1"), std::string::npos) << r.status().message();
  EXPECT_EQ(fresh->version(), 0u);
  // The follower does not need the anchor: it still moves on by the delta.
  auto follow = replica_->Update();
  ASSERT_TRUE(follow.ok()) << follow.status().ToString();
  EXPECT_EQ(replica_->version(), 4u);
}

TEST_P(DamageTest, MidChainFailureKeepsLastVerifiedVersion) {
  for (uint64_t v = 5; v <= 6; ++v) {
    model_.Step(0.05);
    ASSERT_TRUE(publisher_->Publish(v, model_.Views()).ok());
  }
  ASSERT_TRUE(store_->Delete(DeltaKeyOf(6)).ok());
  auto r = replica_->Update();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(replica_->version(), 5u) << "versions 4 and 5 verified before 6 failed";
  EXPECT_EQ(HashState(replica_->state()), replica_->state_hash());
}

TEST_P(DamageTest, ManifestRolledBackIsRefused) {
  Manifest m = ReadManifest(*store_);
  m.versions.resize(2);
  WriteManifest(*store_, m);
  auto r = replica_->Update();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kIntegrity);
  ExpectStillOnGoodVersion();
}

INSTANTIATE_TEST_SUITE_P(Encodings, DamageTest, ::testing::Values(IndexEncoding::kCompact, IndexEncoding::kGapDelta),
                         [](const auto& info) { return std::string(EncodingName(info.param)); });

TEST(PublisherTest, RefusesOldVersionsAndNonFinite) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  auto pub = Publisher::Open(store);
  ASSERT_TRUE(pub.ok());
  RandomModel model(3);
  ASSERT_TRUE((*pub)->Publish(5, model.Views()).ok());
  for (uint64_t v : {0u, 3u, 5u}) {
    auto r = (*pub)->Publish(v, model.Views());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  }
  uint16_t nan = 0x7FC0;
  std::memcpy(model.tensors()[1].data.data() + 6, &nan, 2);
  auto r = (*pub)->Publish(6, model.Views());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(model.tensors()[1].name), std::string::npos) << r.status().message();
  EXPECT_EQ((*pub)->latest_version(), 5u);
}

// A crash between objects and manifest: the objects are there, the manifest
// is not updated; the publisher is unchanged and a retry succeeds. Twice,
// so that the second failure rolls back a delta written into the first
// one's kept buffers (gap_delta: the kept change list, old values and patch).
TEST(PublisherTest, FailedManifestWriteLeavesNothingCommitted) {
  for (IndexEncoding encoding : {IndexEncoding::kCompact, IndexEncoding::kGapDelta}) {
    SCOPED_TRACE(EncodingName(encoding));
    TempDir dir;
    auto faulty = std::make_shared<FaultStore>(OpenDirStore(dir.path()));
    PublisherOptions options;
    options.encoding = encoding;
    auto pub = Publisher::Open(faulty, options);
    ASSERT_TRUE(pub.ok());
    RandomModel model(4);
    ASSERT_TRUE((*pub)->Publish(1, model.Views()).ok());
    auto replica = Replica::Create(faulty);
    for (uint64_t version : {2u, 3u}) {
      StateHash before = HashState((*pub)->state());
      model.Step(version == 2 ? 0.1 : 0.3);  // the second delta is larger than the first
      faulty->fail_write = [](std::string_view key) {
        return key == kManifestKey ? Status::IOError("injected: disk full") : Status::OK();
      };
      auto r = (*pub)->Publish(version, model.Views());
      ASSERT_FALSE(r.ok());
      EXPECT_NE(r.status().message().find("injected"), std::string::npos);
      EXPECT_EQ((*pub)->latest_version(), version - 1);
      EXPECT_EQ(HashState((*pub)->state()), before) << "a failed publish must roll the state back";

      ASSERT_TRUE(replica->Update().ok());
      EXPECT_EQ(replica->version(), version - 1);

      faulty->fail_write = nullptr;
      auto retry = (*pub)->Publish(version, model.Views());
      ASSERT_TRUE(retry.ok()) << retry.status().ToString();
      ASSERT_TRUE(replica->Update().ok());
      EXPECT_EQ(replica->version(), version);
      ExpectStateEquals(replica->state(), model);
    }
  }
}

// The compact delta's upload fails after the fused pass applied the bf16
// changes and the F32 tensor's: every byte of the state goes back.
TEST(PublisherTest, FailedDeltaUploadRestoresEveryTensor) {
  TempDir dir;
  auto faulty = std::make_shared<FaultStore>(OpenDirStore(dir.path()));
  auto pub = Publisher::Open(faulty);
  ASSERT_TRUE(pub.ok());
  RandomModel model(6);
  ASSERT_TRUE((*pub)->Publish(1, model.Views()).ok());
  auto bytes = [&] {
    std::vector<std::vector<uint8_t>> out;
    for (const auto& t : (*pub)->state().tensors()) out.emplace_back(t.data.begin(), t.data.end());
    return out;
  };
  const auto before = bytes();
  const StateHash hash_before = HashState((*pub)->state());
  model.Step(0.2);
  for (auto& t : model.tensors()) {
    if (t.dtype == DType::kF32) t.data[5] ^= 0x01;  // the kept-F32 tensor changes too
  }
  faulty->fail_write = [](std::string_view key) {
    return key.starts_with("ds/deltas/") ? Status::IOError("injected: upload failed") : Status::OK();
  };
  auto r = (*pub)->Publish(2, model.Views());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("injected"), std::string::npos) << r.status().ToString();
  EXPECT_EQ((*pub)->latest_version(), 1u);
  EXPECT_EQ(bytes(), before);
  EXPECT_EQ(HashState((*pub)->state()), hash_before);

  faulty->fail_write = nullptr;
  auto retry = (*pub)->Publish(2, model.Views());
  ASSERT_TRUE(retry.ok()) << retry.status().ToString();
  EXPECT_GT(retry->changed_elements, 0u);
  auto replica = Replica::Create(faulty);
  ASSERT_TRUE(replica->Update().ok());
  ExpectStateEquals(replica->state(), model);
}

TEST(PublisherTest, ReopenContinuesFromTheBucket) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model(5);
  {
    auto pub = Publisher::Open(store);
    ASSERT_TRUE(pub.ok());
    for (uint64_t v = 1; v <= 3; ++v) {
      if (v > 1) model.Step(0.05);
      ASSERT_TRUE((*pub)->Publish(v, model.Views()).ok());
    }
  }
  auto pub = Publisher::Open(store);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  EXPECT_EQ((*pub)->latest_version(), 3u);
  model.Step(0.05);
  auto stats = (*pub)->Publish(4, model.Views());
  ASSERT_TRUE(stats.ok());
  EXPECT_TRUE(stats->wrote_delta);
  EXPECT_FALSE(stats->wrote_anchor);
  auto replica = Replica::Create(store);
  ASSERT_TRUE(replica->Update().ok());
  ExpectStateEquals(replica->state(), model);
}

TEST(PublisherTest, TwoPublishersCannotOverwriteEachOther) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  RandomModel model(6);
  auto a = Publisher::Open(store);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->Publish(1, model.Views()).ok());
  auto b = Publisher::Open(store);
  ASSERT_TRUE(b.ok());
  model.Step(0.05);
  ASSERT_TRUE((*b)->Publish(2, model.Views()).ok());
  model.Step(0.05);
  auto r = (*a)->Publish(3, model.Views());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kConflict) << r.status().ToString();
  EXPECT_EQ(ReadManifest(*store).Latest()->version, 2u);
}

// S3 answers 412 to a retried conditional PUT whose first attempt landed:
// the publisher must recognise its own commit by the writer stamp.
TEST(PublisherTest, RecognisesItsOwnManifestWriteAfterAConflictingRetry) {
  TempDir dir;
  auto faulty = std::make_shared<FaultStore>(OpenDirStore(dir.path()));
  auto pub = Publisher::Open(faulty);
  ASSERT_TRUE(pub.ok());
  RandomModel model(9);
  faulty->fail_after_conditional_write = [](std::string_view) {
    return Status::Conflict("injected: 412 Precondition Failed on a retried PUT");
  };
  for (uint64_t v = 1; v <= 3; ++v) {
    if (v > 1) model.Step(0.05);
    auto r = (*pub)->Publish(v, model.Views());
    ASSERT_TRUE(r.ok()) << "version " << v << ": " << r.status().ToString();
  }
  Manifest m = ReadManifest(*faulty);
  ASSERT_TRUE(m.writer.has_value());
  EXPECT_EQ(m.writer->seq, 3u);
  // Another publisher's commit in between is still a conflict.
  auto other = Publisher::Open(faulty);
  ASSERT_TRUE(other.ok());
  faulty->fail_after_conditional_write = nullptr;
  model.Step(0.05);
  ASSERT_TRUE((*other)->Publish(4, model.Views()).ok());
  model.Step(0.05);
  auto lost = (*pub)->Publish(5, model.Views());
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), ErrorCode::kConflict) << lost.status().ToString();
  EXPECT_NE(ReadManifest(*faulty).writer->id, m.writer->id);
}

TEST(ReplicaTest, ClearErrorsForEmptyBucketAndUnknownVersions) {
  TempDir dir;
  auto store = OpenDirStore(dir.path());
  auto replica = Replica::Create(store);
  auto r = replica->Update();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.status().message().find("manifest.json"), std::string::npos);

  auto pub = Publisher::Open(store);
  RandomModel model(8);
  ASSERT_TRUE((*pub)->Publish(2, model.Views()).ok());
  auto missing = replica->Update(3);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  ASSERT_TRUE(replica->Update(2).ok());
  auto back = replica->Update(1);
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace deltasync
