// The compact delta's containers (codec/compact_container.h, docs/format.md
// "Containers"): container 1 (a `{P}.cmp` tensor per changed parameter) and
// container 2 (every stream in one `streams` tensor after a directory) hold
// the same streams, decode, parse and apply to the same result on the
// compact test cases in both stream versions, and the automatic choice is
// never larger than either; container 2's directory and metadata are read
// strictly (index out of range or overflowing, lengths that do not fill the
// tensor or run past it, trailing bytes, a wrong entry count, malformed
// varints, a wrong num_changed_params, an unknown container key value).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "codec/compact_bf16.h"
#include "codec/compact_case_util.h"
#include "codec/compact_container.h"
#include "codec/compact_streams.h"
#include "codec/patch_test_util.h"
#include "deltasync/compact.h"

namespace deltasync {
namespace {

using testing::Flatten;
using testing::ParseBytes;
using namespace testing_compact;

struct Named {
  std::string name;
  Case c;
};

std::vector<Named> Cases() {
  std::vector<Named> out;
  out.push_back({"MakeCase", MakeCase()});
  out.push_back({"MakeSparseCase", MakeSparseCase()});
  out.push_back({"MakeEdgeCase", MakeEdgeCase()});
  MixedCase m = MakeMixedCase();
  Case mixed{std::move(m.state), {}, std::move(m.changes), {}};
  mixed.hash = HashState(mixed.state, 1);
  out.push_back({"MakeMixedCase", std::move(mixed)});
  return out;
}

void ExpectSameChanges(const std::vector<TensorChanges>& a, const std::vector<TensorChanges>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].dtype, b[i].dtype);
    EXPECT_EQ(a[i].indices, b[i].indices) << a[i].name;
    EXPECT_EQ(a[i].values, b[i].values) << a[i].name;
  }
}

