// Blob::MapFile of a file cut short while mapped (a writer truncating it):
// reading the pages past the cut used to raise SIGBUS and kill the process;
// now they read as zeros and the Blob says it was cut. A SIGBUS outside every
// guarded mapping still kills the process as before.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "deltasync/blob.h"
#include "testing/temp_dir.h"

namespace deltasync {
namespace {

using testing::TempDir;

constexpr size_t kPages = 8;
constexpr size_t kPage = 4096;

std::string WriteFile(const TempDir& dir) {
  const std::string path = dir.Sub("file.bin");
  std::vector<uint8_t> bytes(kPages * kPage, 0x5A);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  return path;
}

uint64_t Sum(ByteSpan bytes) {
  // volatile: every byte is really loaded.
  const volatile uint8_t* p = bytes.data();
  uint64_t sum = 0;
  for (size_t i = 0; i < bytes.size(); ++i) sum += p[i];
  return sum;
}

TEST(MappedCut, PagesPastACutReadAsZerosAndTheBlobSaysSo) {
  TempDir dir;
  const std::string path = WriteFile(dir);
  Result<Blob> blob = Blob::MapFile(path);
  ASSERT_TRUE(blob.ok()) << blob.status().ToString();
  EXPECT_EQ(Sum(blob->bytes()), kPages * kPage * 0x5A);
  EXPECT_FALSE(blob->cut());
  ASSERT_EQ(::truncate(path.c_str(), 3 * kPage), 0);
  // Without the guard, this read dies of SIGBUS.
  EXPECT_EQ(Sum(blob->bytes()), 3 * kPage * 0x5A) << "the pages past the cut read as zeros";
  EXPECT_TRUE(blob->cut());
  // Copies share the mapping and what happened to it.
  Blob copy = *blob;
  EXPECT_TRUE(copy.cut());
  // Another mapping of the file (what is left of it) is not cut.
  Result<Blob> again = Blob::MapFile(path);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->size(), 3 * kPage);
  EXPECT_FALSE(again->cut());
  EXPECT_FALSE(Blob::FromVector({1, 2, 3}).cut());
}

// What the handler installed before ours does with a SIGBUS: none (the
// default action kills the process with the signal), or, in a sanitizer
// build, AddressSanitizer's, which reports the fault and exits with 1.
#if defined(__SANITIZE_ADDRESS__)
#define DS_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DS_TEST_ASAN 1
#endif
#endif
#ifdef DS_TEST_ASAN
const auto kPreviousHandlerKills = ::testing::ExitedWithCode(1);
constexpr const char* kPreviousHandlerSays = "AddressSanitizer: BUS";
#else
const auto kPreviousHandlerKills = ::testing::KilledBySignal(SIGBUS);
constexpr const char* kPreviousHandlerSays = "";
#endif

TEST(MappedCutDeathTest, ASigbusOutsideEveryGuardedMappingStillKills) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir dir;
  const std::string path = WriteFile(dir);
  Result<Blob> guarded = Blob::MapFile(path);  // installs the handler
  ASSERT_TRUE(guarded.ok());
  EXPECT_EXIT(
      {
        const int fd = ::open(path.c_str(), O_RDONLY);
        void* raw = ::mmap(nullptr, kPages * kPage, PROT_READ, MAP_PRIVATE, fd, 0);
        if (raw == MAP_FAILED || ::truncate(path.c_str(), kPage) != 0) std::_Exit(3);
        Sum(ByteSpan(static_cast<const uint8_t*>(raw), kPages * kPage));
        std::_Exit(0);
      },
      kPreviousHandlerKills, kPreviousHandlerSays);
}

}  // namespace
}  // namespace deltasync
