// The compact decoder's parse buffers grow without a zero fill
// (UninitVector: ranks, diffs) and are sized ahead of the parse from each
// stream's count (compact::PlausibleBf16Count), then reused parse after
// parse: CompactParse's by the caller, the decode's and apply's per thread.
// Whatever they held (values no parse leaves in a slot it reads, a larger
// parse of another model, a damaged or lying stream's partial parse), the
// next parse, decode and apply give what fresh buffers give. A stream whose
// count lies (larger or smaller than its body, up to the most a stream of
// its bytes can plausibly hold) or whose body is cut short is refused, and
// an apply of it leaves the state as it was. A failed parse leaves no
// tensor holding slots it did not write.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "codec/compact_bf16.h"
#include "codec/compact_case_util.h"
#include "codec/compact_rice.h"
#include "codec/compact_streams.h"
#include "codec/patch_test_util.h"
#include "deltasync/compact.h"
#include "deltasync/patch.h"

namespace deltasync {
namespace {

using testing::ParseBytes;
using namespace testing_compact;

void ExpectSameParse(const CompactParse& got, const CompactParse& want) {
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    const CompactParse::Tensor& g = got.tensors[i];
    const CompactParse::Tensor& w = want.tensors[i];
    SCOPED_TRACE(w.name);
    EXPECT_EQ(g.name, w.name);
    EXPECT_EQ(g.bf16, w.bf16);
    EXPECT_EQ(g.class_begin, w.class_begin);
    EXPECT_TRUE(g.ranks32 == w.ranks32);
    EXPECT_TRUE(g.ranks == w.ranks);
    EXPECT_TRUE(g.diffs == w.diffs);
    EXPECT_EQ(g.escaped, w.escaped);
    EXPECT_EQ(g.escapes, w.escapes);
    EXPECT_EQ(g.raw.indices, w.raw.indices);
    EXPECT_EQ(g.raw.values, w.raw.values);
  }
}

// Runs of consecutive changes with long gaps between them: each class's
// gap blocks take a small Rice k, so the long gaps are escaped codes (the
// reader's slow path) among short ones. "gaps" (200,000 elements): changes
// at 0-1999, 100,000-101,999 and the last element.
Case MakeEscapedGapCase() {
  std::mt19937_64 rng(3);
  Model m;
  m.Add("gaps", Spread(rng, 200000));
  Case c{m.State(), {}, {}, {}};
  c.hash = HashState(c.state, 1);
  std::vector<uint64_t> idx;
  for (uint64_t i = 0; i < 2000; ++i) idx.push_back(i);
  for (uint64_t i = 100000; i < 102000; ++i) idx.push_back(i);
  idx.push_back(199999);
  c.changes = {Change(c.state, "gaps", idx, rng)};
  EncodeCase(c);
  return c;
}

// The first tensor with changes of a case, and its element count.
std::pair<std::string, uint64_t> FirstChanged(const Case& c) {
  return {c.changes[0].name, c.state.Find(c.changes[0].name)->num_elements()};
}

// Fills every buffer of `tensors` tensors to `capacity` elements with
// values a parse never leaves where it reads (ranks past any tensor, every
// diff an escape), then empties them, capacity kept: a parse growing them
// finds these values in any slot it does not write.
void Poison(CompactParse& p, size_t tensors, size_t capacity) {
  p.tensors.resize(tensors);
  for (CompactParse::Tensor& t : p.tensors) {
    t.ranks32.assign(capacity, 0xFFFFFFF0u);
    t.ranks32.clear();
    t.ranks.assign(capacity, ~uint64_t{0} - 15);
    t.ranks.clear();
    t.diffs.assign(capacity, compact::kEscape);
    t.diffs.clear();
    t.escaped.assign(capacity, ~uint64_t{0});
    t.escaped.clear();
    t.escapes.assign(capacity, 0xEE);
    t.escapes.clear();
  }
}

// The delta `bytes` (container 1: a stream per changed tensor) with the
// stream of `tensor` made by `edit` from its count and the bytes after it.
std::vector<uint8_t> WithStream(const std::vector<uint8_t>& bytes, const std::string& tensor,
                                const std::function<void(uint64_t&, std::vector<uint8_t>&)>& edit) {
  Result<SafetensorsFile> f = ParseBytes(bytes);
  EXPECT_TRUE(f.ok());
  if (!f.ok()) return {};
  std::vector<std::vector<uint8_t>> data;
  std::vector<TensorView> views;
  for (const TensorView& v : f->tensors()) {
    std::vector<uint8_t> d(v.data.begin(), v.data.end());
    if (v.name == tensor + ".cmp") {
      compact::Reader in(v.data);
      const uint8_t version = *in.Byte(), mode = *in.Byte();
      uint64_t count = *in.Varint();
      std::vector<uint8_t> rest(d.begin() + static_cast<std::ptrdiff_t>(in.position()), d.end());
      edit(count, rest);
      d = {version, mode};
      compact::PutVarint(d, count);
      d.insert(d.end(), rest.begin(), rest.end());
    }
    data.push_back(std::move(d));
    views.push_back({v.name, v.dtype, {data.back().size()}, {}});
  }
  for (size_t i = 0; i < views.size(); ++i) views[i].data = data[i];
  Result<std::vector<uint8_t>> out = SerializeSafetensors(f->metadata(), views);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : std::vector<uint8_t>{};
}

// The delta `bytes` with the stream of `tensor` (of `elements` elements)
// made to lie about its count or cut short, named.
std::vector<std::pair<std::string, std::vector<uint8_t>>> LyingDeltas(const std::vector<uint8_t>& bytes,
                                                                      const std::string& tensor, uint64_t elements) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> out;
  auto add = [&](std::string name, const std::function<void(uint64_t&, std::vector<uint8_t>&)>& edit) {
    out.emplace_back(std::move(name), WithStream(bytes, tensor, edit));
  };
  add("count + 1", [](uint64_t& n, std::vector<uint8_t>&) { ++n; });
  add("count + 1000", [](uint64_t& n, std::vector<uint8_t>&) { n += 1000; });
  add("count = the base's elements", [&](uint64_t& n, std::vector<uint8_t>&) { n = elements; });
  add("count - 1", [](uint64_t& n, std::vector<uint8_t>&) { --n; });
  add("count = 1", [](uint64_t& n, std::vector<uint8_t>&) { n = 1; });
  add("count = 0", [](uint64_t& n, std::vector<uint8_t>&) { n = 0; });
  add("body cut to half", [](uint64_t&, std::vector<uint8_t>& r) { r.resize(r.size() / 2); });
  add("body's last byte cut", [](uint64_t&, std::vector<uint8_t>& r) { r.pop_back(); });
  add("body's last byte cut, count - 1", [](uint64_t& n, std::vector<uint8_t>& r) {
    r.pop_back();
    --n;
  });
  // The body padded to hold 8 changes a byte beyond the count: the most a
  // stream of its bytes is taken to hold (PlausibleBf16Count sizes for it).
  add("count = the base's elements, body padded with zeros", [&](uint64_t& n, std::vector<uint8_t>& r) {
    n = elements;
    r.resize(std::max<size_t>(r.size(), elements / 8 + 16), 0);
  });
  return out;
}