TEST(CompactContainer, BothContainersDecodeParseAndApplyAlike) {
  for (Named& n : Cases()) {
    for (int version : {2, 3}) {
      SCOPED_TRACE(n.name + ", stream version " + std::to_string(version));
      const Case& c = n.c;
      const std::vector<uint8_t> one = EncodeBytes(c.state, c.hash, c.changes, version, 1);
      const std::vector<uint8_t> two = EncodeBytes(c.state, c.hash, c.changes, version, 2);
      const std::vector<uint8_t> best = EncodeBytes(c.state, c.hash, c.changes, version, kCompactContainerAuto);
      EXPECT_EQ(best.size(), std::min(one.size(), two.size()));
      if (c.changes.size() >= 2) EXPECT_LT(two.size(), one.size());
      Result<SafetensorsFile> f1 = ParseBytes(one, "one"), f2 = ParseBytes(two, "two");
      ASSERT_TRUE(f1.ok() && f2.ok());
      ASSERT_EQ(f2->tensors().size(), 1u);
      EXPECT_EQ(f2->tensors()[0].name, "streams");
      EXPECT_EQ(f2->metadata().at("deltasync_compact_container"), "2");
      EXPECT_EQ(f1->metadata().count("deltasync_compact_container"), 0u);
      EXPECT_EQ(f2->metadata().at("num_changed_params"), f1->metadata().at("num_changed_params"));
      EXPECT_EQ(f2->metadata().at("total_changed_elements"), f1->metadata().at("total_changed_elements"));
      // The same stream bytes in both, in name order.
      Result<compact::RawStreams> r1 = compact::ReadContainer(*f1), r2 = compact::ReadContainer(*f2);
      ASSERT_TRUE(r1.ok() && r2.ok());
      ASSERT_EQ(r1->streams.size(), r2->streams.size());
      for (size_t i = 0; i < r1->streams.size(); ++i) {
        ASSERT_LT(r2->streams[i].index, c.state.tensors().size());
        EXPECT_EQ(c.state.tensors()[r2->streams[i].index].name, r1->streams[i].param);
        EXPECT_TRUE(std::ranges::equal(r1->streams[i].bytes, r2->streams[i].bytes)) << r1->streams[i].param;
      }
      Result<CompactDelta> d1 = DecodeCompactDelta(*f1, c.state, c.hash, 1);
      Result<CompactDelta> d2 = DecodeCompactDelta(*f2, c.state, c.hash, 3);
      ASSERT_TRUE(d1.ok()) << d1.status().ToString();
      ASSERT_TRUE(d2.ok()) << d2.status().ToString();
      ExpectSameChanges(d1->changes, d2->changes);
      ExpectSameChanges(d2->changes, c.changes);
      EXPECT_EQ(d1->hash_delta, d2->hash_delta);
      // The base given in any order: container 2's index is into its name order.
      std::vector<TensorView> reversed = c.state.views();
      std::reverse(reversed.begin(), reversed.end());
      Result<CompactDelta> dr = DecodeCompactDelta(*f2, reversed, c.hash, 1);
      ASSERT_TRUE(dr.ok()) << dr.status().ToString();
      ExpectSameChanges(dr->changes, c.changes);
      // ParseCompactDelta reads both the same way.
      CompactParse p1, p2;
      ASSERT_TRUE(ParseCompactDelta(*f1, c.state.views(), 1, p1).ok());
      ASSERT_TRUE(ParseCompactDelta(*f2, reversed, 2, p2).ok());
      ASSERT_EQ(p1.tensors.size(), p2.tensors.size());
      for (size_t i = 0; i < p1.tensors.size(); ++i) {
        EXPECT_EQ(p1.tensors[i].name, p2.tensors[i].name);
        EXPECT_EQ(p1.tensors[i].ranks32, p2.tensors[i].ranks32);
        EXPECT_EQ(p1.tensors[i].ranks, p2.tensors[i].ranks);
        EXPECT_EQ(p1.tensors[i].diffs, p2.tensors[i].diffs);
        EXPECT_EQ(p1.tensors[i].raw.values, p2.tensors[i].raw.values);
      }
      // Applied in place: the same state.
      WeightState s1 = Copy(c.state), s2 = Copy(c.state);
      CompactUndo u1, u2;
      ASSERT_TRUE(ApplyCompactDelta(*f1, s1, c.hash, 1, u1).ok());
      ASSERT_TRUE(ApplyCompactDelta(*f2, s2, c.hash, 2, u2).ok());
      EXPECT_EQ(testing::Snapshot(s1), testing::Snapshot(s2));
      EXPECT_NE(testing::Snapshot(s2), testing::Snapshot(c.state));
      // Measured alike, container 2 by base index.
      Result<CompactStreamSizes> m1 = MeasureCompactDelta(*f1), m2 = MeasureCompactDelta(*f2);
      ASSERT_TRUE(m1.ok() && m2.ok());
      EXPECT_EQ(m1->container, 1);
      EXPECT_EQ(m2->container, 2);
      EXPECT_EQ(m1->changed, m2->changed);
      EXPECT_EQ(m1->gap_bytes, m2->gap_bytes);
      EXPECT_EQ(m1->diff_bytes, m2->diff_bytes);
      EXPECT_EQ(m1->escape_bytes + m1->value_bytes, m2->escape_bytes + m2->value_bytes);
      EXPECT_EQ(m1->header_bytes - one.size(), m2->header_bytes - two.size());  // the payload is the same
    }
  }
}

// A container-2 file rebuilt from its parts, to break one thing at a time.
struct Parts {
  Metadata metadata;
  std::vector<uint64_t> indices;
  std::vector<std::vector<uint8_t>> streams;
};

Parts Split(const std::vector<uint8_t>& bytes) {
  Result<SafetensorsFile> f = ParseBytes(bytes);
  EXPECT_TRUE(f.ok());
  Parts p{f->metadata(), {}, {}};
  Result<compact::RawStreams> raw = compact::ReadContainer(*f);
  EXPECT_TRUE(raw.ok() && raw->container == 2);
  for (const compact::RawStream& s : raw->streams) {
    p.indices.push_back(s.index);
    p.streams.emplace_back(s.bytes.begin(), s.bytes.end());
  }
  return p;
}

// Container 2's tensor bytes: the directory, then the streams back to back
// (the writer sends them as separate parts; the tests build whole tensors).
std::vector<uint8_t> Container2(std::span<const uint64_t> indices, std::span<const std::vector<uint8_t>> streams) {
  std::vector<uint8_t> out = compact::WriteContainer2Directory(indices, streams);
  for (const std::vector<uint8_t>& st : streams) out.insert(out.end(), st.begin(), st.end());
  return out;
}

std::vector<uint8_t> File(const Metadata& m, std::vector<uint8_t> tensor, std::string name = "streams",
                          DType dtype = DType::kU8) {
  const uint64_t n = tensor.size() / DTypeSize(dtype);
  std::vector<TensorView> v{{std::move(name), dtype, {n}, tensor}};
  Result<std::vector<uint8_t>> out = SerializeSafetensors(m, v);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : std::vector<uint8_t>{};
}

