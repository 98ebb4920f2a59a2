// MeasureCompactDelta (deltasync/compact.h, src/codec/compact_inspect.cc):
// where a compact delta's bytes go, per stream kind, against an independent
// reading of each stream's layout as docs/format.md ("Tensors", "Stream
// version 3", "block") documents it. The existing tests only check that the
// parts add up to the file, which a byte counted in the wrong part passes
// (the header is the remainder).
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "codec/patch_test_util.h"
#include "deltasync/compact.h"

namespace deltasync {
namespace {

using testing::Flatten;
using testing::ParseBytes;

// A stream's bytes read front to back as docs/format.md lays them out.
class LayoutReader {
 public:
  explicit LayoutReader(ByteSpan bytes) : bytes_(bytes) {}
  uint8_t Byte() { return At(pos_++); }
  uint64_t Varint() {  // unsigned LEB128
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      const uint8_t b = Byte();
      v |= uint64_t{b & 0x7Fu} << shift;
      if (!(b & 0x80)) return v;
    }
  }
  uint16_t U16() { return static_cast<uint16_t>(Byte() | Byte() << 8); }
  // A block (method, raw_len, stored_len, payload): its payload's length.
  uint64_t Block() {
    Byte();
    Varint();
    const uint64_t stored = Varint();
    Skip(stored);
    return stored;
  }
  void Skip(uint64_t n) { pos_ += n; }
  bool AtEnd() const { return pos_ == bytes_.size(); }

 private:
  uint8_t At(size_t i) const {
    EXPECT_LT(i, bytes_.size()) << "the stream ends early";
    return i < bytes_.size() ? bytes_[i] : 0;
  }
  ByteSpan bytes_;
  size_t pos_ = 0;
};

// The payload bytes of each kind in one stream (container 1: one tensor).
CompactStreamSizes StreamParts(ByteSpan stream) {
  CompactStreamSizes s;
  LayoutReader in(stream);
  const uint8_t version = in.Byte(), mode = in.Byte();
  const uint64_t count = in.Varint();
  s.changed = count;
  if (mode == 1) {  // gaps block, values block (both versions)
    s.gap_bytes = in.Block();
    s.value_bytes = in.Block();
  } else if (version == 2) {
    int classes = 0;
    for (int c = 0; c < 16; ++c) classes += in.Varint() > 0;
    s.gap_bytes = in.Block();
    for (int c = 0; c < classes; ++c) s.diff_bytes += in.Block();
    s.escape_bytes = in.Block();
  } else {
    EXPECT_EQ(version, 3);
    const uint16_t bitmap = in.U16();
    for (int c = 0; c < 16; ++c) {
      if ((bitmap >> c) & 1) in.Varint();
    }
    const uint64_t pieces = (count + 65535) / 65536;
    std::vector<std::pair<uint64_t, uint64_t>> dir;
    for (uint64_t p = 0; p < pieces; ++p) {
      const uint64_t gap_len = in.Varint(), rans_len = in.Varint();
      dir.push_back({gap_len, rans_len});
    }
    for (auto [gap_len, rans_len] : dir) {
      s.gap_bytes += gap_len;
      s.diff_bytes += rans_len;
      in.Skip(gap_len + rans_len);
    }
    if (!in.AtEnd()) s.escape_bytes = in.Block();
  }
  EXPECT_TRUE(in.AtEnd()) << "bytes after the stream's last part";
  return s;
}

// bf16 "big" (300,000 elements, about N(0, 0.02)) and "small" (5,000), f32
// "f32" (1,000).
struct Model {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
};

Model MakeModel() {
  Model m;
  std::mt19937_64 rng(46);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (auto [name, dtype, n] : {std::tuple{"big", DType::kBF16, 300000}, std::tuple{"f32", DType::kF32, 1000},
                                std::tuple{"small", DType::kBF16, 5000}}) {
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * DTypeSize(dtype));
    for (int k = 0; k < n; ++k) {
      const float x = normal(rng);
      uint32_t f;
      std::memcpy(&f, &x, 4);
      if (dtype == DType::kBF16) {
        const uint16_t b = static_cast<uint16_t>(f >> 16);
        std::memcpy(bytes.data() + 2 * k, &b, 2);
      } else {
        std::memcpy(bytes.data() + 4 * k, &f, 4);
      }
    }
    m.storage.push_back(std::move(bytes));
    m.views.push_back({name, dtype, {static_cast<uint64_t>(n)}, {}});
  }
  for (size_t i = 0; i < m.views.size(); ++i) m.views[i].data = m.storage[i];
  return m;
}

