// The compact decoder's per-change costs, one thread: ns per change of the
// Rice gap decode (straight into ranks), the rANS diff decode (the rest of
// the version-3 parse), the state-hash terms, and the whole decode / apply
// (which add the walk: class counts, masks, select). On `deltasync bench`'s
// generated bf16 model (tools/deltasync/bench_apply.h) and ±1-ULP changes
// at --rate. Figures, never pass/fail (docs/benchmarks.md, "The replica's
// compact apply").
//
//   compact_parse_bench [--scale 0.1] [--rate 0.03] [--reps 5]
// (the parts best of 10 x reps: they take milliseconds, and the machine may be shared)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/resource.h>
#include <string>
#include <vector>

#include "bench_apply.h"
#include "timing.h"
#include "bf16/simd_kernels.h"
#include "codec/compact_container.h"
#include "codec/compact_rice.h"
#include "codec/compact_v3.h"
#include "deltasync/compact.h"
#include "deltasync/safetensors.h"
#include "deltasync/state_hash.h"

namespace {

using namespace deltasync;
// Every part runs on the calling thread (the decodes on 1 thread too), timed
// in its CPU time: on a shared machine that leaves out others' time slices.
using cli::BestThreadSeconds;

void Check(const Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "compact_parse_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  double scale = 0.1, rate = 0.03;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--scale") scale = std::atof(argv[i + 1]);
    else if (a == "--rate") rate = std::atof(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
  }
  Result<WeightState> generated = cli::GenerateState(scale, 2);
  Check(generated.status());
  WeightState state = std::move(*generated);
  const std::vector<TensorChanges> changes = cli::GenerateChanges(state, rate, 7, 2);
  uint64_t changed = 0;
  for (const TensorChanges& c : changes) changed += c.count();
  const StateHash hash = HashState(state, 1);
  PatchInfo info;
  info.model_version = 2;
  info.base_version = 1;
  Result<EncodedPatch> patch = EncodeCompactDelta(info, hash, state, changes, 2);
  Check(patch.status());
  std::vector<uint8_t> bytes;
  for (ByteSpan part : patch->parts) bytes.insert(bytes.end(), part.begin(), part.end());
  const Blob blob = Blob::FromVector(std::move(bytes));
  Result<SafetensorsFile> file = SafetensorsFile::Parse(blob, "bench");
  Check(file.status());
  std::optional<compact::V3Tables> tables;
  Check(compact::ParseDeltaTables(*file, tables));

  // The version-3 parse of every stream (Rice gaps into ranks, then rANS).
  struct Stream {
    ByteSpan body;  // after version, mode, count
    uint64_t count = 0, elements = 0;
    const WeightState::Tensor* base = nullptr;
    compact::ParsedBf16 parsed;
  };
  std::vector<Stream> streams;
  // Both containers, through the decoder's own listing (container 2, the
  // default, holds every stream in one tensor).
  const std::vector<TensorView> base_views = state.views();
  Result<std::vector<compact::Stream>> listed = compact::ListStreams(*file, base_views);
  Check(listed.status());
  for (const compact::Stream& ls : *listed) {
    compact::Reader in(ls.stream.data);
    const std::optional<uint8_t> version = in.Byte(), mode = in.Byte();
    const std::optional<uint64_t> count = in.Varint();
    if (!version || *version != compact::kStreamVersion3 || !count) continue;
    const WeightState::Tensor* base = state.Find(base_views[ls.base].name);
    if (!base || base->dtype != DType::kBF16) continue;
    streams.push_back({ls.stream.data.subspan(in.position()), *count, base->num_elements(), base, {}});
  }
  if (streams.empty()) {
    std::fprintf(stderr, "compact_parse_bench: no version-3 bf16 stream found in the delta\n");
    return 1;
  }
  uint64_t parsed_changes = 0;
  const double parse_s = BestThreadSeconds(10 * reps, [&] {
    parsed_changes = 0;
    for (Stream& s : streams) {
      compact::Reader in(s.body);
      s.parsed.elements = s.elements;
      if (auto err = compact::ParseBf16StreamV3(in, s.count, &*tables, s.parsed)) {
        std::fprintf(stderr, "parse: %s\n", err->c_str());
        std::exit(1);
      }
      parsed_changes += s.count;
    }
  });

