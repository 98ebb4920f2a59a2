// ReplicaOptions::keep_replaced_states: a state that an anchor of another
// layout replaced (here a recovered version that reshapes its tensor) is kept
// for TakeReplacedStates() with its buffers unmoved, so that the Python
// binding can keep views of it alive (session 49, helper H5).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "deltasync/manifest.h"
#include "deltasync/publisher.h"
#include "deltasync/replica.h"
#include "testing/bucket_util.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::OpenDirStore;
using testing::TempDir;

constexpr size_t kElements = 4096;

std::vector<uint16_t> Bits(uint16_t salt) {
  std::vector<uint16_t> v(kElements);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint16_t>(0x3f00 + (i + salt) % 97);
  return v;
}

TensorView View(const std::vector<uint16_t>& bits, std::vector<uint64_t> shape) {
  return TensorView{"w", DType::kBF16, std::move(shape),
                    ByteSpan(reinterpret_cast<const uint8_t*>(bits.data()), bits.size() * 2)};
}

class ReplacedStateTest : public ::testing::Test {
 protected:
  // Version 1 of [64, 64]; version 2 recovered (version 1's anchor deleted) as [32, 128].
  void SetUp() override {
    store_ = OpenDirStore(tmp_.Sub("bucket"));
    auto pub = Publisher::Open(store_, {});
    ASSERT_TRUE(pub.ok()) << pub.status().ToString();
    std::vector<TensorView> v1{View(v1_, {64, 64})};
    ASSERT_TRUE((*pub)->Publish(1, v1).ok());
  }

  void PublishRelayout() {
    bool removed = false;  // version 1's anchor, wherever the store keeps it
    for (const auto& e : std::filesystem::recursive_directory_iterator(tmp_.Sub("bucket"))) {
      if (e.path().filename().string().starts_with("step_000001")) removed = std::filesystem::remove(e.path());
      if (removed) break;
    }
    ASSERT_TRUE(removed);
    auto pub = Publisher::Open(store_, {});
    ASSERT_TRUE(pub.ok()) << pub.status().ToString();
    ASSERT_TRUE((*pub)->degraded());
    std::vector<TensorView> v2{View(v2_, {32, 128})};
    auto stats = (*pub)->Publish(2, v2);
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    ASSERT_TRUE(stats->recovered);
  }

  TempDir tmp_;
  std::shared_ptr<Store> store_;
  std::vector<uint16_t> v1_ = Bits(1), v2_ = Bits(2);
};

TEST_F(ReplacedStateTest, KeepsTheReplacedBuffersUnmoved) {
  ReplicaOptions options;
  options.keep_replaced_states = true;
  auto replica = Replica::Create(store_, options);
  ASSERT_TRUE(replica->Update(1).ok());
  const uint8_t* held = replica->state().tensors()[0].data.data();
  EXPECT_TRUE(replica->TakeReplacedStates().empty());  // the first load replaced nothing
  PublishRelayout();
  auto stats = replica->Update();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(replica->version(), 2u);
  EXPECT_EQ(replica->state().tensors()[0].shape, (std::vector<uint64_t>{32, 128}));
  std::vector<WeightState> replaced = replica->TakeReplacedStates();
  ASSERT_EQ(replaced.size(), 1u);
  ASSERT_EQ(replaced[0].tensors().size(), 1u);
  EXPECT_EQ(replaced[0].tensors()[0].data.data(), held);
  EXPECT_EQ(std::memcmp(held, v1_.data(), v1_.size() * 2), 0);
  EXPECT_TRUE(replica->TakeReplacedStates().empty());
}

TEST_F(ReplacedStateTest, NothingIsKeptByDefault) {
  auto replica = Replica::Create(store_, {});
  ASSERT_TRUE(replica->Update(1).ok());
  PublishRelayout();
  ASSERT_TRUE(replica->Update().ok());
  EXPECT_TRUE(replica->TakeReplacedStates().empty());
}

}  // namespace
}  // namespace deltasync
