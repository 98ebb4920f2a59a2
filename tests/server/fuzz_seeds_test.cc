// Seed corpora of the shm and part_receipt fuzz targets, written by the real
// writers (ShmExport, PartReceipt::Serialize). To regenerate, run
//   server_tests --gtest_also_run_disabled_tests --gtest_filter='FuzzSeeds.DISABLED_*'
// and check the files in. The enabled tests check that the checked-in seeds
// still open (a region) and parse (a receipt).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "deltasync/part_publisher.h"
#include "deltasync/shm.h"
#include "server/server_test_util.h"
#include "server/shm_export.h"
#include "testing/parts_util.h"

namespace deltasync::testing {
namespace {

const std::filesystem::path kCorpus = std::filesystem::path(DS_SOURCE_DIR) / "tests/fuzz/corpus";

std::vector<uint8_t> ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteAll(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// The bytes of a region ShmExport wrote: version 1, then 2, which changes a
// few elements so that the change lists are not empty. (40 KiB, most of it
// the change lists' zeroed capacity; git stores it in a few hundred bytes.)
std::vector<uint8_t> ShmRegion() {
  const std::string name = UniqueShmName("seed");
  std::vector<uint8_t> a(16), b(8);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 7);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i + 1);
  auto state_of = [&] {
    std::vector<TensorView> views{{"layer.0.weight", DType::kBF16, {2, 4}, a}, {"norm", DType::kF32, {2}, b}};
    return std::move(WeightState::FromViews(views)).value();
  };
  auto writer = server::ShmExport::Create(name);
  EXPECT_TRUE(writer.ok()) << writer.status().ToString();
  if (!writer.ok()) return {};
  WeightState s1 = state_of();
  EXPECT_TRUE((*writer)->Export(1, HashState(s1, 1), s1, {}).ok());
  a[2] ^= 1;
  a[9] ^= 0x40;
  WeightState s2 = state_of();
  EXPECT_TRUE((*writer)->Export(2, HashState(s2, 1), s2, {}).ok());
  std::vector<uint8_t> bytes = ReadAll("/dev/shm" + name);
  EXPECT_FALSE(bytes.empty());
  return bytes;
}

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

TEST(FuzzSeeds, DISABLED_Write) {
  WriteAll(kCorpus / "shm/two_versions.region", ShmRegion());
  WriteAll(kCorpus / "part_receipt/receipt.json", Bytes(SampleReceipt(false).Serialize()));
  WriteAll(kCorpus / "part_receipt/failed.json", Bytes(SampleReceipt(true).Serialize()));
}

TEST(FuzzSeeds, CheckedInShmRegionOpens) {
  const std::vector<uint8_t> bytes = ReadAll(kCorpus / "shm/two_versions.region");
  ASSERT_FALSE(bytes.empty()) << "missing; regenerate the corpus (see above)";
  const std::string name = UniqueShmName("seedcheck");
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  ::close(fd);
  Result<std::unique_ptr<ShmReader>> reader = ShmReader::Open(name);
  ::shm_unlink(name.c_str());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  Result<ShmSnapshot> snap = (*reader)->Read(0);
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  EXPECT_EQ(snap->version, 2u);
  ASSERT_EQ(snap->tensors.size(), 2u);
  EXPECT_EQ(snap->tensors[0].changed, (std::vector<uint64_t>{1, 4}));
}

TEST(FuzzSeeds, CheckedInReceiptsParse) {
  for (bool with_error : {false, true}) {
    const std::vector<uint8_t> bytes = ReadAll(kCorpus / "part_receipt" / (with_error ? "failed.json" : "receipt.json"));
    Result<PartReceipt> r = PartReceipt::Parse(std::string(bytes.begin(), bytes.end()));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, SampleReceipt(with_error));
  }
}

}  // namespace
}  // namespace deltasync::testing
