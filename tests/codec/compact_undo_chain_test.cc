// The fused compact apply with one CompactUndo kept across a chain of
// versions (as a replica keeps it: its undo log reused without zero-filling,
// its class totals held), against the plain re-computation of every version:
// random deltas (raw-mode F32 and F16 tensors, a bf16 tensor large enough
// to be walked on every thread, tensors of one chunk, tensors and whole deltas
// without changes), on 1-3 threads and a few chunk sizes, with damaged
// deltas (some fail midway after values were written, some decode to other
// changes) and corrupted held totals injected between the good ones. Before
// every apply each slot of the log's four buffers is poisoned (a position 0
// and an old value no state holds), so a slot read that this apply did not
// write puts a wrong value back or hashes a wrong change. After every step:
// a good apply leaves the state bit for bit at the next version with the
// change's exact hash; a failed one leaves it bit for bit where it was; a
// damaged delta that applies reports the hash change of what it wrote; and
// Restore puts back the state the apply started from.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/compact_bf16.h"
#include "codec/compact_case_util.h"
#include "codec/patch_test_util.h"
#include "deltasync/compact.h"

namespace deltasync {
namespace {

using testing::ParseBytes;
using namespace testing_compact;

constexpr uint16_t kPoisonOld16 = 0x7FC1;  // a NaN no state of the chain holds
constexpr uint8_t kPoisonRaw = 0xEE;       // a raw-mode tensor's low byte no change writes

struct Version {
  WeightState state;
  StateHash hash;
};

struct Chain {
  std::vector<Version> versions;
  std::vector<std::vector<uint8_t>> deltas;  // delta v: version v -> v + 1
  uint64_t most_bf16 = 0, most_raw = 0;      // the largest delta's changes
};

// Sorted distinct indices of about p * n of [0, n), plus (sometimes) the
// last element and a run across a 1000/4096 chunk border.
std::vector<uint64_t> PickIndices(std::mt19937_64& rng, uint64_t n, double p) {
  std::vector<uint64_t> out;
  if (p == 0) return out;
  std::geometric_distribution<uint64_t> skip(p);
  for (uint64_t i = skip(rng); i < n; i += 1 + skip(rng)) out.push_back(i);
  if (rng() % 2 && n > 4200) {
    for (uint64_t i = 4000; i < 4200; ++i) out.push_back(i);
  }
  if (rng() % 2) out.push_back(n - 1);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Raw-mode changes of an F32 or F16 tensor: new random bits (never the
// old value, never the poison's).
TensorChanges RawChanges(const WeightState& s, const std::string& name, const std::vector<uint64_t>& indices,
                         std::mt19937_64& rng) {
  const WeightState::Tensor* t = s.Find(name);
  TensorChanges c{name, t->dtype, indices, {}};
  const size_t esize = DTypeSize(t->dtype);
  for (uint64_t i : indices) {
    uint8_t v[4];
    std::memcpy(v, t->data.data() + esize * i, esize);
    v[0] = static_cast<uint8_t>(v[0] + 1 + rng() % 200);
    if (v[0] == kPoisonRaw) ++v[0];
    c.values.insert(c.values.end(), v, v + esize);
  }
  return c;
}

// Version 0 and `steps` random deltas after it.
Chain MakeChain(uint64_t seed, int steps) {
  std::mt19937_64 rng(seed);
  std::vector<float> f(3000);
  for (float& x : f) x = static_cast<float>(rng() % 1000) / 8.0f;
  std::vector<uint8_t> fbytes(f.size() * 4);
  std::memcpy(fbytes.data(), f.data(), fbytes.size());
  auto bf16_bytes = [](const std::vector<uint16_t>& bits) {
    std::vector<uint8_t> b(bits.size() * 2);
    std::memcpy(b.data(), bits.data(), b.size());
    return b;
  };
  // "big": walked on every thread (2^20 + elements); "flat": nearly all of
  // one class; "one": of one chunk at every chunk size.
  const std::vector<uint8_t> big = bf16_bytes(Spread(rng, (1u << 20) + 3000));
  std::vector<uint16_t> flat_bits(9000, Bf16(0.01f));
  for (size_t i = 0; i < flat_bits.size(); i += 37) flat_bits[i] = Bf16(std::exp2(-12.0f));
  const std::vector<uint8_t> flat = bf16_bytes(flat_bits);
  const std::vector<uint8_t> one = bf16_bytes(Spread(rng, 600));
  std::vector<uint8_t> hbytes(2 * 1500);
  for (uint8_t& b : hbytes) b = static_cast<uint8_t>(rng() % 0xE0);
  const std::vector<TensorView> views = {{"a.f32", DType::kF32, {f.size()}, fbytes},
                                         {"a.f16", DType::kF16, {hbytes.size() / 2}, hbytes},
                                         {"big", DType::kBF16, {big.size() / 2}, big},
                                         {"flat", DType::kBF16, {flat.size() / 2}, flat},
                                         {"one", DType::kBF16, {one.size() / 2}, one}};
  Chain c;
  WeightState first = std::move(WeightState::FromViews(views)).value();
  const StateHash h = HashState(first, 1);
  c.versions.push_back({std::move(first), h});
  static constexpr double kDensity[] = {0, 0.0002, 0.003, 0.02, 0.3};
  for (int v = 0; v < steps; ++v) {
    const Version& at = c.versions.back();
    // Step 2 changes nothing at all; the others a random density per tensor.
    auto p = [&] { return v == 2 ? 0.0 : kDensity[rng() % std::size(kDensity)]; };
    std::vector<TensorChanges> changes;
    uint64_t bf16 = 0, raw = 0;
    for (const WeightState::Tensor& t : at.state.tensors()) {
      const std::vector<uint64_t> idx = PickIndices(rng, t.num_elements(), t.name == "big" ? p() / 4 : p());
      if (idx.empty()) continue;
      const bool is_raw = t.dtype != DType::kBF16;
      changes.push_back(is_raw ? RawChanges(at.state, t.name, idx, rng) : Change(at.state, t.name, idx, rng));
      (is_raw ? raw : bf16) += idx.size();
    }
    c.most_bf16 = std::max(c.most_bf16, bf16);
    c.most_raw = std::max(c.most_raw, raw);
    PatchInfo info;
    info.base_version = static_cast<uint64_t>(v);
    info.model_version = static_cast<uint64_t>(v) + 1;
    Result<EncodedPatch> e = EncodeCompactDelta(info, at.hash, at.state, changes, 1);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    c.deltas.push_back(e.ok() ? testing::Flatten(*e) : std::vector<uint8_t>{});
    WeightState next = Copy(at.state);
    ApplyChanges(next, changes, 1);
    const StateHash next_hash = HashState(next, 1);
    EXPECT_EQ(next_hash, at.hash + HashChanges(at.state, changes, 1));
    c.versions.push_back({std::move(next), next_hash});
  }
  return c;
}

// Every slot of the log's buffers, up to their capacity, poisoned; sizes 0.
void Poison(CompactUndo& u) {
  auto fill = [](auto& v, auto value) {
    v.resize(v.capacity());
    std::fill(v.begin(), v.end(), value);
    v.resize(0);
  };
  fill(u.pos32, uint32_t{0});
  fill(u.old16, kPoisonOld16);
  fill(u.pos64, uint64_t{0});
  fill(u.old_raw, kPoisonRaw);
}

// Some held count of some held state changed (a chunk's count moved to the
// next, so the sums still agree, or set at random).
void CorruptTotals(CompactUndo& u, std::mt19937_64& rng) {
  for (CompactClassTotals::State& s : u.totals.states) {
    if (!s.valid) continue;
    for (CompactClassTotals::Tensor& t : s.tensors) {
      if (t.chunks.size() < 2 || rng() % 2) continue;
      const size_t j = rng() % (t.chunks.size() - 1);
      const int cl = static_cast<int>(rng() % 16);
      if (rng() % 2) {
        const uint32_t d = std::min<uint32_t>(t.chunks[j][cl], 1 + static_cast<uint32_t>(rng() % 3));
        t.chunks[j][cl] -= d;
        t.chunks[j + 1][cl] += d;
      } else {
        t.chunks[j][cl] = static_cast<uint32_t>(rng() % 70000);
      }
    }
  }
}

// The log poisoned, then the apply; *reached: whether the bytes parsed as
// a safetensors file and the apply ran (else the undo still holds the last
// apply's log, which Restore would put back).
Result<CompactDelta> Apply(const std::vector<uint8_t>& bytes, WeightState& state, const StateHash& hash, int threads,
                           uint64_t chunk, CompactUndo& undo, bool* reached = nullptr) {
  if (reached) *reached = false;
  DS_ASSIGN_OR_RETURN(SafetensorsFile f, ParseBytes(bytes, "chain.safetensors"));
  if (reached) *reached = true;
  Poison(undo);
  return compact::ApplyCompactDeltaChunked(f, state, hash, threads, chunk, undo);
}

// A copy of `bytes` with 1-4 bits flipped in its payload (the streams), or
// cut short.
std::vector<uint8_t> Damaged(const std::vector<uint8_t>& bytes, std::mt19937_64& rng) {
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  const size_t payload = 8 + static_cast<size_t>(header);
  std::vector<uint8_t> out = bytes;
  if (out.size() <= payload + 1) return out;
  if (rng() % 5 == 0) {
    out.resize(payload + rng() % (out.size() - payload));
    return out;
  }
  for (int n = 1 + static_cast<int>(rng() % 4); n > 0; --n) {
    out[payload + rng() % (out.size() - payload)] ^= static_cast<uint8_t>(1u << (rng() % 8));
  }
  return out;
}

// How the chains' applies went (the injections reached every path).
struct Counts {
  uint64_t failed = 0, damaged_applied = 0, held = 0, stale = 0;
};

void RunChain(const Chain& c, uint64_t seed, int threads, uint64_t chunk, Counts& counts) {
  std::mt19937_64 rng(seed * 977 + static_cast<uint64_t>(threads) * 31 + chunk);
  CompactUndo undo;
  // Room for the largest delta: no apply of the chain reallocates the log,
  // so every slot it sizes holds the poison until written.
  undo.pos32.reserve(c.most_bf16 + 64);
  undo.old16.reserve(c.most_bf16 + 64);
  undo.pos64.reserve(c.most_raw + 64);
  undo.old_raw.reserve(4 * c.most_raw + 64);
  WeightState s = Copy(c.versions[0].state);
  for (size_t v = 0; v < c.deltas.size(); ++v) {
    SCOPED_TRACE("delta " + std::to_string(v));
    const Version& from = c.versions[v];
    const Version& to = c.versions[v + 1];
    // Damaged copies of this delta first (the state stays at v).
    for (int tries = rng() % 3 == 0 ? 1 + static_cast<int>(rng() % 2) : 0; tries > 0; --tries) {
      const std::vector<uint8_t> bad = Damaged(c.deltas[v], rng);
      bool reached = false;
      Result<CompactDelta> d = Apply(bad, s, from.hash, threads, chunk, undo, &reached);
      if (!d.ok()) {
        ASSERT_TRUE(SameBytes(s, from.state)) << d.status().ToString();
        if (!reached) continue;
        ++counts.failed;
        EXPECT_TRUE(undo.runs.empty());
        undo.Restore(threads);  // nothing left to put back
        ASSERT_TRUE(SameBytes(s, from.state)) << d.status().ToString();
        continue;
      }
      // Decoded to other changes: what it wrote hashes as it reported.
      ++counts.damaged_applied;
      EXPECT_EQ(from.hash + d->hash_delta, HashState(s, 1));
      undo.Restore(threads);
      ASSERT_TRUE(SameBytes(s, from.state));
    }
    if (rng() % 2 == 0) CorruptTotals(undo, rng);
    Result<CompactDelta> d = Apply(c.deltas[v], s, from.hash, threads, chunk, undo);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(from.hash + d->hash_delta, to.hash);
    ASSERT_TRUE(SameBytes(s, to.state));
    if (rng() % 4 == 0) {
      // Put back (the totals forgotten) and applied again.
      undo.Restore(threads);
      ASSERT_TRUE(SameBytes(s, from.state));
      d = Apply(c.deltas[v], s, from.hash, threads, chunk, undo);
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      EXPECT_EQ(from.hash + d->hash_delta, to.hash);
      ASSERT_TRUE(SameBytes(s, to.state));
    }
  }
  // The last apply's log still puts its base back.
  undo.Restore(threads);
  ASSERT_TRUE(SameBytes(s, c.versions[c.deltas.size() - 1].state));
  counts.held += undo.totals.held_applies;
  counts.stale += undo.totals.stale;
}

TEST(CompactUndoChain, RandomChainsWithDamagedDeltasAndStaleTotalsStayExact) {
  Counts counts;
  for (uint64_t seed : {1, 2}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Chain c = MakeChain(seed, 7);
    for (int threads : {1, 2, 3}) {
      for (uint64_t chunk : {uint64_t{1000}, uint64_t{4096}, compact::DecodeChunkElements()}) {
        SCOPED_TRACE("threads " + std::to_string(threads) + ", chunk " + std::to_string(chunk));
        RunChain(c, seed, threads, chunk, counts);
        if (HasFatalFailure()) return;
      }
    }
  }
  EXPECT_GT(counts.failed, 0u);
  EXPECT_GT(counts.damaged_applied, 0u);
  EXPECT_GT(counts.held, 0u);
  EXPECT_GT(counts.stale, 0u);
  std::printf("failed %llu, damaged applied %llu, held %llu, stale %llu\n",
              static_cast<unsigned long long>(counts.failed), static_cast<unsigned long long>(counts.damaged_applied),
              static_cast<unsigned long long>(counts.held), static_cast<unsigned long long>(counts.stale));
}

}  // namespace
}  // namespace deltasync
