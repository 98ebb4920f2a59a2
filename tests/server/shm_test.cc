// --shm: readers never keep a torn state, the byte layout is the one
// docs/shm.md documents, change lists name exactly what changed, and the
// region's lifetime (closed flag, unlink, stale objects, live owners).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <atomic>

#include "deltasync/shm.h"
#include "server/server_test_util.h"

namespace deltasync::testing {
namespace {

using nlohmann::json;

std::unique_ptr<ShmReader> OpenWhenReady(const std::string& name) {
  std::unique_ptr<ShmReader> reader;
  WaitUntil([&] {
    auto r = ShmReader::Open(name);
    if (r.ok()) reader = std::move(*r);
    return r.ok();
  });
  return reader;
}

StateHash HashOf(const ShmSnapshot& s) {
  std::vector<TensorView> views;
  for (const ShmTensor& t : s.tensors) views.push_back(t.view());
  return HashTensors(views, 1);
}

struct ShmDaemon {
  TestBucket bucket{11};
  std::string name = UniqueShmName("t");
  std::unique_ptr<Server> daemon;
  std::string addr;

  // A daemon holding version 1 and paused: the test moves it.
  explicit ShmDaemon(bool pause = true) {
    bucket.Publish(1);
    ServerOptions options = DaemonOptions(bucket.store());
    options.shm_name = name;
    daemon = StartDaemon(options);
    if (!daemon) return;
    addr = daemon->address();
    EXPECT_TRUE(WaitForVersion(addr, 1));
    if (pause) EXPECT_EQ(HttpPost(addr, "/pause", "").status, 200);
  }
  void MoveTo(uint64_t v) {
    HttpReply r = HttpPost(addr, "/update_weights", UpdateWeightsBody(DeltaKey(v)));
    ASSERT_EQ(r.status, 200) << r.body;
  }
};

// Readers copy the whole state in a tight loop while the daemon applies many
// versions; every copy they keep must hash to the state hash stored with it
// (a torn copy would mix two versions and fail), and versions never go back.
TEST(ShmTest, AReaderNeverSeesATornState) {
  ShmDaemon t;
  ASSERT_TRUE(t.daemon);
  constexpr uint64_t kVersions = 60;
  for (uint64_t v = 2; v <= kVersions; ++v) t.bucket.Publish(v, 0.3);

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> seen{0};
  std::atomic<uint64_t> reads{0};
  std::mutex mu;
  std::vector<std::string> failures;
  auto fail = [&](const std::string& what) {
    std::lock_guard lock(mu);
    if (failures.size() < 10) failures.push_back(what);
  };
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      std::unique_ptr<ShmReader> reader = OpenWhenReady(t.name);
      if (!reader) return fail("cannot open the region");
      uint64_t last = 0;
      while (!stop.load()) {
        Result<ShmSnapshot> s = reader->Read(60);
        if (!s.ok()) return fail(s.status().ToString());
        if (s->sequence & 1) fail("kept a copy taken at an odd sequence");
        if (HashOf(*s) != s->state_hash) {
          fail("torn: version " + std::to_string(s->version) + " does not hash to its state hash");
        }
        if (s->version < last) fail("went back from " + std::to_string(last) + " to " + std::to_string(s->version));
        last = s->version;
        if (r == 0) seen.store(s->version);
        reads++;
      }
    });
  }
  for (uint64_t v = 2; v <= kVersions; ++v) {
    t.MoveTo(v);
    // Every version is observed before the next write starts overlapping.
    ASSERT_TRUE(WaitUntil([&] { return seen.load() >= v; })) << v;
  }
  stop = true;
  for (auto& r : readers) r.join();
  std::lock_guard lock(mu);
  EXPECT_TRUE(failures.empty()) << failures.front();
  EXPECT_GE(reads.load(), kVersions);
}

