// BufferPool: released BlobBuffer pages reused by the next buffer of about
// their size (never cleared: the old bytes are still there), the size rule,
// the cap, growth into a held mapping, and a pool that dies before its Blobs.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <memory>
#include <vector>

#include "deltasync/blob.h"

namespace deltasync {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

void Fill(uint8_t* p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 12));
}

bool Holds(const uint8_t* p, size_t n, uint8_t seed) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != static_cast<uint8_t>(seed + i * 7 + (i >> 12))) return false;
  }
  return true;
}

// A pool buffer of `bytes`, filled, released through a Blob; returns where
// its pages were.
const uint8_t* ReleaseThroughBlob(const std::shared_ptr<BufferPool>& pool, size_t bytes, uint8_t seed) {
  BlobBuffer b(pool);
  EXPECT_TRUE(b.Resize(bytes));
  Fill(b.data(), bytes, seed);
  const uint8_t* pages = b.data();
  Blob blob = Blob::FromBuffer(std::move(b));
  EXPECT_EQ(blob.data(), pages);
  EXPECT_TRUE(Holds(blob.data(), blob.size(), seed));
  return pages;  // blob released here
}

TEST(BufferPoolTest, ReleasedPagesServeTheNextBufferUncleared) {
  auto pool = std::make_shared<BufferPool>(64 * kMiB);
  const uint8_t* pages = ReleaseThroughBlob(pool, 8 * kMiB, 1);
  EXPECT_EQ(pool->held_bytes(), 8 * kMiB);
  EXPECT_EQ(pool->held_mappings(), 1u);

  BlobBuffer again(pool);
  ASSERT_TRUE(again.Resize(7 * kMiB + 5));
  EXPECT_EQ(again.data(), pages);               // the same pages
  EXPECT_TRUE(Holds(again.data(), 7 * kMiB, 1));  // not cleared: reused as they were
  EXPECT_EQ(pool->held_bytes(), 0u);
  // A buffer dropped without becoming a Blob gives its pages back too.
  again = BlobBuffer();
  EXPECT_EQ(pool->held_bytes(), 8 * kMiB);
}

TEST(BufferPoolTest, TakesOnlyAMappingOfOneToTwiceTheSize) {
  auto pool = std::make_shared<BufferPool>(256 * kMiB);
  const uint8_t* big = ReleaseThroughBlob(pool, 64 * kMiB, 2);
  {
    BlobBuffer small(pool);  // 64 MiB is more than twice 4 MiB: fresh pages
    ASSERT_TRUE(small.Resize(4 * kMiB));
    EXPECT_NE(small.data(), big);
    EXPECT_EQ(pool->held_bytes(), 64 * kMiB);
  }
  // The 4 MiB buffer's pages were given back; the smallest fitting is taken.
  EXPECT_EQ(pool->held_mappings(), 2u);
  BlobBuffer mid(pool);
  ASSERT_TRUE(mid.Resize(40 * kMiB));
  EXPECT_EQ(mid.data(), big);
  EXPECT_EQ(pool->held_bytes(), 4 * kMiB);
  // Under 2 MiB nothing is pooled.
  ReleaseThroughBlob(pool, kMiB, 3);
  EXPECT_EQ(pool->held_bytes(), 4 * kMiB);
}

TEST(BufferPoolTest, HoldsAtMostItsCapOldestDroppedFirst) {
  auto map = [](size_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    return BufferPool::Mapping{static_cast<uint8_t*>(p), bytes};
  };
  auto pool = std::make_shared<BufferPool>(16 * kMiB);
  pool->Give(map(8 * kMiB));
  const BufferPool::Mapping six = map(6 * kMiB);
  pool->Give(six);
  EXPECT_EQ(pool->held_bytes(), 14 * kMiB);
  const BufferPool::Mapping ten = map(10 * kMiB);
  pool->Give(ten);  // pushes the oldest (8 MiB) out
  EXPECT_EQ(pool->held_bytes(), 16 * kMiB);
  EXPECT_EQ(pool->held_mappings(), 2u);
  pool->Give(map(32 * kMiB));  // larger than the cap: unmapped at once
  pool->Give(map(kMiB));       // under 2 MiB: never kept
  EXPECT_EQ(pool->held_bytes(), 16 * kMiB);
  const BufferPool::Mapping fits = pool->Take(9 * kMiB);  // the smallest of 9 to 18 MiB
  EXPECT_EQ(fits.data, ten.data);
  ::munmap(fits.data, fits.bytes);
  EXPECT_EQ(pool->Take(13 * kMiB).data, nullptr);  // 6 MiB is too small
  EXPECT_EQ(pool->Take(2 * kMiB).data, nullptr);   // and more than twice 2 MiB
  const BufferPool::Mapping got = pool->Take(5 * kMiB);
  EXPECT_EQ(got.data, six.data);
  EXPECT_EQ(got.bytes, 6 * kMiB);
  EXPECT_EQ(pool->held_bytes(), 0u);
  ::munmap(got.data, got.bytes);
}

