// Parted publishing in tests: FSDP2-style layouts, a part's blocks of a
// model, and every rank of a sharded trainer in one process.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <memory>
#include <vector>

#include "deltasync/part_publisher.h"
#include "deltasync/parts.h"
#include "deltasync/publisher.h"
#include "deltasync/store.h"
#include "deltasync/weight_state.h"
#include "testing/random_model.h"

namespace deltasync::testing {

// A part receipt as a rank hands it over: a delta and an anchor, and (with
// `with_error`) a failure. The part_receipt fuzz seeds are written from it.
inline PartReceipt SampleReceipt(bool with_error = false) {
  PartReceipt r;
  r.version = 12;
  r.part = 1;
  r.parts = 4;
  r.layout = "5f0c6a3b9d2e4f718a0b1c2d3e4f5a6b";
  r.base_version = 11;
  r.state_hash = StateHash{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  r.changed_elements = 4096;
  r.objects.push_back({PatchKind::kDelta, "deltas/step_000012.part1of4.safetensors", 12345,
                       "00112233445566778899aabbccddeeff", 11});
  r.objects.push_back({PatchKind::kAnchor, "anchors/step_000012.part1of4.safetensors", 987654,
                       "ffeeddccbbaa99887766554433221100", 0});
  if (with_error) r.error = "rank 1: disk full";
  return r;
}

// FSDP2-style: each tensor split along `dim` (0, or 1 for matrices when
// dim is 1) into `parts` chunks of ceil(n / parts), the last ones smaller
// or absent.
inline PartLayout SplitLayout(const std::vector<TensorView>& tensors, size_t parts, size_t dim) {
  std::vector<TensorView> sorted = tensors;
  std::sort(sorted.begin(), sorted.end(), [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  PartLayout l;
  l.parts.resize(parts);
  for (uint32_t t = 0; t < sorted.size(); ++t) {
    const TensorView& v = sorted[t];
    l.tensors.push_back({v.name, v.dtype, v.shape});
    const size_t d = v.shape.size() > dim ? dim : 0;
    const uint64_t n = v.shape[d], chunk = (n + parts - 1) / parts;
    for (size_t p = 0; p < parts; ++p) {
      const uint64_t begin = std::min(n, p * chunk), end = std::min(n, begin + chunk);
      if (begin == end) continue;
      Block b{t, std::vector<uint64_t>(v.shape.size(), 0), v.shape};
      b.offset[d] = begin;
      b.shape[d] = end - begin;
      l.parts[p].push_back(std::move(b));
    }
  }
  return l;
}

// Part p's blocks of the model's current tensors (owned copies).
struct PartBlocks {
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorView> views;
};
inline PartBlocks BlocksOf(const PartLayout& l, size_t p, const std::vector<TensorView>& model) {
  PartBlocks out;
  out.bytes.reserve(l.parts[p].size());
  for (const Block& b : l.parts[p]) {
    const TensorDesc& d = l.tensors[b.tensor];
    const TensorView* full = nullptr;
    for (const TensorView& v : model) {
      if (v.name == d.name) full = &v;
    }
    const BlockGeometry g = l.Geometry(b);
    auto& bytes = out.bytes.emplace_back(g.elements() * DTypeSize(full->dtype));
    CopyBlockOut(g, DTypeSize(full->dtype), full->data.data(), bytes.data());
    out.views.push_back(TensorView{d.name, full->dtype, b.shape, bytes});
  }
  return out;
}

// Every rank of a sharded trainer, in one process: one PartPublisher per
// part and the committer.
class Ranks {
 public:
  // `part_stores` (when given): part p opens its PartPublisher on part_stores[p].
  Ranks(std::shared_ptr<Store> store, PartLayout layout, PublisherOptions options,
        const std::vector<std::shared_ptr<Store>>& part_stores = {})
      : layout_(layout) {
    for (uint32_t p = 0; p < layout.parts.size(); ++p) {
      auto pub = PartPublisher::Open(part_stores.empty() ? store : part_stores[p], layout, p, options);
      EXPECT_TRUE(pub.ok()) << pub.status().ToString();
      if (pub.ok()) pubs_.push_back(std::move(*pub));
    }
    auto c = PartCommitter::Open(store, layout, options);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (c.ok()) committer_ = std::move(*c);
  }

  // Every part publishes, the committer commits, every part learns the
  // outcome. `fail`: that part's publish fails (its blocks are withheld).
  Result<PublishStats> Publish(uint64_t version, const std::vector<TensorView>& model, int fail = -1) {
    std::vector<PartReceipt> receipts;
    for (size_t p = 0; p < pubs_.size(); ++p) {
      PartBlocks blocks = BlocksOf(layout_, p, model);
      if (static_cast<int>(p) == fail) blocks.views.pop_back();
      Result<PartReceipt> r = pubs_[p]->Publish(version, blocks.views);
      PartReceipt receipt;
      if (r.ok()) {
        receipt = *r;
      } else {
        receipt.part = static_cast<uint32_t>(p);
        receipt.error = r.status().ToString();
      }
      // Through the wire form, as ranks exchange them.
      auto parsed = PartReceipt::Parse(receipt.Serialize());
      EXPECT_TRUE(parsed.ok());
      EXPECT_EQ(*parsed, receipt);
      receipts.push_back(*parsed);
    }
    Result<PublishStats> stats = committer_->Commit(version, receipts);
    for (auto& pub : pubs_) pub->Finish(stats.ok(), committer_->manifest_token());
    return stats;
  }

  PartPublisher& part(size_t p) { return *pubs_[p]; }

 private:
  PartLayout layout_;
  std::vector<std::unique_ptr<PartPublisher>> pubs_;
  std::unique_ptr<PartCommitter> committer_;
};

// Versions first..last of `model` through `ranks`, the model stepping
// `rate` of its elements before each version after the first one.
inline ::testing::AssertionResult PublishVersions(Ranks& ranks, RandomModel& model, uint64_t first, uint64_t last,
                                                  double rate) {
  for (uint64_t v = first; v <= last; ++v) {
    if (v > 1) model.Step(rate);
    Result<PublishStats> stats = ranks.Publish(v, model.Views());
    if (!stats.ok()) return ::testing::AssertionFailure() << "version " << v << ": " << stats.status().ToString();
  }
  return ::testing::AssertionSuccess();
}

// Overwrites the last byte of the object `key` of the bucket directory `dir`.
inline void DamageLastByte(const std::string& dir, const std::string& key) {
  std::fstream f(std::filesystem::path(dir) / key, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-1, std::ios::end);
  f.put('\x5a');
}

inline void ExpectSameState(const WeightState& a, const WeightState& b) {
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    EXPECT_EQ(a.tensors()[i].name, b.tensors()[i].name);
    EXPECT_EQ(a.tensors()[i].shape, b.tensors()[i].shape);
    EXPECT_TRUE(a.tensors()[i].data == b.tensors()[i].data) << a.tensors()[i].name;
  }
}

}  // namespace deltasync::testing