// Every `stride`-th element changed: +-1 ULP mostly, a sign flip (an
// escape) every 7th change.
TensorChanges Changes(const TensorView& t, uint64_t stride) {
  TensorChanges c;
  c.name = t.name;
  c.dtype = t.dtype;
  const size_t width = DTypeSize(t.dtype);
  for (uint64_t i = 0, k = 0; i < t.num_elements(); i += stride, ++k) {
    c.indices.push_back(i);
    std::vector<uint8_t> v(t.data.begin() + i * width, t.data.begin() + (i + 1) * width);
    if (t.dtype == DType::kBF16) {
      uint16_t b;
      std::memcpy(&b, v.data(), 2);
      b = k % 7 == 6 ? static_cast<uint16_t>(b ^ 0x8000) : static_cast<uint16_t>(b + (k % 2 ? 1 : -1));
      std::memcpy(v.data(), &b, 2);
    } else {
      v[0] ^= 1;
    }
    c.values.insert(c.values.end(), v.begin(), v.end());
  }
  return c;
}

TEST(CompactInspect, EachStreamKindsBytesAreThoseItsLayoutHolds) {
  const Model m = MakeModel();
  Result<WeightState> state = WeightState::FromViews(m.views);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  const StateHash hash = HashState(*state, 1);
  // "big": 150,000 changes (three version-3 pieces); "small": 2,500; "f32": 200.
  const std::vector<TensorChanges> changes = {Changes(m.views[0], 2), Changes(m.views[1], 5), Changes(m.views[2], 2)};
  PatchInfo info;
  info.model_version = 2;
  info.base_version = 1;
  for (int version : {2, 3}) {
    SCOPED_TRACE("stream version " + std::to_string(version));
    Result<EncodedPatch> e = EncodeCompactDelta(info, hash, *state, changes, 1, version, /*container=*/1);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    const std::vector<uint8_t> bytes = Flatten(*e);
    Result<SafetensorsFile> f = ParseBytes(bytes, "inspect.safetensors");
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    Result<CompactStreamSizes> got = MeasureCompactDelta(*f);
    ASSERT_TRUE(got.ok()) << got.status().ToString();

    CompactStreamSizes want;
    uint64_t streams = 0;
    for (const TensorView& t : f->tensors()) {
      SCOPED_TRACE(t.name);
      const CompactStreamSizes s = StreamParts(t.data);
      ++streams;
      want.changed += s.changed;
      want.gap_bytes += s.gap_bytes;
      want.diff_bytes += s.diff_bytes;
      want.escape_bytes += s.escape_bytes;
      want.value_bytes += s.value_bytes;
    }
    ASSERT_EQ(streams, 3u);
    EXPECT_EQ(got->tensors, 3u);
    EXPECT_EQ(got->changed, 150000u + 200u + 2500u);
    EXPECT_EQ(got->changed, want.changed);
    EXPECT_EQ(got->gap_bytes, want.gap_bytes);
    EXPECT_EQ(got->diff_bytes, want.diff_bytes);
    EXPECT_EQ(got->escape_bytes, want.escape_bytes);
    EXPECT_EQ(got->value_bytes, want.value_bytes);
    EXPECT_EQ(got->header_bytes + got->gap_bytes + got->diff_bytes + got->escape_bytes + got->value_bytes,
              bytes.size());
    // Every kind is there: the test reads each part of the layout.
    EXPECT_GT(want.gap_bytes, 0u);
    EXPECT_GT(want.diff_bytes, 0u);
    EXPECT_GT(want.escape_bytes, 0u);
    EXPECT_GT(want.value_bytes, 0u);
  }
}

}  // namespace
}  // namespace deltasync
