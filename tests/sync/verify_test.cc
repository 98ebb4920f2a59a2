// VerifyBucket: a clean bucket verifies; each kind of damage is reported
// with its key and version, on and (with all) off the cheapest path.
#include "deltasync/verify.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "deltasync/compact.h"
#include "deltasync/manifest.h"
#include "deltasync/plan.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/safetensors.h"
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

void WriteManifest(Store& store, const Manifest& m) {
  std::string json = m.ToJson();
  ASSERT_TRUE(store.Put(kManifestKey, ByteSpan(reinterpret_cast<const uint8_t*>(json.data()), json.size())).ok());
}

VerifyReport Verify(Store& store, VerifyOptions options = {}) {
  options.threads = 2;
  Result<VerifyReport> r = VerifyBucket(store, options);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(*r) : VerifyReport{};
}

VerifyOptions All() {
  VerifyOptions o;
  o.all = true;
  return o;
}

std::string Keys(const std::vector<ObjectProblem>& problems) {
  std::string s;
  for (const ObjectProblem& p : problems) s += "[" + std::to_string(p.version) + " " + p.key + ": " + p.reason + "]";
  return s;
}

// Versions 1-7, anchors at 1 and 4, cumulative deltas 1->3 and 4->6: the
// cheapest chain to 7 is anchor 4, cumulative 4->6, step 7.
class BucketVerifyTest : public ::testing::TestWithParam<IndexEncoding> {
 protected:
  void SetUp() override {
    store_ = OpenDirStore(dir_.path());
    PublisherOptions options;
    options.anchor_interval = 4;
    options.cumulative_interval = 2;
    options.encoding = GetParam();
    auto publisher = Publisher::Open(store_, options);
    ASSERT_TRUE(publisher.ok()) << publisher.status().ToString();
    RandomModel model(5);
    for (uint64_t v = 1; v <= 7; ++v) {
      if (v > 1) model.Step(0.03);
      ASSERT_TRUE((*publisher)->Publish(v, model.Views()).ok());
    }
    Manifest m = ReadManifest(*store_);
    ASSERT_NE(m.Find(4)->anchor(), nullptr);
    ASSERT_NE(Cumulative(m, 3), nullptr);
    ASSERT_NE(Cumulative(m, 6), nullptr);
    auto plan = PlanCatchUp(m, std::nullopt, 7);
    ASSERT_TRUE(plan.ok());
    ASSERT_EQ(plan->steps.size(), 3u);
    ASSERT_EQ(plan->steps[1].object.key, Cumulative(m, 6)->key);
  }

  static const ObjectEntry* Cumulative(const Manifest& m, uint64_t v) {
    for (const ObjectEntry& o : m.Find(v)->objects) {
      if (o.kind == PatchKind::kDelta && o.base_version != v - 1) return &o;
    }
    return nullptr;
  }
  std::string StepKey(uint64_t v) {
    const Manifest m = ReadManifest(*store_);
    for (const ObjectEntry& o : m.Find(v)->objects) {
      if (o.kind == PatchKind::kDelta && o.base_version == v - 1) return o.key;
    }
    return "";
  }
  std::string CumulativeKey(uint64_t v) {
    const Manifest m = ReadManifest(*store_);
    return Cumulative(m, v)->key;
  }
  std::string AnchorKey(uint64_t v) {
    const Manifest m = ReadManifest(*store_);
    return m.Find(v)->anchor()->key;
  }

  void Rewrite(const std::string& key, const std::function<void(std::vector<uint8_t>&)>& edit) {
    auto blob = store_->Get(key);
    ASSERT_TRUE(blob.ok());
    std::vector<uint8_t> bytes(blob->bytes().begin(), blob->bytes().end());
    edit(bytes);
    ASSERT_TRUE(store_->Put(key, bytes).ok());
  }

  TempDir dir_;
  std::shared_ptr<Store> store_;
};