// fn(bytes, file, large_file): the delta of `c` (container 1) as bytes and
// parsed, and the delta of `large` parsed, in stream versions 2 and 3, on
// both rank routes (narrow, then wide, forced by compact::ForceWideRanks),
// traced; stops at a fatal failure.
void ForEachRouteAndVersion(
    const Case& c, const Case& large,
    const std::function<void(const std::vector<uint8_t>&, const SafetensorsFile&, const SafetensorsFile&)>& fn) {
  for (bool wide : {false, true}) {
    compact::ForceWideRanks(wide);
    struct Reset {
      ~Reset() { compact::ForceWideRanks(false); }
    } reset;
    for (int version : {2, 3}) {
      SCOPED_TRACE(std::string(wide ? "wide" : "narrow") + " ranks, stream version " + std::to_string(version));
      const std::vector<uint8_t> bytes = EncodeBytes(c.state, c.hash, c.changes, version, 1);
      Result<SafetensorsFile> f = ParseBytes(bytes);
      Result<SafetensorsFile> lf = ParseBytes(EncodeBytes(large.state, large.hash, large.changes, version, 1));
      ASSERT_TRUE(f.ok() && lf.ok());
      fn(bytes, *f, *lf);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// ParseCompactDelta into buffers that held poison, a larger parse of
// another model, or a damaged or lying stream's parse: the fresh buffers'
// parse, on both rank routes and stream versions 2 and 3.
TEST(CompactReuse, ParseIntoUsedBuffersEqualsAParseIntoFreshOnes) {
  const Case large = MakeLargeCase();
  const std::vector<TensorView> large_views = large.state.views();
  for (Case (*make)() : {MakeCase, MakeEdgeCase, MakeEscapedGapCase}) {
    const Case c = make();
    const std::vector<TensorView> views = c.state.views();
    ForEachRouteAndVersion(c, large,
                           [&](const std::vector<uint8_t>& bytes, const SafetensorsFile& f, const SafetensorsFile& lf) {
                             CompactParse want;
                             ASSERT_TRUE(ParseCompactDelta(f, views, 1, want).ok());

                             CompactParse used;
                             Poison(used, 4, 1 << 13);
                             ASSERT_TRUE(ParseCompactDelta(f, views, 2, used).ok());
                             ExpectSameParse(used, want);

                             ASSERT_TRUE(ParseCompactDelta(lf, large_views, 2, used).ok());
                             ASSERT_TRUE(ParseCompactDelta(f, views, 1, used).ok());
                             ExpectSameParse(used, want);

                             // A byte of the file flipped: refused, or parsed (a diff's value,
                             // say); then the good delta again.
                             size_t damaged = 0;
                             for (size_t pos = 0; pos < bytes.size(); pos += 7) {
                               std::vector<uint8_t> bad = bytes;
                               bad[pos] ^= 0x5A;
                               Result<SafetensorsFile> bf = ParseBytes(bad);
                               if (!bf.ok()) continue;
                               ++damaged;
                               Poison(used, 4, 1 << 13);
                               (void)ParseCompactDelta(*bf, views, 1, used);
                               ASSERT_TRUE(ParseCompactDelta(f, views, 1, used).ok()) << pos;
                               ExpectSameParse(used, want);
                               if (HasFailure()) return;
                             }
                             EXPECT_GT(damaged, bytes.size() / 10);
                           });
    if (HasFatalFailure()) return;
  }
}

// A parse refused midway (a stream whose count lies, cut short, or a byte
// of the file flipped) leaves no tensor whose buffers hold slots it did not
// write: a refused tensor is empty, every other one whole. The poison in
// the buffers' capacity shows any slot left unwritten within their sizes.
TEST(CompactReuse, ARefusedParseLeavesNoUnwrittenSlot) {
  const Case c = MakeCase();
  const std::vector<TensorView> views = c.state.views();
  const auto [tensor, elements] = FirstChanged(c);
  for (int version : {2, 3}) {
    const std::vector<uint8_t> bytes = EncodeBytes(c.state, c.hash, c.changes, version, 1);
    std::vector<std::pair<std::string, std::vector<uint8_t>>> refused = LyingDeltas(bytes, tensor, elements);
    for (size_t pos = 0; pos < bytes.size(); pos += 3) {
      std::vector<uint8_t> bad = bytes;
      bad[pos] ^= 0x5A;
      refused.emplace_back("byte " + std::to_string(pos) + " flipped", std::move(bad));
    }
    size_t seen = 0;
    for (const auto& [name, delta] : refused) {
      SCOPED_TRACE("stream version " + std::to_string(version) + ", " + name);
      Result<SafetensorsFile> f = ParseBytes(delta);
      if (!f.ok()) continue;
      CompactParse used;
      Poison(used, 4, 1 << 13);
      const Status s = ParseCompactDelta(*f, views, 1, used);
      if (s.ok()) continue;  // a flipped diff or escape value: parsed
      EXPECT_EQ(s.code(), ErrorCode::kCorruption) << s.ToString();
      ++seen;
      for (const CompactParse::Tensor& t : used.tensors) {
        SCOPED_TRACE(t.name);
        const uint64_t n = t.class_begin[compact::kClasses];
        EXPECT_EQ(t.ranks32.size() + t.ranks.size(), t.bf16 ? n : 0);
        EXPECT_EQ(t.diffs.size(), t.bf16 ? n : 0);
        uint64_t escapes = 0;
        for (uint8_t d : t.diffs) escapes += d == compact::kEscape;
        EXPECT_EQ(escapes, t.escaped.size());
        EXPECT_EQ(t.escapes.size(), 2 * t.escaped.size());
        const WeightState::Tensor* base = c.state.Find(t.name);
        for (size_t j = 0; j < t.ranks32.size() + t.ranks.size(); ++j) {
          ASSERT_NE(base, nullptr);
          ASSERT_LT(t.rank(j), base->num_elements()) << j;
        }
      }
      if (HasFailure()) return;
    }
    EXPECT_GE(seen, LyingDeltas(bytes, tensor, elements).size());
  }
}

// DecodeCompactDelta and ApplyCompactDelta on this thread after the larger
// case's and every lying delta's (refused, the state as it was): exactly
// what a thread of its own, its parse buffers fresh, decodes; on 1 and 3
// threads, both rank routes, stream versions 2 and 3.
TEST(CompactReuse, DecodeAndApplyAfterLyingDeltasEqualAFreshThreads) {
  const Case large = MakeLargeCase();
  for (Case (*make)() : {MakeCase, MakeEscapedGapCase}) {
    const Case c = make();
    const auto [tensor, elements] = FirstChanged(c);
    ForEachRouteAndVersion(
        c, large, [&](const std::vector<uint8_t>& bytes, const SafetensorsFile& f, const SafetensorsFile& lf) {
          std::optional<CompactDelta> want;
          std::thread([&] {
            Result<CompactDelta> d = DecodeCompactDelta(f, c.state, c.hash, 1);
            ASSERT_TRUE(d.ok()) << d.status().ToString();
            want = std::move(*d);
          }).join();
          ASSERT_TRUE(want.has_value());
          WeightState applied = Copy(c.state);
          ApplyChanges(applied, want->changes);

          for (int threads : {1, 3}) {
            SCOPED_TRACE(tensor + ", threads " + std::to_string(threads));
            WeightState state = Copy(c.state);
            CompactUndo undo;
            for (const auto& [name, lying] : LyingDeltas(bytes, tensor, elements)) {
              SCOPED_TRACE(name);
              ASSERT_TRUE(DecodeCompactDelta(lf, large.state, large.hash, threads).ok());
              Result<SafetensorsFile> lied = ParseBytes(lying);
              ASSERT_TRUE(lied.ok());
              EXPECT_EQ(DecodeCompactDelta(*lied, c.state, c.hash, threads).status().code(), ErrorCode::kCorruption);
              Result<CompactDelta> refused = ApplyCompactDelta(*lied, state, c.hash, threads, undo);
              EXPECT_EQ(refused.status().code(), ErrorCode::kCorruption);
              EXPECT_TRUE(SameBytes(state, c.state));

              Result<CompactDelta> d = DecodeCompactDelta(f, c.state, c.hash, threads);
              ASSERT_TRUE(d.ok()) << d.status().ToString();
              EXPECT_EQ(d->hash_delta, want->hash_delta);
              ASSERT_EQ(d->changes.size(), want->changes.size());
              for (size_t i = 0; i < want->changes.size(); ++i) {
                EXPECT_EQ(d->changes[i].indices, want->changes[i].indices) << want->changes[i].name;
                EXPECT_EQ(d->changes[i].values, want->changes[i].values) << want->changes[i].name;
              }
              Result<CompactDelta> a = ApplyCompactDelta(f, state, c.hash, threads, undo);
              ASSERT_TRUE(a.ok()) << a.status().ToString();
              EXPECT_EQ(a->hash_delta, want->hash_delta);
              EXPECT_TRUE(SameBytes(state, applied));
              undo.Restore(threads);
              ASSERT_TRUE(SameBytes(state, c.state));
            }
          }
        });
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace deltasync
