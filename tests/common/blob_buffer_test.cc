// BlobBuffer (anonymous pages that become a Blob without a copy) and
// PrepareFreshPages (faulting fresh memory in ahead of a copy), ResizeFresh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/pages.h"
#include "deltasync/blob.h"
#include "deltasync/weight_state.h"

namespace deltasync {
namespace {

uint8_t Pattern(size_t i) { return static_cast<uint8_t>((i * 131) ^ (i >> 11)); }

std::vector<uint8_t> Patterned(size_t n, size_t from = 0) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = Pattern(from + i);
  return v;
}

bool HoldsPattern(const uint8_t* p, size_t n, size_t from = 0) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != Pattern(from + i)) return false;
  }
  return true;
}

TEST(BlobBufferTest, AppendKeepsEveryByteAcrossGrowth) {
  // Pieces of odd sizes from empty to 5 MiB: small growth by mremap, then
  // moves onto fresh 2 MiB-aligned mappings.
  BlobBuffer buffer;
  EXPECT_EQ(buffer.size(), 0u);
  const size_t piece = 100'003, total = 5u << 20;
  for (size_t done = 0; done < total; done += piece) {
    const size_t n = std::min(piece, total - done);
    ASSERT_TRUE(buffer.Append(Patterned(n, done)));
    ASSERT_EQ(buffer.size(), done + n);
    ASSERT_GE(buffer.capacity(), buffer.size());
  }
  EXPECT_TRUE(HoldsPattern(buffer.data(), total));
  EXPECT_TRUE(buffer.Append({}));
  EXPECT_EQ(buffer.size(), total);
}

TEST(BlobBufferTest, ResizeKeepsThePrefix) {
  BlobBuffer buffer;
  const size_t first = (1u << 20) + 17, total = (40u << 20) + 5;
  ASSERT_TRUE(buffer.Resize(first));
  std::vector<uint8_t> head = Patterned(first);
  std::memcpy(buffer.data(), head.data(), first);
  ASSERT_TRUE(buffer.Resize(total));  // onto a fresh mapping, pages moved
  EXPECT_EQ(buffer.size(), total);
  EXPECT_TRUE(HoldsPattern(buffer.data(), first));
  for (size_t i = first; i < total; ++i) buffer.data()[i] = Pattern(i);
  EXPECT_TRUE(HoldsPattern(buffer.data(), total));
  ASSERT_TRUE(buffer.Resize(first));  // a shrink keeps the prefix too
  EXPECT_TRUE(HoldsPattern(buffer.data(), first));
  buffer.Clear();
  EXPECT_EQ(buffer.size(), 0u);
  EXPECT_GE(buffer.capacity(), total);
}

TEST(BlobBufferTest, BecomesABlobWithoutACopy) {
  BlobBuffer buffer;
  ASSERT_TRUE(buffer.Reserve(8u << 20));
  ASSERT_TRUE(buffer.Append(Patterned(3u << 20)));
  const uint8_t* pages = buffer.data();
  Blob blob = Blob::FromBuffer(std::move(buffer));
  EXPECT_EQ(blob.data(), pages);  // the same pages, not a copy
  EXPECT_EQ(blob.size(), 3u << 20);
  EXPECT_TRUE(HoldsPattern(blob.data(), blob.size()));
  EXPECT_EQ(buffer.size(), 0u);  // NOLINT(bugprone-use-after-move): left empty
  EXPECT_EQ(buffer.data(), nullptr);
  Blob copy = blob;  // shared: the pages live while any copy does
  blob = Blob();
  EXPECT_TRUE(HoldsPattern(copy.data(), copy.size()));

  EXPECT_EQ(Blob::FromBuffer(BlobBuffer()).size(), 0u);
}

TEST(BlobBufferTest, MovesHandOverThePages) {
  BlobBuffer a;
  ASSERT_TRUE(a.Append(Patterned(1000)));
  BlobBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move)
  BlobBuffer c;
  ASSERT_TRUE(c.Append(Patterned(10)));
  c = std::move(b);
  ASSERT_EQ(c.size(), 1000u);
  EXPECT_TRUE(HoldsPattern(c.data(), 1000));
}

TEST(PrepareFreshPagesTest, KeepsContentsAndFromViewsCopiesExactly) {
  // Over 16 MiB in all, so pages are faulted in ahead (in pieces, on two
  // threads): bytes already there must survive it.
  std::vector<uint8_t> written = Patterned(20u << 20);
  std::vector<uint8_t> fresh;
  fresh.reserve(24u << 20);
  std::vector<MutableByteSpan> ranges = {MutableByteSpan(written), MutableByteSpan(fresh.data(), 24u << 20)};
  for (bool huge : {true, false}) {
    PrepareFreshPages(ranges, 2, huge);
    EXPECT_TRUE(HoldsPattern(written.data(), written.size()));
  }

  // FromViews copies tensors through it: odd sizes, one under a page.
  std::vector<uint8_t> big = Patterned(18u << 20), odd = Patterned(3 * 4099 * 2, 7), tiny = Patterned(6, 3);
  std::vector<TensorView> views = {
      {"b.big", DType::kU8, {big.size()}, big},
      {"a.odd", DType::kBF16, {3, 4099}, odd},
      {"c.tiny", DType::kF16, {3}, tiny},
  };
  Result<WeightState> state = WeightState::FromViews(views);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  ASSERT_EQ(state->tensors().size(), 3u);
  EXPECT_EQ(state->Find("b.big")->data, big);
  EXPECT_EQ(state->Find("a.odd")->data, odd);
  EXPECT_EQ(state->Find("c.tiny")->data, tiny);
}

TEST(ResizeFreshTest, SizesEveryVectorZeroFilled) {
  // Over 16 MiB in all (faulted in ahead on two threads), with empty, tiny
  // and odd sizes beside it; then under 16 MiB (no fault-in ahead).
  for (size_t big : {size_t{20} << 20, size_t{3} << 20}) {
    const std::vector<size_t> sizes = {0, 1, 4095, big, 3 * 4099 * 2, 0, 17};
    std::vector<std::vector<uint8_t>> vectors(sizes.size());
    std::vector<std::vector<uint8_t>*> ptrs;
    for (auto& v : vectors) ptrs.push_back(&v);
    ResizeFresh(ptrs, sizes, 2);
    for (size_t i = 0; i < sizes.size(); ++i) {
      ASSERT_EQ(vectors[i].size(), sizes[i]) << i;
      EXPECT_TRUE(std::all_of(vectors[i].begin(), vectors[i].end(), [](uint8_t b) { return b == 0; })) << i;
    }
  }
}

}  // namespace
}  // namespace deltasync