  // The same gaps Rice-coded alone (each class's part of each piece, as the
  // stream codes them), read into ranks: the Rice share of the parse.
  std::vector<std::vector<uint8_t>> rice;
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> rice_parts;  // (class begin, count)
  for (const Stream& s : streams) {
    compact::BitWriter w;
    std::vector<std::pair<uint64_t, uint64_t>> parts;
    for (uint64_t lo = 0; lo < s.count; lo += compact::kV3Piece) {
      const uint64_t hi = std::min(s.count, lo + compact::kV3Piece);
      for (int cl = 0; cl < compact::kClasses; ++cl) {
        const uint64_t a = std::max(lo, s.parsed.class_begin[cl]), b = std::min(hi, s.parsed.class_begin[cl + 1]);
        if (a >= b) continue;
        std::vector<uint64_t> gaps(b - a);
        for (uint64_t j = a; j < b; ++j) {
          const bool first = j == s.parsed.class_begin[cl];
          gaps[j - a] = s.parsed.ranks[j] - (first ? 0 : s.parsed.ranks[j - 1] + 1);
        }
        compact::VectorGaps source(gaps);
        compact::PutRiceGaps(w, gaps.size(), source);
        parts.push_back({a, b - a});
      }
    }
    rice.push_back(w.Finish());
    rice_parts.push_back(std::move(parts));
  }
  compact::RankBuffer ranks;
  const double rice_s = BestThreadSeconds(10 * reps, [&] {
    for (size_t i = 0; i < streams.size(); ++i) {
      compact::BitReader bits(rice[i]);
      ranks.Resize(streams[i].count, streams[i].elements);
      compact::GapRanks r;
      r.elements = streams[i].elements;
      for (const auto& [a, n] : rice_parts[i]) {
        if (ranks.Read(bits, a, n, r)) std::exit(1);
      }
    }
  });

  // The hash terms of every change as the walk sums them: HashTermDiffs16
  // over u16 new and old values (the output's values, the undo log's old
  // ones) in blocks of 32 (the walk's batches at 3%: a block of 1024
  // elements); and HashTermDiffs over 64-bit bits, as the walk did before.
  std::vector<uint64_t> index, new_bits, old_bits;
  std::vector<uint16_t> new16, old16;
  for (const TensorChanges& c : changes) {
    const WeightState::Tensor* t = state.Find(c.name);
    for (size_t k = 0; k < c.count(); ++k) {
      uint16_t o, v;
      std::memcpy(&o, t->data.data() + 2 * c.indices[k], 2);
      std::memcpy(&v, c.values.data() + 2 * k, 2);
      index.push_back(c.indices[k]);
      new_bits.push_back(v);
      old_bits.push_back(o);
      new16.push_back(v);
      old16.push_back(o);
    }
  }
  const uint64_t seeds[2] = {1, 2};
  uint64_t sums[2] = {0, 0};
  const double hash_s = BestThreadSeconds(10 * reps, [&] {
    for (size_t i = 0; i < index.size(); i += 32) {
      const size_t n = std::min<size_t>(32, index.size() - i);
      kernels::HashTermDiffs16(index.data() + i, reinterpret_cast<const uint8_t*>(new16.data() + i),
                               reinterpret_cast<const uint8_t*>(old16.data() + i), n, seeds, sums);
    }
  });
  const double hash64_s = BestThreadSeconds(10 * reps, [&] {
    for (size_t i = 0; i < index.size(); i += 32) {
      const size_t n = std::min<size_t>(32, index.size() - i);
      kernels::HashTermDiffs(index.data() + i, new_bits.data() + i, old_bits.data() + i, n, seeds, sums);
    }
  });

