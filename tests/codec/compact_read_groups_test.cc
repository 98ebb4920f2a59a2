// The decoder's first step reads its streams in groups of tensors
// (compact_read.cc, ReadTensors): each tensor's gaps, then the rANS pieces
// of the whole group decoded together (DecodeRansPieces, two pieces' states
// in flight across tensor borders), then each tensor's end. Each tensor's
// outcome must be its own: on a delta of tensors of 1 to 470,000 changes
// (one piece of one rANS state, one of two, several pieces; two groups), the
// decode gives the changes on 1 to 3 threads, and with bits flipped in one
// stream the decode and ParseCompactDelta fail exactly as reading each
// stream alone (a group of one) does.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "codec/compact_case_util.h"
#include "codec/compact_container.h"
#include "codec/compact_read.h"
#include "codec/compact_v3.h"
#include "codec/patch_test_util.h"
#include "deltasync/compact.h"

namespace deltasync {
namespace {

using testing::ParseBytes;
using namespace testing_compact;

TEST(CompactReadGroups, EveryTensorsChangesAndErrorsAreItsOwn) {
  std::mt19937_64 rng(44);
  struct Shape {
    std::string name;
    size_t elements, changes;
  };
  const std::vector<Shape> shapes = {{"t0", 3000, 100},   {"t1", 500, 63},       {"t2", 900, 64},
                                     {"t3", 9000, 2000},  {"t4", 150000, 70000}, {"t5", 100, 1},
                                     {"t6", 20000, 5000}, {"t7", 1000000, 470000}, {"t8", 5000, 300}};
  Model m;
  for (const Shape& s : shapes) m.Add(s.name, Spread(rng, s.elements));
  Case c{m.State(), {}, {}, {}};
  c.hash = HashState(c.state, 1);
  for (const Shape& s : shapes) {
    std::vector<uint64_t> all(s.elements);
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(s.changes);
    std::sort(all.begin(), all.end());
    c.changes.push_back(Change(c.state, s.name, all, rng));
  }
  const std::vector<uint8_t> bytes = EncodeBytes(c.state, c.hash, c.changes, 3);
  ASSERT_FALSE(bytes.empty());
  {
    Result<SafetensorsFile> f = ParseBytes(bytes);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    for (int threads : {1, 2, 3}) {
      Result<CompactDelta> d = DecodeCompactDelta(*f, c.state, c.hash, threads);
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      ASSERT_EQ(d->changes.size(), c.changes.size());
      for (size_t i = 0; i < c.changes.size(); ++i) {
        EXPECT_EQ(d->changes[i].indices, c.changes[i].indices) << c.changes[i].name << ", threads " << threads;
        EXPECT_EQ(d->changes[i].values, c.changes[i].values) << c.changes[i].name << ", threads " << threads;
      }
    }
  }
  // Bits flipped in one stream past its header (version, mode, count).
  Result<SafetensorsFile> whole = ParseBytes(bytes);
  ASSERT_TRUE(whole.ok());
  const std::vector<TensorView> views = c.state.views();
  Result<std::vector<compact::Stream>> listed = compact::ListStreams(*whole, views);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), shapes.size());
  int failed = 0;
  CompactParse parsed;
  for (int trial = 0; trial < 48; ++trial) {
    // The large stream less often (its decode takes longest).
    const size_t k = trial % 8 == 7 ? 7 : std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 8}[rng() % 8];
    const ByteSpan stream = (*listed)[k].stream.data;
    const size_t at = static_cast<size_t>(stream.data() - whole->blob().bytes().data());
    std::vector<uint8_t> broken = bytes;
    const size_t flips = 1 + trial % 2;
    for (size_t j = 0; j < flips; ++j) {
      broken[at + 6 + rng() % (stream.size() - 6)] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    Result<SafetensorsFile> f = ParseBytes(broken);
    ASSERT_TRUE(f.ok());
    // Each stream read alone, in order: the first error.
    Result<std::vector<compact::Stream>> streams = compact::ListStreams(*f, views);
    ASSERT_TRUE(streams.ok());
    std::optional<compact::V3Tables> tables;
    ASSERT_TRUE(compact::ParseDeltaTables(*f, tables).ok());
    Status want;
    for (const compact::Stream& s : *streams) {
      std::vector<compact::Bf16Tensor> bf(1);
      std::vector<TensorChanges> raw(1);
      std::vector<Status> errors;
      compact::ReadCompactStreams(f->label(), {&s.stream}, {&views[s.base]}, &*tables, 1, raw, bf, errors);
      ASSERT_EQ(errors.size(), 1u);
      if (!errors[0].ok()) {
        want = errors[0];
        break;
      }
    }
    SCOPED_TRACE("trial " + std::to_string(trial) + ", stream " + std::to_string(k));
    EXPECT_EQ(ParseCompactDelta(*f, views, 2, parsed).ToString(), want.ToString());
    if (want.ok()) continue;  // a flip the parse cannot see (the walk may)
    ++failed;
    for (int threads : {1, 3}) {
      const Status got = DecodeCompactDelta(*f, c.state, c.hash, threads).status();
      EXPECT_EQ(got.ToString(), want.ToString()) << "threads " << threads;
    }
  }
  EXPECT_GT(failed, 15);
}

}  // namespace
}  // namespace deltasync
