// bench: the replica's whole compact apply and the size / change-rate sweep
// (bench_apply.h).
#include "bench_apply.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <thread>

#include "deltasync/blob.h"
#include "deltasync/compact.h"
#include "deltasync/manifest.h"
#include "deltasync/patch.h"
#include "deltasync/safetensors.h"
#include "deltasync/state_hash.h"
#include "synthetic_model.h"
#include "timing.h"

namespace deltasync::cli {
namespace {

// fn(i) for i in [0, n) on `threads` threads, handed out in order.
void ForEach(size_t n, int threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) fn(i);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& th : pool) th.join();
}

uint64_t Mix(uint64_t x) {
  x *= 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 32);
}

}  // namespace

MemcpyReference::MemcpyReference(uint64_t bytes, int threads) : src_(bytes, 1), dst_(bytes), threads_(threads) {
  Copy();  // fault the pages in
}

void MemcpyReference::Copy() {
  const uint64_t bytes = src_.size();
  const uint64_t per = (bytes + threads_ - 1) / threads_;
  ForEach(static_cast<size_t>(threads_), threads_, [&](size_t t) {
    const uint64_t b = std::min(bytes, per * t), e = std::min(bytes, b + per);
    std::memcpy(dst_.data() + b, src_.data() + b, e - b);
  });
}

double MemcpySeconds(uint64_t bytes, int threads, int reps) {
  MemcpyReference reference(bytes, threads);
  return BestSeconds(reps, [&] { reference.Copy(); });
}

Result<WeightState> GenerateState(double scale, int threads) {
  const int layers = std::max(1, static_cast<int>(std::lround(28 * scale)));
  const uint64_t vocab = std::max<uint64_t>(1024, static_cast<uint64_t>(std::llround(151936 * scale)));
  auto shapes = Qwen3Shapes(layers, vocab);
  std::vector<std::vector<uint8_t>> data(shapes.size());
  std::vector<uint64_t> first_key(shapes.size());
  uint64_t key = 0x5EED;
  for (size_t i = 0; i < shapes.size(); ++i) {
    uint64_t n = 1;
    for (uint64_t d : shapes[i].second) n *= d;
    first_key[i] = key;
    key += n;
    data[i].resize(2 * n);
  }
  ForEach(shapes.size(), threads, [&](size_t i) {
    const bool norm = shapes[i].second.size() == 1;
    uint16_t* out = reinterpret_cast<uint16_t*>(data[i].data());
    for (uint64_t k = 0; k < data[i].size() / 2; ++k) {
      const float w = norm ? 1.0f : 0.02f * SyntheticGauss(first_key[i] + k);
      uint32_t bits;
      std::memcpy(&bits, &w, 4);
      out[k] = Fp32ToBf16(bits);
    }
  });
  std::vector<TensorView> views;
  for (size_t i = 0; i < shapes.size(); ++i) views.push_back({shapes[i].first, DType::kBF16, shapes[i].second, data[i]});
  return WeightState::FromViews(views);
}

std::vector<TensorChanges> GenerateChanges(const WeightState& state, double rate, uint64_t seed, int threads) {
  const std::vector<WeightState::Tensor>& tensors = state.tensors();
  std::vector<TensorChanges> out(tensors.size());
  const uint64_t threshold = static_cast<uint64_t>(rate * 16777216.0);
  ForEach(tensors.size(), threads, [&](size_t i) {
    const WeightState::Tensor& t = tensors[i];
    TensorChanges& c = out[i];
    c.name = t.name;
    c.dtype = DType::kBF16;
    const uint64_t salt = Mix(seed * 0x100000001B3ull + i);
    for (uint64_t k = 0; k < t.num_elements(); ++k) {
      if ((Mix(salt ^ k) & 0xFFFFFF) >= threshold) continue;
      uint16_t v;
      std::memcpy(&v, t.data.data() + 2 * k, 2);
      v ^= 1;  // one ULP up or down; never non-finite from a finite value
      c.indices.push_back(k);
      c.values.push_back(static_cast<uint8_t>(v));
      c.values.push_back(static_cast<uint8_t>(v >> 8));
    }
  });
  std::erase_if(out, [](const TensorChanges& c) { return c.indices.empty(); });
  return out;
}