TEST(CompactContainer, Container2RefusesEveryNonCanonicalDirectory) {
  Case c = MakeCase();  // four bf16 tensors, all changed
  const std::vector<uint8_t> good = EncodeBytes(c.state, c.hash, c.changes, 3, 2);
  const Parts p = Split(good);
  ASSERT_EQ(p.indices, (std::vector<uint64_t>{0, 1, 2, 3}));
  auto expect = [&](const std::vector<uint8_t>& bytes, const std::string& want) {
    Result<SafetensorsFile> f = ParseBytes(bytes, "bad");
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    Result<CompactDelta> d = DecodeCompactDelta(*f, c.state, c.hash, 1);
    ASSERT_FALSE(d.ok()) << want;
    EXPECT_EQ(d.status().code(), ErrorCode::kCorruption) << d.status().ToString();
    EXPECT_NE(d.status().message().find(want), std::string::npos) << d.status().ToString();
    CompactParse parsed;
    Status s = ParseCompactDelta(*f, c.state.views(), 1, parsed);
    const bool metadata_only = want.find("num_changed_params") != std::string::npos ||
                               want.find("total_changed_elements") != std::string::npos;
    EXPECT_EQ(s.ok(), metadata_only) << s.ToString();  // ParseCompactDelta checks streams, not totals
  };
  // Sanity: the rebuilt file is the original.
  EXPECT_EQ(File(p.metadata, Container2(p.indices, p.streams)), good);

  // Directory by hand: varint n, then per entry (index gap, length).
  auto directory = [&](std::vector<uint64_t> gaps, std::vector<uint64_t> lengths, size_t count) {
    std::vector<uint8_t> out;
    compact::PutVarint(out, count);
    for (size_t k = 0; k < gaps.size(); ++k) {
      compact::PutVarint(out, gaps[k]);
      if (k < lengths.size()) compact::PutVarint(out, lengths[k]);
    }
    return out;
  };
  std::vector<uint64_t> gaps{0, 0, 0, 0}, lengths;
  std::vector<uint8_t> payload;
  for (const std::vector<uint8_t>& s : p.streams) {
    lengths.push_back(s.size());
    payload.insert(payload.end(), s.begin(), s.end());
  }
  auto with = [&](std::vector<uint64_t> g, std::vector<uint64_t> l, size_t count, std::vector<uint8_t> body) {
    std::vector<uint8_t> t = directory(g, l, count);
    t.insert(t.end(), body.begin(), body.end());
    return File(p.metadata, t);
  };
  EXPECT_EQ(with(gaps, lengths, 4, payload), good);

  // Index out of range: the last entry's gap one more (index 4 of 4 tensors).
  expect(with({0, 0, 0, 1}, lengths, 4, payload), "tensor index 4 is out of range (the base has 4 tensors)");
  // An index that overflows 64 bits.
  expect(with({0, 0, 0, UINT64_MAX}, lengths, 4, payload), "directory entry 3: tensor index overflows");
  // Lengths that do not fill the tensor: one byte left over.
  std::vector<uint64_t> short_last = lengths;
  short_last[3] -= 1;
  expect(with(gaps, short_last, 4, payload), "1 trailing bytes after the last stream");
  // A length that runs past the tensor.
  std::vector<uint64_t> long_last = lengths;
  long_last[3] += 1;
  expect(with(gaps, long_last, 4, payload), "directory entry 3: stream length");
  expect(with(gaps, long_last, 4, payload), "runs past the tensor (");
  // Trailing bytes after the streams.
  std::vector<uint8_t> extra = payload;
  extra.push_back(0);
  expect(with(gaps, lengths, 4, extra), "1 trailing bytes after the last stream");
  // A shorter first stream and a longer second: the lengths still fill the
  // tensor, so each stream's own checks refuse it.
  std::vector<uint64_t> shifted = lengths;
  shifted[0] -= 1;
  shifted[1] += 1;
  expect(with(gaps, shifted, 4, payload), "tensor 'big.cmp'");
  // Fewer entries than streams: the directory's count says 3, so the 4th
  // entry's bytes are read as stream bytes and the lengths do not fill.
  expect(with({0, 0, 0}, {lengths[0], lengths[1], lengths[2]}, 3, payload), "trailing bytes after the last stream");
  // A count the tensor cannot hold, and a truncated directory.
  expect(with({}, {}, 1000000, {}), "directory: 1000000 entries cannot fit");
  expect(with({0, 0}, {lengths[0]}, 2, {}), "directory entry 1 is truncated or malformed");
  // A non-canonical varint (0x80 0x00 for 0) in the directory.
  std::vector<uint8_t> noncanon{4, 0x80, 0x00};
  compact::PutVarint(noncanon, lengths[0]);
  std::vector<uint8_t> rest = directory({0, 0, 0}, {lengths[1], lengths[2], lengths[3]}, 0);
  noncanon.insert(noncanon.end(), rest.begin() + 1, rest.end());
  noncanon.insert(noncanon.end(), payload.begin(), payload.end());
  expect(File(p.metadata, noncanon), "directory entry 0 is truncated or malformed");
  // Skipping tensor 1 (index gaps 0, 1, 0, 0 -> 0, 2, 3, 4): its stream is
  // then read against tensor 2 ('one_class') and so on, to index 4.
  expect(with({0, 1, 0, 0}, lengths, 4, payload), "tensor index 4 is out of range");

  // num_changed_params must equal the directory's entries.
  Metadata wrong = p.metadata;
  wrong["num_changed_params"] = "5";
  expect(File(wrong, Container2(p.indices, p.streams)), "num_changed_params 5 but 4 streams");
  // total_changed_elements as before.
  wrong = p.metadata;
  wrong["total_changed_elements"] = "1";
  expect(File(wrong, Container2(p.indices, p.streams)), "total_changed_elements 1 but");

  // The container key: any value but "2" (container 1 has no key).
  for (std::string v : {"3", "1", "", "02"}) {
    Metadata m = p.metadata;
    m["deltasync_compact_container"] = v;
    expect(File(m, Container2(p.indices, p.streams)),
           "__metadata__ 'deltasync_compact_container' is '" + v + "', expected '2'");
  }
  // Without the key, the `streams` tensor is read as container 1 (and refused).
  Metadata no_key = p.metadata;
  no_key.erase("deltasync_compact_container");
  expect(File(no_key, Container2(p.indices, p.streams)), "tensor 'streams': name does not end in '.cmp'");
  // With the key, a container-1 file is refused: it is not one `streams` tensor.
  Result<SafetensorsFile> f1 = ParseBytes(EncodeBytes(c.state, c.hash, c.changes, 3, 1));
  ASSERT_TRUE(f1.ok());
  Metadata keyed = f1->metadata();
  keyed["deltasync_compact_container"] = "2";
  Result<std::vector<uint8_t>> mislabelled = SerializeSafetensors(keyed, f1->tensors());
  ASSERT_TRUE(mislabelled.ok());
  expect(*mislabelled, "container 2 holds exactly one tensor 'streams', this file has 4 tensors");
  // The one tensor under another name, or not U8.
  expect(File(p.metadata, Container2(p.indices, p.streams), "stream"),
         "holds exactly one tensor 'streams', this file has 1 tensors, the first 'stream'");
  std::vector<uint8_t> even = Container2(p.indices, p.streams);
  if (even.size() % 2) even.push_back(0);
  expect(File(p.metadata, even, "streams", DType::kI16), "tensor 'streams': not a 1-D U8 tensor");
}