TEST_P(BucketVerifyTest, CleanBucketVerifiesWithoutWriting) {
  auto before = store_->List("");
  ASSERT_TRUE(before.ok());
  VerifyReport newest = Verify(*store_);
  EXPECT_TRUE(newest.ok()) << Keys(newest.bad_objects);
  EXPECT_EQ(newest.targets, (std::vector<uint64_t>{7}));
  EXPECT_EQ(newest.verified, (std::vector<uint64_t>{4, 6, 7}));
  EXPECT_EQ(newest.objects_checked, 3u);

  VerifyReport all = Verify(*store_, All());
  EXPECT_TRUE(all.ok()) << Keys(all.bad_objects);
  EXPECT_EQ(all.verified, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(all.unchecked.empty()) << Keys(all.unchecked);
  uint64_t objects = 0, bytes = 0;
  for (const VersionEntry& v : ReadManifest(*store_).versions) {
    for (const ObjectEntry& o : v.objects) objects++, bytes += o.size;
  }
  EXPECT_EQ(all.objects_checked, objects);
  EXPECT_EQ(all.bytes_downloaded, bytes);  // each object once

  auto after = store_->List("");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*before, *after);
}

TEST_P(BucketVerifyTest, FlippedByteInTheNewestDeltaMakesItUnreachable) {
  const std::string key = StepKey(7);
  Rewrite(key, [](std::vector<uint8_t>& b) { b[b.size() - 5] ^= 0x10; });
  for (const VerifyOptions& options : {VerifyOptions{}, All()}) {
    VerifyReport r = Verify(*store_, options);
    EXPECT_FALSE(r.ok());
    ASSERT_EQ(r.bad_objects.size(), 1u) << Keys(r.bad_objects);
    EXPECT_EQ(r.bad_objects[0].key, key);
    EXPECT_EQ(r.bad_objects[0].version, 7u);
    EXPECT_EQ(r.bad_objects[0].code, ErrorCode::kIntegrity);
    EXPECT_NE(r.bad_objects[0].reason.find("xxh3-128 mismatch"), std::string::npos) << r.bad_objects[0].reason;
    EXPECT_EQ(r.unreachable, (std::vector<uint64_t>{7}));
  }
}

// The anchor on the cheapest chain is truncated: the next cheapest chain
// (anchor 1 and deltas) still reaches the newest version.
TEST_P(BucketVerifyTest, TruncatedAnchorIsReportedAndAnotherChainTried) {
  const std::string key = AnchorKey(4);
  Rewrite(key, [](std::vector<uint8_t>& b) { b.resize(b.size() - 100); });
  VerifyReport r = Verify(*store_);
  EXPECT_FALSE(r.ok());
  ASSERT_EQ(r.bad_objects.size(), 1u) << Keys(r.bad_objects);
  EXPECT_EQ(r.bad_objects[0].key, key);
  EXPECT_EQ(r.bad_objects[0].version, 4u);
  EXPECT_NE(r.bad_objects[0].reason.find("truncated"), std::string::npos) << r.bad_objects[0].reason;
  EXPECT_TRUE(r.unreachable.empty());
  EXPECT_TRUE(std::ranges::binary_search(r.verified, 7u));
  EXPECT_TRUE(std::ranges::binary_search(r.verified, 1u));
}