// Pages that no longer fit what is asked for are given back: after
// kMaxMisses buffers in a row found nothing fitting, all held pages go.
TEST(BufferPoolTest, GivesEverythingBackAfterMissesInARow) {
  auto pool = std::make_shared<BufferPool>(256 * kMiB);
  ReleaseThroughBlob(pool, 64 * kMiB, 12);  // an anchor-sized download
  const size_t small = 4 * kMiB;            // then delta-sized ones, kept alive
  std::vector<BlobBuffer> alive;
  for (int i = 0; i + 1 < BufferPool::kMaxMisses; ++i) {
    alive.emplace_back(pool);
    ASSERT_TRUE(alive.back().Resize(small));
    EXPECT_EQ(pool->held_bytes(), 64 * kMiB) << i;
  }
  // A hit in between starts the count again.
  const uint8_t* reused = ReleaseThroughBlob(pool, 40 * kMiB, 13);
  EXPECT_EQ(pool->held_bytes(), 64 * kMiB);
  for (int i = 0; i + 1 < BufferPool::kMaxMisses; ++i) {
    alive.emplace_back(pool);
    ASSERT_TRUE(alive.back().Resize(small));
    EXPECT_EQ(pool->held_bytes(), 64 * kMiB) << i;
  }
  alive.emplace_back(pool);
  ASSERT_TRUE(alive.back().Resize(small));  // the kMaxMisses-th miss in a row
  EXPECT_EQ(pool->held_bytes(), 0u);
  EXPECT_NE(reused, nullptr);
}

TEST(BufferPoolTest, GrowthMovesTheBytesOntoAHeldMappingAndKeepsTheDisplacedPages) {
  auto pool = std::make_shared<BufferPool>(256 * kMiB);
  const uint8_t* held = ReleaseThroughBlob(pool, 32 * kMiB, 8);
  BlobBuffer b(pool);
  ASSERT_TRUE(b.Resize(3 * kMiB));  // too small for the held 32 MiB: fresh (4 MiB)
  EXPECT_NE(b.data(), held);
  Fill(b.data(), 3 * kMiB, 9);
  ASSERT_TRUE(b.Resize(20 * kMiB));  // grows onto the held mapping
  EXPECT_EQ(b.data(), held);
  EXPECT_EQ(b.capacity(), 32 * kMiB);
  EXPECT_TRUE(Holds(b.data(), 3 * kMiB, 9));                            // the bytes moved
  // The held mapping's first 4 MiB were moved out and are held for a small buffer.
  EXPECT_EQ(pool->held_mappings(), 1u);
  EXPECT_EQ(pool->held_bytes(), 4 * kMiB);
  BlobBuffer small(pool);
  ASSERT_TRUE(small.Resize(3 * kMiB));
  EXPECT_TRUE(Holds(small.data(), 3 * kMiB, 8));  // the displaced pages, as they were
  EXPECT_EQ(pool->held_bytes(), 0u);
  // A Blob made from the grown buffer holds all 20 MiB.
  for (size_t i = 3 * kMiB; i < 20 * kMiB; ++i) b.data()[i] = 0x5A;
  Blob blob = Blob::FromBuffer(std::move(b));
  ASSERT_EQ(blob.size(), 20 * kMiB);
  EXPECT_TRUE(Holds(blob.data(), 3 * kMiB, 9));
  EXPECT_EQ(blob.data()[20 * kMiB - 1], 0x5A);
}

TEST(BufferPoolTest, BlobsOutliveTheirPool) {
  auto pool = std::make_shared<BufferPool>(64 * kMiB);
  BlobBuffer b(pool);
  ASSERT_TRUE(b.Resize(4 * kMiB));
  Fill(b.data(), 4 * kMiB, 10);
  Blob blob = Blob::FromBuffer(std::move(b));
  ReleaseThroughBlob(pool, 8 * kMiB, 11);
  EXPECT_EQ(pool->held_bytes(), 8 * kMiB);
  pool.reset();  // unmaps what it held; the live Blob keeps its pages
  EXPECT_TRUE(Holds(blob.data(), 4 * kMiB, 10));
  blob = Blob();  // unmapped, the pool being gone
  BlobBuffer orphan{std::weak_ptr<BufferPool>()};
  ASSERT_TRUE(orphan.Resize(4 * kMiB));
}

}  // namespace
}  // namespace deltasync
