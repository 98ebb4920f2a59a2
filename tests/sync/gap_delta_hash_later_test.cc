// The gap_delta publish's deferred state hash (sync/deferred_state_hash.h):
// with more than one thread the scan leaves the hash terms of its 2-byte
// changes out and Commit sums them from the delta's streams beside the
// delta's write. The contract checked here: the manifest's state hash is the
// hash of the state published (the trainer's weights, which a replica
// following the bucket reaches and verifies), over deferred versions, anchors
// between them (their check takes the sum at once), a version without
// changes and one that changes every element of a tensor; a failed write, or
// a sum that fails, commits nothing and leaves the publisher as it was, and
// the retry publishes.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bf16/chunks.h"
#include "codec/patch_test_util.h"
#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "deltasync/state_hash.h"
#include "deltasync/weight_state.h"
#include "sync/deferred_state_hash.h"
#include "sync/gap_delta_publish.h"
#include "testing/bucket_util.h"
#include "testing/fault_store.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::FaultStore;
using testing::Flatten;
using testing::OpenDirStore;
using testing::ReadManifest;
using testing::TempDir;

constexpr uint64_t kChunk = bf16::kDefaultChunkElements;

// A trainer's weights: a bf16 tensor spanning three of the scan's chunks
// (its later chunks' gap streams start mid-tensor; sparse changes leave gaps
// wider than 16 bits), two small bf16 tensors and an F32 one (whose hash
// terms the scan keeps). Views() gives them as bf16, Masters() as fp32
// masters that round to the same bf16 (the scan's other compare kernel).
class Trainer {
 public:
  static constexpr size_t kBig = 0, kSmall = 1, kNorm = 2, kBias = 3;

  explicit Trainer(uint64_t seed) : rng_(seed) {
    AddBf16("model.layers.0.mlp.up_proj.weight", {2 * kChunk + 700'001});
    AddBf16("model.layers.0.self_attn.q_proj.weight", {64, 64});
    AddBf16("model.norm.weight", {64});
    Tensor bias{"model.layers.0.mlp.gate.e_score_correction_bias", DType::kF32, {8}, std::vector<uint8_t>(32)};
    for (int i = 0; i < 8; ++i) SetF32(bias, i, 0.01f * static_cast<float>(i));
    tensors_.push_back(std::move(bias));
  }

  uint64_t size(size_t t) const { return tensors_[t].data.size() / DTypeSize(tensors_[t].dtype); }
  // Element i of bf16 tensor t one or three ULPs up or down (kept finite).
  void Bump(size_t t, uint64_t i) {
    uint16_t b;
    std::memcpy(&b, &tensors_[t].data[2 * i], 2);
    const int step = rng_() % 10 == 0 ? 3 : 1;
    b = static_cast<uint16_t>(rng_() % 2 ? b + step : b - step);
    if ((b & 0x7F80) == 0x7F80) b ^= 0x0100;
    std::memcpy(&tensors_[t].data[2 * i], &b, 2);
  }
  void BumpEvery(size_t t, uint64_t begin, uint64_t end, uint64_t step) {
    for (uint64_t i = begin; i < end && i < size(t); i += step) Bump(t, i);
  }
  void BumpFraction(size_t t, double fraction) {
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (uint64_t i = 0; i < size(t); ++i) {
      if (u(rng_) < fraction) Bump(t, i);
    }
  }
  void BumpBias(int i) {
    float v;
    std::memcpy(&v, &tensors_[kBias].data[4 * i], 4);
    SetF32(tensors_[kBias], i, v + 1e-3f);
  }

  std::vector<TensorView> Views() const {
    std::vector<TensorView> out;
    for (const Tensor& t : tensors_) out.push_back({t.name, t.dtype, t.shape, t.data});
    return out;
  }
  // fp32 masters of the bf16 tensors (low halves below 0x8000: they round
  // down to the bf16 value), the F32 one as it is; valid until the next call.
  std::vector<TensorView> Masters() {
    masters_.clear();
    masters_.reserve(tensors_.size());
    std::vector<TensorView> out;
    for (const Tensor& t : tensors_) {
      if (t.dtype != DType::kBF16) {
        out.push_back({t.name, t.dtype, t.shape, t.data});
        continue;
      }
      std::vector<uint8_t>& m = masters_.emplace_back(t.data.size() * 2);
      for (size_t i = 0; i < t.data.size() / 2; ++i) {
        uint16_t b;
        std::memcpy(&b, &t.data[2 * i], 2);
        const uint32_t bits = (uint32_t{b} << 16) | static_cast<uint32_t>(rng_() & 0x7FFF);
        std::memcpy(&m[4 * i], &bits, 4);
      }
      out.push_back({t.name, DType::kF32, t.shape, m});
    }
    return out;
  }
  StateHash Hash() const {
    Result<WeightState> state = WeightState::FromViews(Views());
    EXPECT_TRUE(state.ok()) << state.status().ToString();
    return state.ok() ? HashState(*state) : StateHash{};
  }

 private:
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<uint64_t> shape;
    std::vector<uint8_t> data;
  };
  void AddBf16(std::string name, std::vector<uint64_t> shape) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    Tensor t{std::move(name), DType::kBF16, std::move(shape), std::vector<uint8_t>(2 * n)};
    for (uint64_t i = 0; i < n; ++i) {
      // Small normal-ish weights: exponents 0x78..0x7B, either sign.
      const uint16_t b = static_cast<uint16_t>(((rng_() & 1) << 15) | ((0x78 + rng_() % 4) << 7) | (rng_() & 0x7F));
      std::memcpy(&t.data[2 * i], &b, 2);
    }
    tensors_.push_back(std::move(t));
  }
  static void SetF32(Tensor& t, int i, float v) { std::memcpy(&t.data[4 * i], &v, 4); }

