// ParseCompactDelta (the compact decoder's first step alone, for `deltasync
// bench`'s decode floor): on the compact test deltas, in stream versions 2
// and 3, its ranks, diffs and escapes, placed by a plain walk of the base,
// are exactly the changes DecodeCompactDelta produces; raw-mode tensors are
// decoded whole; a stream naming no base tensor, or of an unknown version,
// is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "codec/compact_bf16.h"
#include "codec/compact_case_util.h"
#include "codec/compact_container.h"
#include "codec/compact_read.h"
#include "codec/compact_streams.h"
#include "codec/patch_test_util.h"
#include "deltasync/compact.h"

namespace deltasync {
namespace {

using testing::Flatten;
using testing::ParseBytes;
using namespace testing_compact;

// The changes a parsed bf16 tensor holds, placed by walking the base: the
// change of class cl at rank r is the base's r-th element of class cl; its
// value the old one moved by the zigzag diff, or the next escape.
TensorChanges Place(const CompactParse::Tensor& p, const WeightState::Tensor& base) {
  std::vector<std::vector<uint64_t>> of_class(compact::kClasses);
  const uint64_t n = base.num_elements();
  std::vector<uint16_t> bits(n);
  std::memcpy(bits.data(), base.data.data(), 2 * n);
  for (uint64_t i = 0; i < n; ++i) of_class[compact::ClassOf(bits[i])].push_back(i);
  std::vector<std::pair<uint64_t, uint16_t>> placed;
  size_t escape = 0;
  for (int cl = 0; cl < compact::kClasses; ++cl) {
    for (uint64_t j = p.class_begin[cl]; j < p.class_begin[cl + 1]; ++j) {
      EXPECT_LT(p.rank(j), of_class[cl].size()) << p.name << " change " << j;
      if (p.rank(j) >= of_class[cl].size()) continue;
      const uint64_t at = of_class[cl][p.rank(j)];
      uint16_t v;
      if (p.diffs[j] == compact::kEscape) {
        EXPECT_LT(escape, p.escaped.size());
        EXPECT_EQ(p.escaped[escape], j);
        std::memcpy(&v, p.escapes.data() + 2 * escape++, 2);
      } else {
        v = static_cast<uint16_t>(bits[at] + compact::UnZigZag(p.diffs[j]));
      }
      placed.push_back({at, v});
    }
  }
  EXPECT_EQ(escape, p.escaped.size());
  EXPECT_EQ(2 * escape, p.escapes.size());
  std::sort(placed.begin(), placed.end());
  TensorChanges c{p.name, DType::kBF16, {}, {}};
  for (const auto& [at, v] : placed) {
    c.indices.push_back(at);
    c.values.push_back(static_cast<uint8_t>(v));
    c.values.push_back(static_cast<uint8_t>(v >> 8));
  }
  return c;
}

void ExpectParseEqualsDecode(const WeightState& state, const StateHash& hash, const std::vector<TensorChanges>& changes) {
  for (int k = 0; k < 4; ++k) {
    const int version = 2 + k % 2, container = 1 + k / 2;
    for (int threads : {1, 3}) {
      SCOPED_TRACE("stream version " + std::to_string(version) + ", container " + std::to_string(container) +
                   ", threads " + std::to_string(threads));
      const std::vector<uint8_t> bytes = EncodeBytes(state, hash, changes, version, container);
      ASSERT_FALSE(bytes.empty());
      Result<SafetensorsFile> f = ParseBytes(bytes);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      Result<CompactDelta> d = DecodeCompactDelta(*f, state, hash, 1);
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      const std::vector<TensorView> views = state.views();
      CompactParse parsed;
      for (int round = 0; round < 2; ++round) {  // the second reuses the first's buffers
        ASSERT_TRUE(ParseCompactDelta(*f, views, threads, parsed).ok());
        ASSERT_EQ(parsed.tensors.size(), d->changes.size());
        uint64_t total = 0;
        for (const TensorChanges& c : d->changes) total += c.count();
        EXPECT_EQ(parsed.changes(), total);
        for (size_t i = 0; i < parsed.tensors.size(); ++i) {
          const CompactParse::Tensor& p = parsed.tensors[i];
          const TensorChanges& want = d->changes[i];
          ASSERT_EQ(p.name, want.name);
          const WeightState::Tensor* base = state.Find(p.name);
          ASSERT_NE(base, nullptr);
          if (!p.bf16) {
            EXPECT_NE(base->dtype, DType::kBF16);
            EXPECT_EQ(p.raw.indices, want.indices);
            EXPECT_EQ(p.raw.values, want.values);
            continue;
          }
          EXPECT_EQ(p.class_begin[compact::kClasses], want.count());
          EXPECT_EQ(p.ranks32.size() + p.ranks.size(), want.count());
          EXPECT_EQ(p.diffs.size(), want.count());
          const TensorChanges placed = Place(p, *base);
          EXPECT_EQ(placed.indices, want.indices) << p.name;
          EXPECT_EQ(placed.values, want.values) << p.name;
        }
      }
    }
  }
}

TEST(CompactParse, EqualsTheDecodeOnTheCompactTestDeltas) {
  for (Case (*make)() : {MakeCase, MakeSparseCase, MakeEdgeCase}) {
    const Case c = make();
    ExpectParseEqualsDecode(c.state, c.hash, c.changes);
  }
}

TEST(CompactParse, RawModeTensorsAreDecodedWhole) {
  const MixedCase m = MakeMixedCase();
  ExpectParseEqualsDecode(m.state, HashState(m.state, 1), m.changes);
}

TEST(CompactParse, RefusesAStreamOfNoBaseTensorOrOfAnUnknownVersion) {
  const Case c = MakeCase();
  CompactParse parsed;
  std::vector<TensorView> views = c.state.views();
  views.erase(std::find_if(views.begin(), views.end(), [](const TensorView& v) { return v.name == "dense"; }));
  // Container 1 names the missing tensor; container 2's last index (3) is
  // past the three tensors left.
  for (int container : {1, 2}) {
    Result<SafetensorsFile> f = ParseBytes(EncodeBytes(c.state, c.hash, c.changes, 3, container));
    ASSERT_TRUE(f.ok());
    Status s = ParseCompactDelta(*f, views, 1, parsed);
    EXPECT_EQ(s.code(), ErrorCode::kCorruption) << s.ToString();
    EXPECT_NE(s.ToString().find(container == 1 ? "tensor 'dense.cmp': names a tensor the base does not have"
                                               : "tensor index 3 is out of range (the base has 3 tensors)"),
              std::string::npos)
        << s.ToString();
  }

  // A stream of an unknown version: the decoder's own check refuses it,
  // as the decode does.
  Status s;
  for (int k = 0; k < 4; ++k) {
    const int version = 2 + k % 2, container = 1 + k / 2;
    std::vector<uint8_t> bytes = EncodeBytes(c.state, c.hash, c.changes, version, container);
    Result<SafetensorsFile> whole = ParseBytes(bytes);
    ASSERT_TRUE(whole.ok());
    Result<std::vector<compact::Stream>> listed = compact::ListStreams(*whole, c.state.views());
    ASSERT_TRUE(listed.ok());
    ASSERT_EQ((*listed)[0].stream.name, "big.cmp");
    bytes[static_cast<size_t>((*listed)[0].stream.data.data() - whole->blob().bytes().data())] = 9;
    Result<SafetensorsFile> bad = ParseBytes(bytes);
    ASSERT_TRUE(bad.ok());
    s = ParseCompactDelta(*bad, c.state.views(), 1, parsed);
    EXPECT_EQ(s.code(), ErrorCode::kCorruption) << s.ToString();
    EXPECT_NE(s.ToString().find("unknown stream version 9"), std::string::npos) << s.ToString();
    EXPECT_EQ(DecodeCompactDelta(*bad, c.state, c.hash, 1).status().code(), ErrorCode::kCorruption);
  }
}

// PlausibleBf16Count (the decoder sizes a stream's parse buffers from it
// ahead of the parse): every version-3 bf16 stream's own count; nothing for
// a raw-mode stream, a malformed header or an implausible count.
TEST(CompactParse, PlausibleBf16CountIsAStreamsCountOrNothing) {
  const MixedCase m = MakeMixedCase();
  const Case large = MakeLargeCase();
  struct Delta {
    const WeightState* state;
    StateHash hash;
    const std::vector<TensorChanges>* changes;
  };
  for (const Delta& d : {Delta{&m.state, HashState(m.state, 1), &m.changes}, Delta{&large.state, large.hash, &large.changes}}) {
    for (int version : {2, 3}) {
      SCOPED_TRACE("stream version " + std::to_string(version));
      const std::vector<uint8_t> bytes = EncodeBytes(*d.state, d.hash, *d.changes, version);
      Result<SafetensorsFile> f = ParseBytes(bytes);
      ASSERT_TRUE(f.ok());
      const std::vector<TensorView> views = d.state->views();
      Result<std::vector<compact::Stream>> listed = compact::ListStreams(*f, views);
      ASSERT_TRUE(listed.ok());
      CompactParse parsed;
      ASSERT_TRUE(ParseCompactDelta(*f, views, 1, parsed).ok());
      ASSERT_EQ(listed->size(), parsed.tensors.size());
      for (size_t i = 0; i < listed->size(); ++i) {
        const std::optional<uint64_t> count = compact::PlausibleBf16Count((*listed)[i].stream, views[(*listed)[i].base]);
        if (!parsed.tensors[i].bf16) {
          EXPECT_FALSE(count) << parsed.tensors[i].name;
        } else if (version == 3 || count) {
          ASSERT_TRUE(count) << parsed.tensors[i].name;
          EXPECT_EQ(*count, parsed.tensors[i].class_begin[compact::kClasses]) << parsed.tensors[i].name;
        }
      }
    }
  }
  // Made-up headers against a bf16 base of 1000 elements: version, mode,
  // count, then `tail` bytes.
  std::vector<uint8_t> elements(2000);
  const TensorView base{"w", DType::kBF16, {1000}, elements};
  auto count_of = [&](std::vector<uint8_t> header, size_t tail, const TensorView& b) {
    header.resize(header.size() + tail);
    const TensorView stream{"w.cmp", DType::kU8, {header.size()}, header};
    return compact::PlausibleBf16Count(stream, b);
  };
  auto header = [](uint8_t version, uint8_t mode, uint64_t count) {
    std::vector<uint8_t> h = {version, mode};
    compact::PutVarint(h, count);
    return h;
  };
  EXPECT_EQ(count_of(header(3, compact::kModeBf16, 700), 100, base), std::optional<uint64_t>(700));
  EXPECT_EQ(count_of(header(2, compact::kModeBf16, 1000), 200, base), std::optional<uint64_t>(1000));
  // At most 8 changes per stream byte: 800 in a 100-byte stream (its 4-byte
  // header counted).
  EXPECT_EQ(count_of(header(3, compact::kModeBf16, 800), 96, base), std::optional<uint64_t>(800));
  EXPECT_FALSE(count_of(header(3, compact::kModeBf16, 801), 96, base));
  EXPECT_FALSE(count_of(header(3, compact::kModeBf16, 1001), 1000, base));  // more than the elements
  EXPECT_FALSE(count_of(header(3, compact::kModeRaw, 10), 100, base));
  EXPECT_FALSE(count_of(header(4, compact::kModeBf16, 10), 100, base));
  EXPECT_FALSE(count_of(header(1, compact::kModeBf16, 10), 100, base));
  EXPECT_FALSE(count_of({3, compact::kModeBf16, 0x80}, 0, base));  // the count's varint cut short
  EXPECT_FALSE(count_of({3}, 0, base));
  EXPECT_FALSE(count_of({}, 0, base));
  const TensorView f32{"f", DType::kF32, {500}, elements};
  EXPECT_FALSE(count_of(header(3, compact::kModeBf16, 10), 100, f32));
}

}  // namespace
}  // namespace deltasync