// Reads the region with nothing but shm_open, mmap and the offsets written
// in docs/shm.md (literal numbers, on purpose), and compares with ShmReader.
TEST(ShmTest, TheByteLayoutIsTheDocumentedOne) {
  ShmDaemon t;
  ASSERT_TRUE(t.daemon);
  t.bucket.Publish(2);
  t.MoveTo(2);
  auto reader = OpenWhenReady(t.name);
  ASSERT_TRUE(reader);
  auto snap = reader->Read();
  ASSERT_TRUE(snap.ok());

  int fd = ::shm_open(t.name.c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  auto* p = static_cast<const uint8_t*>(::mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, fd, 0));
  ::close(fd);
  ASSERT_NE(p, MAP_FAILED);
  auto u64 = [&](size_t off) {
    uint64_t v;
    std::memcpy(&v, p + off, 8);
    return v;
  };
  auto u32 = [&](size_t off) {
    uint32_t v;
    std::memcpy(&v, p + off, 4);
    return v;
  };
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(p), 8), "DSYNCSHM");
  EXPECT_EQ(u32(8), 1u);    // layout version
  EXPECT_EQ(u32(12), 256u); // header bytes
  EXPECT_EQ(u64(16) % 2, 0u);
  EXPECT_EQ(u64(16), snap->sequence);
  EXPECT_EQ(u64(24), 2u);
  EXPECT_EQ(u64(32), t.bucket.hash(2).hi);
  EXPECT_EQ(u64(40), t.bucket.hash(2).lo);
  EXPECT_EQ(u64(48), 1u);   // base version
  EXPECT_EQ(u32(56), 1u);   // changes complete
  EXPECT_EQ(u32(60), 0u);   // flags: open
  EXPECT_EQ(u64(72), static_cast<uint64_t>(st.st_size));
  const uint64_t count = u64(80);
  ASSERT_EQ(count, snap->tensors.size());
  const uint64_t table = u64(88);
  EXPECT_EQ(table, 256u);
  EXPECT_EQ(u64(96), 128u);
  EXPECT_EQ(u64(112) % 4096, 0u);  // data offset, page-aligned
  EXPECT_EQ(u64(152), static_cast<uint64_t>(::getpid()));
  uint64_t listed = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const size_t e = table + i * 128;
    const ShmTensor& want = snap->tensors[i];
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(p + u64(e)), u32(e + 8)), want.name);
    EXPECT_EQ(p[u64(e) + u32(e + 8)], 0) << "names are NUL-terminated";
    ASSERT_EQ(u32(e + 12), want.shape.size());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(p + e + 16)), std::string(DTypeName(want.dtype)));
    EXPECT_EQ(u64(e + 24) % 64, 0u);
    ASSERT_EQ(u64(e + 32), want.data.size());
    EXPECT_EQ(std::memcmp(p + u64(e + 24), want.data.data(), want.data.size()), 0) << want.name;
    ASSERT_EQ(u64(e + 48), want.changed.size());
    if (!want.changed.empty()) EXPECT_EQ(std::memcmp(p + u64(e + 40), want.changed.data(), want.changed.size() * 8), 0);
    for (uint32_t d = 0; d < u32(e + 12); ++d) EXPECT_EQ(u64(e + 56 + 8 * d), want.shape[d]);
    listed += u64(e + 48);
  }
  EXPECT_EQ(u64(144), listed);  // changed elements
  ::munmap(const_cast<uint8_t*>(p), st.st_size);
}