  std::mt19937_64 rng_;
  std::vector<Tensor> tensors_;
  std::vector<std::vector<uint8_t>> masters_;
};

using Contents = std::map<std::string, std::vector<uint8_t>>;
Contents ContentsOf(std::span<const TensorView> views) {
  Contents out;
  for (const TensorView& v : views) out[v.name].assign(v.data.begin(), v.data.end());
  return out;
}

// A gap_delta publisher on `threads` threads over a FaultStore on a local
// bucket, anchors every 3rd version.
struct Bucket {
  explicit Bucket(int threads) {
    store = std::make_shared<FaultStore>(OpenDirStore(dir.path()));
    PublisherOptions options;
    options.encoding = IndexEncoding::kGapDelta;
    options.anchor_interval = 3;
    options.threads = threads;
    Result<std::unique_ptr<Publisher>> opened = Publisher::Open(store, options);
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    if (opened.ok()) pub = std::move(*opened);
  }
  std::string ManifestBytes() const {
    Result<Blob> blob = store->Get(kManifestKey);
    EXPECT_TRUE(blob.ok()) << blob.status().ToString();
    return blob.ok() ? std::string(blob->bytes().begin(), blob->bytes().end()) : std::string();
  }

  TempDir dir;
  std::shared_ptr<FaultStore> store;
  std::unique_ptr<Publisher> pub;
};

// Publishes the trainer's weights as `version` (fp32 masters on even
// versions) and checks the manifest's hash against the trainer's state and a
// replica's bit-exact, verified update to it.
void PublishAndFollow(Bucket& bucket, Trainer& trainer, uint64_t version, Replica& replica) {
  SCOPED_TRACE("version " + std::to_string(version));
  const std::vector<TensorView> views = version % 2 == 0 ? trainer.Masters() : trainer.Views();
  Result<PublishStats> stats = bucket.pub->Publish(version, views);
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  const StateHash want = trainer.Hash();
  EXPECT_EQ(stats->state_hash, want);
  const Manifest manifest = ReadManifest(*bucket.store);
  const VersionEntry* entry = manifest.Find(version);
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(entry->state_hash, want) << "the manifest's hash is not the published state's";
  EXPECT_EQ(HashState(bucket.pub->state()), want);
  Result<UpdateStats> updated = replica.Update(version);
  ASSERT_TRUE(updated.ok()) << updated.status().ToString();
  EXPECT_EQ(replica.version(), version);
  EXPECT_EQ(replica.state_hash(), want);
  EXPECT_EQ(ContentsOf(replica.state().views()), ContentsOf(trainer.Views())) << "the replica is not bit-exact";
}