// --all: version 5 (only a step delta) becomes unreachable; 6 is still
// reached through the cumulative delta from 4, and 6's step delta (from 5)
// can only have its bytes checked.
TEST_P(BucketVerifyTest, DeletedStepDeltaLeavesItsVersionUnreachable) {
  const std::string key = StepKey(5);
  ASSERT_TRUE(store_->Delete(key).ok());
  VerifyReport newest = Verify(*store_);
  EXPECT_TRUE(newest.ok()) << "not on the cheapest chain to 7: " << Keys(newest.bad_objects);

  VerifyReport r = Verify(*store_, All());
  EXPECT_FALSE(r.ok());
  ASSERT_EQ(r.bad_objects.size(), 1u) << Keys(r.bad_objects);
  EXPECT_EQ(r.bad_objects[0].key, key);
  EXPECT_EQ(r.bad_objects[0].version, 5u);
  EXPECT_EQ(r.bad_objects[0].code, ErrorCode::kNotFound);
  EXPECT_NE(r.bad_objects[0].reason.find("missing"), std::string::npos) << r.bad_objects[0].reason;
  EXPECT_EQ(r.unreachable, (std::vector<uint64_t>{5}));
  EXPECT_EQ(r.verified, (std::vector<uint64_t>{1, 2, 3, 4, 6, 7}));
  ASSERT_EQ(r.unchecked.size(), 1u) << Keys(r.unchecked);
  EXPECT_EQ(r.unchecked[0].key, StepKey(6));
}

TEST_P(BucketVerifyTest, WrongStateHashInTheManifestIsReported) {
  Manifest m = ReadManifest(*store_);
  m.versions.back().state_hash.lo ^= 1;
  WriteManifest(*store_, m);
  VerifyReport r = Verify(*store_);
  EXPECT_FALSE(r.ok());
  ASSERT_EQ(r.bad_objects.size(), 1u) << Keys(r.bad_objects);
  EXPECT_EQ(r.bad_objects[0].key, StepKey(7));
  EXPECT_EQ(r.bad_objects[0].version, 7u);
  EXPECT_EQ(r.bad_objects[0].code, ErrorCode::kIntegrity);
  EXPECT_NE(r.bad_objects[0].reason.find("the manifest says"), std::string::npos) << r.bad_objects[0].reason;
  EXPECT_EQ(r.unreachable, (std::vector<uint64_t>{7}));
}