// The change lists hold exactly the elements that differ from base_version.
TEST(ShmTest, ChangeListsNameExactlyWhatChanged) {
  ShmDaemon t;
  ASSERT_TRUE(t.daemon);
  auto reader = OpenWhenReady(t.name);
  ASSERT_TRUE(reader);
  auto first = reader->Read();
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->version, 1u);
  EXPECT_EQ(first->base_version, 0u);
  EXPECT_FALSE(first->changes_complete) << "the first version is all new";

  ShmSnapshot previous = std::move(*first);
  for (uint64_t v = 2; v <= 4; ++v) {
    t.bucket.Publish(v, 0.05);
    t.MoveTo(v);
    auto now = reader->Read();
    ASSERT_TRUE(now.ok());
    ASSERT_EQ(now->version, v);
    EXPECT_EQ(now->base_version, v - 1);
    EXPECT_TRUE(now->changes_complete);
    EXPECT_EQ(now->state_hash, t.bucket.hash(v));
    uint64_t total = 0;
    for (size_t i = 0; i < now->tensors.size(); ++i) {
      const ShmTensor& a = previous.tensors[i];
      const ShmTensor& b = now->tensors[i];
      size_t width = DTypeSize(b.dtype);
      std::vector<uint64_t> differ;
      for (size_t k = 0; k < b.data.size() / width; ++k) {
        if (std::memcmp(&a.data[k * width], &b.data[k * width], width) != 0) differ.push_back(k);
      }
      EXPECT_EQ(b.changed, differ) << b.name << " at version " << v;
      total += differ.size();
    }
    EXPECT_GT(total, 0u);
    previous = std::move(*now);
  }

  // More changes than the lists hold: announced as "everything may have
  // changed", and the data is still the whole, right state.
  t.bucket.Publish(5, 0.95);
  t.MoveTo(5);
  auto big = reader->Read();
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->version, 5u);
  EXPECT_FALSE(big->changes_complete);
  EXPECT_EQ(HashOf(*big), t.bucket.hash(5));
}

TEST(ShmTest, StopMarksTheRegionClosedAndRemovesTheName) {
  ShmDaemon t(/*pause=*/false);
  ASSERT_TRUE(t.daemon);
  auto reader = OpenWhenReady(t.name);
  ASSERT_TRUE(reader);
  t.daemon->Stop();
  auto last = reader->Read();
  ASSERT_TRUE(last.ok()) << "a mapping outlives the name";
  EXPECT_TRUE(last->closed);
  EXPECT_EQ(last->version, 1u);
  EXPECT_EQ(HashOf(*last), t.bucket.hash(1));
  auto gone = ShmReader::Open(t.name);
  EXPECT_EQ(gone.status().code(), ErrorCode::kNotFound);
}

TEST(ShmTest, BadNamesAreRefused) {
  TestBucket bucket;
  for (const char* name : {"", "/", "a/b", "../x", "with space", "/.."}) {
    ServerOptions options = DaemonOptions(bucket.store());
    options.shm_name = name;
    options.listen = "127.0.0.1:0";
    auto server = Server::Start(options);
    // "" means no --shm at all.
    if (std::string(name).empty()) {
      EXPECT_TRUE(server.ok());
      continue;
    }
    ASSERT_FALSE(server.ok()) << name;
    EXPECT_EQ(server.status().code(), ErrorCode::kInvalidArgument) << name;
  }
}

// A region whose writer is another live daemon is not taken over; once that
// daemon is gone (killed, so it could not clean up), a new one replaces it.
TEST(ShmTest, ALiveDaemonsRegionIsNotTakenAStaleOneIs) {
  if (!std::filesystem::exists(CliPath())) GTEST_FAIL() << CliPath() << " is missing: build the deltasync target";
  TestBucket bucket;
  bucket.Publish(1);
  const std::string name = UniqueShmName("owner");
  ChildProcess child;
  ASSERT_TRUE(child.Start({CliPath(), "serve", "--bucket", bucket.dir(), "--listen", "127.0.0.1:0", "--shm", name,
                           "--poll", "0.05", "--threads", "1"}));
  ASSERT_TRUE(child.WaitForLine("holding version 1")) << child.Output();
  ASSERT_TRUE(OpenWhenReady(name));

  ServerOptions options = DaemonOptions(bucket.store());
  options.shm_name = name;
  options.listen = "127.0.0.1:0";
  auto refused = Server::Start(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("in use"), std::string::npos) << refused.status().message();

  child.Signal(SIGKILL);
  child.Wait();
  auto daemon = StartDaemon(options);
  ASSERT_TRUE(daemon);
  ASSERT_TRUE(WaitForVersion(daemon->address(), 1));
  auto reader = OpenWhenReady(name);
  ASSERT_TRUE(reader);
  auto snap = reader->Read();
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->version, 1u);
  EXPECT_FALSE(snap->closed);
  EXPECT_EQ(HashOf(*snap), bucket.hash(1));
}

}  // namespace
}  // namespace deltasync::testing