TEST(GapDeltaHashLaterTest, TheManifestsHashIsThePublishedStatesOverDeferredVersionsAndAnchors) {
  for (int threads : {2, 1}) {  // 2: the deferred sum; 1: the scan's own
    SCOPED_TRACE(std::to_string(threads) + " threads");
    Bucket bucket(threads);
    ASSERT_NE(bucket.pub, nullptr);
    Trainer trainer(71);
    std::unique_ptr<Replica> replica = Replica::Create(bucket.store);
    PublishAndFollow(bucket, trainer, 1, *replica);
    // 2: sparse, gaps above 16 bits in every chunk of the big tensor.
    trainer.BumpEvery(Trainer::kBig, 5, trainer.size(Trainer::kBig), 70'001);
    trainer.BumpEvery(Trainer::kSmall, 0, 4096, 97);
    trainer.BumpBias(3);
    PublishAndFollow(bucket, trainer, 2, *replica);
    // 3, an anchor: dense runs across the big tensor's chunk boundaries.
    trainer.BumpEvery(Trainer::kBig, kChunk - 3000, kChunk + 3000, 2);
    trainer.BumpEvery(Trainer::kBig, 2 * kChunk - 5, 2 * kChunk + 5, 1);
    trainer.BumpFraction(Trainer::kNorm, 0.1);
    PublishAndFollow(bucket, trainer, 3, *replica);
    // 4: no change at all.
    PublishAndFollow(bucket, trainer, 4, *replica);
    // 5: every element of the big and the small tensor.
    trainer.BumpEvery(Trainer::kBig, 0, trainer.size(Trainer::kBig), 1);
    trainer.BumpEvery(Trainer::kSmall, 0, trainer.size(Trainer::kSmall), 1);
    PublishAndFollow(bucket, trainer, 5, *replica);
    // 6, an anchor: 3% everywhere, the bias too.
    for (size_t t : {Trainer::kBig, Trainer::kSmall, Trainer::kNorm}) trainer.BumpFraction(t, 0.03);
    trainer.BumpBias(0);
    PublishAndFollow(bucket, trainer, 6, *replica);
    // 7: the big tensor's first and last elements, a wide gap between.
    trainer.Bump(Trainer::kBig, 0);
    trainer.Bump(Trainer::kBig, trainer.size(Trainer::kBig) - 1);
    PublishAndFollow(bucket, trainer, 7, *replica);
    // A replica from scratch: the anchor at 6, then 7.
    std::unique_ptr<Replica> fresh = Replica::Create(bucket.store);
    ASSERT_TRUE(fresh->Update().ok());
    EXPECT_EQ(fresh->state_hash(), trainer.Hash());
  }
}

// What a failed publish must leave: the version uncommitted, the manifest's
// bytes and the publisher's state (hence its hash) as before.
struct Before {
  explicit Before(const Bucket& bucket)
      : latest(bucket.pub->latest_version()),
        manifest(bucket.ManifestBytes()),
        state(HashState(bucket.pub->state())) {}
  void Check(const Bucket& bucket) const {
    EXPECT_EQ(bucket.pub->latest_version(), latest);
    EXPECT_EQ(bucket.ManifestBytes(), manifest) << "a failed version changed the manifest";
    EXPECT_EQ(HashState(bucket.pub->state()), state) << "a failed version left the publisher's state changed";
  }
  uint64_t latest;
  std::string manifest;
  StateHash state;
};

// A write that fails while the deferred sum runs (the delta's Put, the
// manifest's, an anchor's Put, whose version summed it at once): nothing
// committed, the publisher as before; the retry publishes, and the versions
// after it carry the right hash (the publisher's held hash was kept).
TEST(GapDeltaHashLaterTest, AFailedWriteBesideTheSumCommitsNothingAndTheRetryPublishes) {
  Bucket bucket(2);
  ASSERT_NE(bucket.pub, nullptr);
  Trainer trainer(72);
  std::unique_ptr<Replica> replica = Replica::Create(bucket.store);
  PublishAndFollow(bucket, trainer, 1, *replica);
  struct Case {
    uint64_t version;
    std::string key;  // the write that fails
  };
  for (const Case& c : {Case{2, DeltaKey(2)}, Case{3, AnchorKey(3)}, Case{4, std::string(kManifestKey)}}) {
    SCOPED_TRACE("version " + std::to_string(c.version) + ", " + c.key + " fails");
    trainer.BumpFraction(Trainer::kBig, 0.02);
    trainer.BumpEvery(Trainer::kSmall, c.version, 4096, 31);
    const Before before(bucket);
    int failed = 0;
    bucket.store->fail_write = [&](std::string_view key) {
      if (key != c.key) return Status::OK();
      ++failed;
      return Status::IOError("injected write failure");
    };
    const std::vector<TensorView> views = trainer.Views();
    Result<PublishStats> refused = bucket.pub->Publish(c.version, views);
    bucket.store->fail_write = nullptr;
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(failed, 1);
    EXPECT_NE(refused.status().message().find("injected write failure"), std::string::npos)
        << refused.status().ToString();
    before.Check(bucket);
    PublishAndFollow(bucket, trainer, c.version, *replica);
  }
  trainer.BumpFraction(Trainer::kBig, 0.01);
  PublishAndFollow(bucket, trainer, 5, *replica);
}

int hook_calls = 0;  // DeferredStateHash's test hook's, on the sum's thread

// The sum itself failing (it threw: out of memory), on its thread beside the
// delta's write and at an anchor that sums it at once: the version fails
// loudly, nothing committed, the publisher as before; the retry publishes.
TEST(GapDeltaHashLaterTest, ASumThatThrowsCommitsNothingAndTheRetryPublishes) {
  Bucket bucket(2);
  ASSERT_NE(bucket.pub, nullptr);
  Trainer trainer(73);
  std::unique_ptr<Replica> replica = Replica::Create(bucket.store);
  PublishAndFollow(bucket, trainer, 1, *replica);
  for (uint64_t version : {2, 3, 4}) {  // 3: an anchor
    SCOPED_TRACE("version " + std::to_string(version));
    trainer.BumpFraction(Trainer::kBig, 0.02);
    trainer.BumpBias(static_cast<int>(version));
    const Before before(bucket);
    hook_calls = 0;
    DeferredStateHash::SetHookForTesting([] {
      ++hook_calls;
      throw std::bad_alloc();
    });
    const std::vector<TensorView> views = trainer.Views();
    Result<PublishStats> refused = bucket.pub->Publish(version, views);
    DeferredStateHash::SetHookForTesting(nullptr);
    ASSERT_FALSE(refused.ok()) << "a version whose hash could not be summed was published";
    EXPECT_EQ(hook_calls, 1);
    EXPECT_EQ(refused.status().code(), ErrorCode::kInternal) << refused.status().ToString();
    EXPECT_NE(refused.status().message().find("out of memory"), std::string::npos) << refused.status().ToString();
    EXPECT_NE(refused.status().message().find("version " + std::to_string(version)), std::string::npos)
        << refused.status().ToString();
    before.Check(bucket);
    if (version != 3) {
      // The delta was written beside the sum, and is written again.
      EXPECT_TRUE(bucket.store->Size(DeltaKey(version)).ok());
    }
    PublishAndFollow(bucket, trainer, version, *replica);
  }
}

// DeferredStateHash on its own: the sum on its thread or here, once; what it
// throws becomes an error; a started sum never read is joined.
TEST(DeferredStateHashTest, TheSumOnceOrItsErrorNeverAnException) {
  {
    DeferredStateHash none(nullptr);
    EXPECT_FALSE(none.pending());
    none.Start();
    Result<StateHash> zero = none.Join();
    ASSERT_TRUE(zero.ok());
    EXPECT_EQ(*zero, StateHash{});
  }
  for (bool start : {true, false}) {
    int runs = 0;
    DeferredStateHash later([&] {
      ++runs;
      return StateHash{3, 4};
    });
    EXPECT_TRUE(later.pending());
    if (start) later.Start();
    Result<StateHash> sum = later.Join();
    ASSERT_TRUE(sum.ok()) << sum.status().ToString();
    EXPECT_EQ(*sum, (StateHash{3, 4}));
    EXPECT_FALSE(later.pending());
    Result<StateHash> again = later.Join();  // taken: nothing more
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, StateHash{});
    EXPECT_EQ(runs, 1);
  }
  for (bool start : {true, false}) {
    DeferredStateHash later([]() -> StateHash { throw std::runtime_error("no room for the terms"); });
    if (start) later.Start();
    Result<StateHash> sum = later.Join();
    ASSERT_FALSE(sum.ok());
    EXPECT_EQ(sum.status().code(), ErrorCode::kInternal);
    EXPECT_NE(sum.status().message().find("no room for the terms"), std::string::npos) << sum.status().ToString();
  }
  {
    DeferredStateHash unread([] { return StateHash{1, 1}; });
    unread.Start();  // destroyed unjoined: its destructor joins
  }
}