// Damage off the cheapest path: only --all finds it, and version 3 stays
// reachable through its step deltas.
TEST_P(BucketVerifyTest, CorruptedCumulativeDeltaOffTheCheapestPathIsFoundByAll) {
  const std::string key = CumulativeKey(3);
  Rewrite(key, [](std::vector<uint8_t>& b) { b[b.size() / 2] ^= 0x01; });
  VerifyReport newest = Verify(*store_);
  EXPECT_TRUE(newest.ok()) << Keys(newest.bad_objects);

  VerifyReport r = Verify(*store_, All());
  EXPECT_FALSE(r.ok());
  ASSERT_EQ(r.bad_objects.size(), 1u) << Keys(r.bad_objects);
  EXPECT_EQ(r.bad_objects[0].key, key);
  EXPECT_EQ(r.bad_objects[0].version, 3u);
  EXPECT_TRUE(r.unreachable.empty());
  EXPECT_EQ(r.verified, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7}));

  // --version 3 plans through that cumulative delta, reports it, and reaches
  // 3 through the steps instead.
  VerifyOptions three;
  three.version = 3;
  VerifyReport v3 = Verify(*store_, three);
  ASSERT_EQ(v3.bad_objects.size(), 1u) << Keys(v3.bad_objects);
  EXPECT_EQ(v3.bad_objects[0].key, key);
  EXPECT_EQ(v3.verified, (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_TRUE(v3.unreachable.empty());
}

// A well-formed cumulative delta whose object hash is listed correctly but
// whose content is wrong (a publisher bug): only replaying it from its
// verified base (anchor 1) catches it.
TEST_P(BucketVerifyTest, WrongContentInACumulativeDeltaIsCaughtFromItsBase) {
  auto base = Replica::Create(store_);
  ASSERT_TRUE(base->Update(1).ok());
  Manifest m = ReadManifest(*store_);
  const std::string key = Cumulative(m, 3)->key;
  auto blob = store_->Get(key);
  ASSERT_TRUE(blob.ok());
  auto file = SafetensorsFile::Parse(*blob, key);
  ASSERT_TRUE(file.ok());
  Result<EncodedPatch> encoded = Status::Internal("unset");
  if (GetParam() == IndexEncoding::kCompact) {
    auto delta = DecodeCompactDelta(*file, base->state(), base->state_hash());
    ASSERT_TRUE(delta.ok()) << delta.status().ToString();
    delta->changes[0].values[0] ^= 0x01;
    encoded = EncodeCompactDelta(delta->info, base->state_hash(), base->state(), delta->changes);
  } else {
    auto patch = DecodePatch(std::move(*file));
    ASSERT_TRUE(patch.ok());
    patch->changes[0].values[0] ^= 0x01;
    encoded = EncodeDelta(patch->info, patch->changes);
  }
  ASSERT_TRUE(encoded.ok()) << encoded.status().ToString();
  ASSERT_TRUE(store_->Put(key, encoded->parts).ok());
  for (VersionEntry& v : m.versions) {
    for (ObjectEntry& o : v.objects) {
      if (o.key != key) continue;
      o.size = encoded->size;
      o.xxh3_128 = Xxh3Hex(encoded->parts);
    }
  }
  WriteManifest(*store_, m);

  VerifyReport r = Verify(*store_, All());
  ASSERT_EQ(r.bad_objects.size(), 1u) << Keys(r.bad_objects);
  EXPECT_EQ(r.bad_objects[0].key, key);
  EXPECT_EQ(r.bad_objects[0].version, 3u);
  EXPECT_EQ(r.bad_objects[0].code, ErrorCode::kIntegrity);
  EXPECT_NE(r.bad_objects[0].reason.find("would hash to"), std::string::npos) << r.bad_objects[0].reason;
  EXPECT_TRUE(r.unreachable.empty());
}

// Version 6 keeps only its cumulative delta good: --all rebuilds the state of
// 6 through it (neither 6's step delta nor an anchor gets there) and goes on
// to check 7 from it.
TEST_P(BucketVerifyTest, AllRebuildsAVersionReachedOnlyByACumulativeDelta) {
  const std::string key = StepKey(6);
  Rewrite(key, [](std::vector<uint8_t>& b) { b[b.size() - 9] ^= 0x04; });
  VerifyReport r = Verify(*store_, All());
  ASSERT_EQ(r.bad_objects.size(), 1u) << Keys(r.bad_objects);
  EXPECT_EQ(r.bad_objects[0].key, key);
  EXPECT_EQ(r.bad_objects[0].version, 6u);
  EXPECT_TRUE(r.unreachable.empty());
  EXPECT_EQ(r.verified, (std::vector<uint64_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_TRUE(r.unchecked.empty()) << Keys(r.unchecked);
}

TEST_P(BucketVerifyTest, UnknownVersionAndMissingManifestAreErrors) {
  VerifyOptions nine;
  nine.version = 9;
  auto r = VerifyBucket(*store_, nine);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.status().message().find("version 9 is not in"), std::string::npos) << r.status().message();

  TempDir empty;
  auto none = VerifyBucket(*OpenDirStore(empty.path()));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(none.status().message().find("manifest.json"), std::string::npos) << none.status().message();
}

// Side files: v1 lists {config A, tokenizer T}, v3 {config B, tokenizer T};
// v2 and v4 inherit. Each object is checked once; a bad one is reported for
// every version whose `files` lists it, and only for the sets checked.
TEST(SideFileVerifyTest, CorruptedAndDeletedSideFilesAreBadObjects) {
  TempDir dir;
  std::shared_ptr<Store> store = OpenDirStore(dir.path());
  auto publisher = Publisher::Open(store, PublisherOptions{.anchor_interval = 4});
  ASSERT_TRUE(publisher.ok());
  auto file = [](const std::string& name, const std::string& text) {
    return SideFile{name, Blob::FromVector({text.begin(), text.end()})};
  };
  const std::vector<SideFile> v1 = {file("config.json", "{\"a\": 1}"), file("tokenizer.json", "{\"t\": 0}")};
  const std::vector<SideFile> v3 = {file("config.json", "{\"a\": 3}"), file("tokenizer.json", "{\"t\": 0}")};
  RandomModel model(5);
  for (uint64_t v = 1; v <= 4; ++v) {
    if (v > 1) model.Step(0.03);
    std::optional<std::span<const SideFile>> files;
    if (v == 1) files = std::span<const SideFile>(v1);
    if (v == 3) files = std::span<const SideFile>(v3);
    ASSERT_TRUE((*publisher)->Publish(v, model.Views(), files).ok());
  }
  const Manifest m = ReadManifest(*store);
  const std::string a = m.Find(1)->files->at("config.json").key;
  const std::string b = m.Find(3)->files->at("config.json").key;
  const std::string t = m.Find(3)->files->at("tokenizer.json").key;
  ASSERT_EQ(m.Find(1)->files->at("tokenizer.json").key, t);

  VerifyReport clean = Verify(*store, All());
  EXPECT_TRUE(clean.ok()) << Keys(clean.bad_objects);
  uint64_t objects = 3;  // a, b, t: once each
  for (const VersionEntry& v : m.versions) objects += v.objects.size();
  EXPECT_EQ(clean.objects_checked, objects);

  // Same size, one byte changed.
  auto blob = store->Get(t);
  ASSERT_TRUE(blob.ok());
  std::vector<uint8_t> bytes(blob->bytes().begin(), blob->bytes().end());
  bytes[2] ^= 0x01;
  ASSERT_TRUE(store->Put(t, bytes).ok());
  VerifyReport newest = Verify(*store);
  EXPECT_FALSE(newest.ok());
  EXPECT_TRUE(newest.unreachable.empty()) << "the weights are fine";
  ASSERT_EQ(newest.bad_objects.size(), 1u) << Keys(newest.bad_objects);
  EXPECT_EQ(newest.bad_objects[0].version, 3u);
  EXPECT_EQ(newest.bad_objects[0].key, t);
  EXPECT_EQ(newest.bad_objects[0].code, ErrorCode::kIntegrity);
  EXPECT_NE(newest.bad_objects[0].reason.find("side file tokenizer.json"), std::string::npos)
      << newest.bad_objects[0].reason;
  EXPECT_NE(newest.bad_objects[0].reason.find("XXH3-128"), std::string::npos) << newest.bad_objects[0].reason;
  VerifyReport all = Verify(*store, All());
  EXPECT_EQ(Keys(all.bad_objects), "[1 " + t + ": " + newest.bad_objects[0].reason + "][3 " + t + ": " +
                                       newest.bad_objects[0].reason + "]");
  EXPECT_EQ(all.verified, (std::vector<uint64_t>{1, 2, 3, 4}));
  ASSERT_TRUE(store->Put(t, blob->bytes()).ok());

  // Deleted: only a check of a version whose set holds it finds it.
  ASSERT_TRUE(store->Delete(a).ok());
  EXPECT_TRUE(Verify(*store).ok()) << "version 4's set does not hold it";
  VerifyOptions two;
  two.version = 2;
  VerifyReport r = Verify(*store, two);
  ASSERT_EQ(r.bad_objects.size(), 1u) << Keys(r.bad_objects);
  EXPECT_EQ(r.bad_objects[0].version, 1u);
  EXPECT_EQ(r.bad_objects[0].key, a);
  EXPECT_EQ(r.bad_objects[0].code, ErrorCode::kNotFound);
  EXPECT_NE(r.bad_objects[0].reason.find("side file config.json"), std::string::npos) << r.bad_objects[0].reason;
  EXPECT_EQ(Verify(*store, All()).bad_objects.size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Encodings, BucketVerifyTest, ::testing::Values(IndexEncoding::kCompact, IndexEncoding::kGapDelta),
                         [](const auto& info) { return std::string(EncodingName(info.param)); });

}  // namespace
}  // namespace deltasync