TEST(CompactContainer, EmptyAndOneTensorDeltasKeepTheSmallerContainer) {
  Case c = MakeCase();
  // No changes: container 1 (no tensors) is smaller than a `streams` tensor
  // plus the key; both decode to nothing.
  const std::vector<uint8_t> one = EncodeBytes(c.state, c.hash, {}, 3, 1);
  const std::vector<uint8_t> two = EncodeBytes(c.state, c.hash, {}, 3, 2);
  EXPECT_LT(one.size(), two.size());
  EXPECT_EQ(EncodeBytes(c.state, c.hash, {}, 3, kCompactContainerAuto), one);
  for (const std::vector<uint8_t>* b : {&one, &two}) {
    Result<SafetensorsFile> f = ParseBytes(*b);
    ASSERT_TRUE(f.ok());
    Result<CompactDelta> d = DecodeCompactDelta(*f, c.state, c.hash, 1);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_TRUE(d->changes.empty());
  }
  // The encoder refuses an unknown container.
  PatchInfo info;
  info.model_version = 3;
  info.base_version = 2;
  Result<EncodedPatch> e = EncodeCompactDelta(info, c.hash, c.state, c.changes, 1, 3, 7);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("compact container 7"), std::string::npos);
}

}  // namespace
}  // namespace deltasync