// The route below the Publisher: RunHashLater's result plus HashLater is
// Run's result, the state's hash change (the F32 tensor's terms in the
// former, the bf16 ones in the latter), and the patch is the same bytes.
TEST(GapDeltaHashLaterTest, RunHashLaterPlusHashLaterIsRun) {
  Trainer trainer(74);
  Result<WeightState> a = WeightState::FromViews(trainer.Views());
  Result<WeightState> b = WeightState::FromViews(trainer.Views());
  ASSERT_TRUE(a.ok() && b.ok());
  GapDeltaPublish whole, later;
  for (uint64_t version = 2; version <= 4; ++version) {
    SCOPED_TRACE("version " + std::to_string(version));
    const StateHash before = HashState(*a);
    trainer.BumpFraction(Trainer::kBig, version == 3 ? 0.0 : 0.01);
    trainer.BumpEvery(Trainer::kBig, 7, trainer.size(Trainer::kBig), 100'003);
    trainer.BumpBias(1);
    const std::vector<TensorView> masters = trainer.Masters();
    PatchInfo info{PatchKind::kDelta, version, IndexEncoding::kGapDelta, version - 1, a->total_elements()};
    Result<StateHash> run = whole.Run(*a, masters, {.threads = 2}, info);
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    Result<StateHash> scanned = later.RunHashLater(*b, masters, {.threads = 2}, info);
    ASSERT_TRUE(scanned.ok()) << scanned.status().ToString();
    EXPECT_NE(*scanned, StateHash{}) << "the F32 tensor's terms were not summed in the scan";
    const StateHash deferred = later.HashLater(2);
    EXPECT_EQ(*scanned + deferred, *run);
    EXPECT_EQ(before + *run, trainer.Hash());
    EXPECT_EQ(HashState(*b), trainer.Hash());
    EXPECT_EQ(Flatten(whole.TakePatch()), Flatten(later.TakePatch()));
    EXPECT_EQ(ContentsOf(a->views()), ContentsOf(b->views()));
  }
}

}  // namespace
}  // namespace deltasync