  // The walk's first pass alone: class counts per block of 1024 over every
  // bf16 tensor with changes, for the classes with changes (as the walk).
  std::vector<uint16_t> block_counts;
  std::vector<uint8_t> class_bytes;
  const double counts_s = BestThreadSeconds(reps, [&] {
    for (const Stream& s : streams) {
      uint32_t classes = 0;
      for (int cl = 0; cl < compact::kClasses; ++cl) {
        classes |= uint32_t{s.parsed.class_begin[cl + 1] > s.parsed.class_begin[cl]} << cl;
      }
      const auto* data = reinterpret_cast<const uint16_t*>(s.base->data.data());
      for (uint64_t at = 0; at < s.elements; at += compact::DecodeChunkElements()) {
        const uint64_t len = std::min<uint64_t>(compact::DecodeChunkElements(), s.elements - at);
        block_counts.resize((len + 1023) / 1024 * compact::kClasses);
        class_bytes.resize((len + 1023) / 1024 * 1024 + 64);
        uint8_t* const bytes = class_bytes.data() + (-reinterpret_cast<uintptr_t>(class_bytes.data()) & 63);
        kernels::ClassCountsBytes16(data + at, len, classes, block_counts.data(), bytes);
      }
    }
  });

  // Page faults per decode (the thread's minor faults over all reps /
  // reps): the fresh outputs' pages against the reused ones'.
  auto faults = [] {
    rusage u{};
    getrusage(RUSAGE_THREAD, &u);
    return static_cast<double>(u.ru_minflt);
  };
  double f0 = faults();
  const double decode_s = BestThreadSeconds(reps, [&] {
    Result<SafetensorsFile> f = SafetensorsFile::Parse(blob, "bench");
    Check(f.status());
    Check(DecodeCompactDelta(*f, state, hash, 1).status());
  });
  const double decode_faults = (faults() - f0) / reps;
  // The same into one CompactDelta reused across the decodes (as a replica
  // or a checker decoding version after version): no fresh output pages.
  const std::vector<TensorView> views = state.views();
  CompactDelta reused;
  f0 = faults();
  const double decode_reused_s = BestThreadSeconds(reps, [&] {
    Result<SafetensorsFile> f = SafetensorsFile::Parse(blob, "bench");
    Check(f.status());
    Check(DecodeCompactDelta(*f, views, hash, 1, reused));
  });
  const double decode_reused_faults = (faults() - f0) / reps;
  CompactUndo undo;
  const double apply_s = BestThreadSeconds(reps, [&] {
    Result<SafetensorsFile> f = SafetensorsFile::Parse(blob, "bench");
    Check(f.status());
    Check(ApplyCompactDelta(*f, state, hash, 1, undo).status());
    undo.Restore(1);
  });

  const double ns = 1e9 / static_cast<double>(changed);
  std::printf("scale %.2f: %.1fM bf16 elements, %.2fM changes (%.2f%%), %.3f B/change, target %s\n", scale,
              static_cast<double>(state.total_elements()) / 1e6, static_cast<double>(changed) / 1e6,
              100.0 * static_cast<double>(changed) / static_cast<double>(state.total_elements()),
              static_cast<double>(blob.size()) / static_cast<double>(changed), kernels::ActiveTargetName().c_str());
  std::printf("ns per change, 1 thread, thread CPU time, best of %d (parts) and %d (whole):\n", 10 * reps, reps);
  std::printf("  v3 parse (Rice + rANS)      %6.2f\n", parse_s * ns);
  std::printf("    Rice gaps into ranks      %6.2f\n", rice_s * ns);
  std::printf("    rANS diffs + rest         %6.2f\n", (parse_s - rice_s) * ns);
  std::printf("  hash terms (new - old), u16 %6.2f   (64-bit bits: %.2f)\n", hash_s * ns, hash64_s * ns);
  std::printf("  class counts (walk pass 1)  %6.2f   (%.2f GB/s of model)\n", counts_s * ns,
              static_cast<double>(state.total_bytes()) / counts_s / 1e9);
  std::printf("  whole decode (1 thread)     %6.2f   (%.2f GB/s of model)\n", decode_s * ns,
              static_cast<double>(state.total_bytes()) / decode_s / 1e9);
  std::printf("  whole decode, reused outputs %6.2f   (%.2f GB/s of model)\n", decode_reused_s * ns,
              static_cast<double>(state.total_bytes()) / decode_reused_s / 1e9);
  std::printf("  page faults per decode: %.0f fresh outputs, %.0f reused (the first of the reps included)\n",
              decode_faults, decode_reused_faults);
  std::printf("  whole apply incl. undo restore (1 thread) %6.2f\n", apply_s * ns);
  std::printf("(parsed %llu changes; hash %llx)\n", static_cast<unsigned long long>(parsed_changes),
              static_cast<unsigned long long>(sums[0] ^ sums[1]));
  return 0;
}