Result<CompactApplyFigures> MeasureCompactApply(WeightState& state, const std::vector<TensorChanges>& changes,
                                                int threads, int reps) {
  CompactApplyFigures f;
  f.model_bytes = state.total_bytes();
  for (const TensorChanges& c : changes) f.changed += c.count();
  const StateHash hash = HashState(state, threads);
  PatchInfo info;
  info.model_version = 2;
  info.base_version = 1;
  DS_ASSIGN_OR_RETURN(EncodedPatch patch, EncodeCompactDelta(info, hash, state, changes, threads));
  std::vector<uint8_t> bytes;
  for (ByteSpan part : patch.parts) bytes.insert(bytes.end(), part.begin(), part.end());
  f.delta_bytes = bytes.size();
  const std::string digest = Xxh3Hex(bytes);
  const Blob blob = Blob::FromVector(std::move(bytes));
  const StateHash want = hash + HashChanges(state, changes, threads);
  // The changes undone: each changed element's value in `state` now.
  std::vector<TensorChanges> undo = changes;
  for (TensorChanges& u : undo) {
    const WeightState::Tensor* t = state.Find(u.name);
    for (size_t k = 0; k < u.count(); ++k) std::memcpy(u.values.data() + 2 * k, t->data.data() + 2 * u.indices[k], 2);
  }

  Status failure;
  // Into outputs reused across the decodes (as the detect's figure reuses
  // its outputs: no fresh pages faulted in per decode).
  const std::vector<TensorView> views = state.views();
  CompactDelta decoded;
  auto decode = [&](int n) -> Status {
    DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(blob, "bench compact delta"));
    return DecodeCompactDelta(file, views, hash, n, decoded);
  };
  // As Replica::Update: the object's digest, parse, then the decode
  // straight into the held state (old values logged), the next state's
  // hash checked (a mismatch would put the old values back).
  CompactUndo compact_undo;
  f.apply_s = BestSeconds(
      reps,
      [&] {
        if (!failure.ok()) return;
        if (Xxh3Hex(blob.bytes()) != digest) return void(failure = Status::Internal("bench: digest mismatch"));
        Result<SafetensorsFile> file = SafetensorsFile::Parse(blob, "bench compact delta");
        if (!file.ok()) return void(failure = file.status());
        Result<CompactDelta> d = ApplyCompactDelta(*file, state, hash, threads, compact_undo);
        if (!d.ok()) return void(failure = d.status());
        if (hash + d->hash_delta != want) {  // as the replica: hashed while decoding
          compact_undo.Restore(threads);
          return void(failure = Status::Internal("bench: the applied state's hash differs"));
        }
      },
      [&] { ApplyChanges(state, undo, threads); });
  DS_RETURN_IF_ERROR(failure);
  // As a replica, the undo (and its held class totals) is kept across the
  // reps: every rep after the first starts its chunks from held totals.
  const uint64_t undo_bytes = 4 * compact_undo.pos32.size() + 2 * compact_undo.old16.size() +
                              8 * compact_undo.pos64.size() + compact_undo.old_raw.size();
  std::fprintf(stderr,
               "bench: compact apply: %llu of the reps from held class totals, %llu stale, %llu B held; undo log "
               "%llu B\n",
               static_cast<unsigned long long>(compact_undo.totals.held_applies),
               static_cast<unsigned long long>(compact_undo.totals.stale),
               static_cast<unsigned long long>(compact_undo.totals.HeldBytes()),
               static_cast<unsigned long long>(undo_bytes));
  f.decode_s = BestSeconds(reps, [&] {
    if (Status s = decode(threads); !s.ok() && failure.ok()) failure = s;
  });
  f.decode_1thread_s = BestSeconds(reps, [&] {
    if (Status s = decode(1); !s.ok() && failure.ok()) failure = s;
  });
  DS_RETURN_IF_ERROR(failure);
  DS_ASSIGN_OR_RETURN(f.floor, MeasureDecodeFloor(state, hash, blob, changes, undo, threads, reps));
  if (HashState(state, threads) != hash) return Status::Internal("bench: the state was not restored");
  return f;
}

Result<std::vector<CompactApplyFigures>> RunSweep(const SweepArgs& args) {
  std::vector<CompactApplyFigures> out;
  std::printf("| scale | model MB | changed | delta MB | B/changed | apply ms | apply GB/s | apply / memcpy | "
              "decode ms (%d thr) | decode GB/s/core (1 thr) | decode floor GB/s/core | apply floor / memcpy |\n",
              args.threads);
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (double scale : args.scales) {
    DS_ASSIGN_OR_RETURN(WeightState state, GenerateState(scale, args.threads));
    for (double rate : args.rates) {
      std::vector<TensorChanges> changes = GenerateChanges(state, rate, 7, args.threads);
      DS_ASSIGN_OR_RETURN(CompactApplyFigures f, MeasureCompactApply(state, changes, args.threads, args.reps));
      f.memcpy_s = MemcpySeconds(f.model_bytes, args.threads, args.reps);
      const double gb = static_cast<double>(f.model_bytes) / 1e9;
      std::printf("| %.2fx | %.0f | %.2f%% | %.2f | %.3f | %.1f | %.2f | %.2f | %.1f | %.2f | %.2f | %.2f |\n", scale,
                  f.model_bytes / 1e6, 100.0 * f.changed / (f.model_bytes / 2.0), f.delta_bytes / 1e6,
                  static_cast<double>(f.delta_bytes) / static_cast<double>(std::max<uint64_t>(1, f.changed)),
                  1e3 * f.apply_s, gb / f.apply_s, f.memcpy_s / f.apply_s, 1e3 * f.decode_s, gb / f.decode_1thread_s,
                  gb / f.floor.DecodeSeconds(), f.memcpy_s / f.floor.ApplySeconds());
      std::fflush(stdout);
      out.push_back(f);
    }
  }
  return out;
}

}  // namespace deltasync::cli
