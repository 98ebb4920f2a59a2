// Codec figures (codec_stats.h).
#include "codec_stats.h"

#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "deltasync/compact.h"
#include "deltasync/patch.h"
#include "deltasync/state_hash.h"
#include "timing.h"

namespace deltasync::cli {
namespace {

std::vector<uint8_t> Flatten(const EncodedPatch& e) {
  std::vector<uint8_t> out;
  out.reserve(e.size);
  for (ByteSpan part : e.parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

// Total bits of an order-0 code for the histogram.
template <typename Map>
double EntropyBits(const Map& hist, uint64_t n) {
  double bits = 0;
  for (const auto& [sym, c] : hist) {
    if (c) bits -= static_cast<double>(c) * std::log2(static_cast<double>(c) / static_cast<double>(n));
  }
  return bits;
}

}  // namespace

DeltaEntropy MeasureDeltaEntropy(const WeightState& base, std::span<const TensorChanges> changes) {
  const std::vector<TensorView> views = base.views();
  return MeasureDeltaEntropy(std::span<const TensorView>(views), changes);
}

DeltaEntropy MeasureDeltaEntropy(std::span<const TensorView> base, std::span<const TensorChanges> changes) {
  std::unordered_map<std::string_view, const TensorView*> by_name;
  for (const TensorView& t : base) by_name.emplace(t.name, &t);
  DeltaEntropy f;
  for (const TensorChanges& c : changes) f.changed += c.count();
  double h0_bits = 0, gap_bits = 0, diff_bits = 0, flag_ctx_bits = 0, diff_ctx_bits = 0;
  for (const TensorChanges& c : changes) {
    auto found = by_name.find(c.name);
    if (found == by_name.end() || c.dtype != DType::kBF16) continue;
    const TensorView* t = found->second;
    std::unordered_map<uint64_t, uint64_t> gaps;
    std::unordered_map<int32_t, uint64_t> diffs;
    std::vector<uint64_t> flag(256, 0), exp_count(256, 0);
    std::map<std::pair<int, int32_t>, uint64_t> diff_ctx;
    uint64_t next = 0;
    const uint8_t* b = t->data.data();
    auto load = [](const uint8_t* p) {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    };
    for (uint64_t k = 0; k < t->num_elements(); ++k) exp_count[(load(b + 2 * k) >> 7) & 0xFF]++;
    for (size_t k = 0; k < c.count(); ++k) {
      const uint64_t i = c.indices[k];
      gaps[i - next]++;
      next = i + 1;
      const uint16_t old_bits = load(b + 2 * i), new_bits = load(c.values.data() + 2 * k);
      const int32_t d = static_cast<int32_t>(new_bits) - static_cast<int32_t>(old_bits);
      diffs[d]++;
      const int e = (old_bits >> 7) & 0xFF;
      flag[e]++;
      diff_ctx[{e, d}]++;
    }
    const double g = EntropyBits(gaps, c.count()), d = EntropyBits(diffs, c.count());
    gap_bits += g;
    diff_bits += d;
    h0_bits += g + d;
    for (int e = 0; e < 256; ++e) {
      const double n = static_cast<double>(exp_count[e]), y = static_cast<double>(flag[e]);
      if (y > 0 && y < n) flag_ctx_bits -= y * std::log2(y / n) + (n - y) * std::log2((n - y) / n);
    }
    for (const auto& [key, cnt] : diff_ctx) {
      diff_ctx_bits -= static_cast<double>(cnt) * std::log2(static_cast<double>(cnt) / static_cast<double>(flag[key.first]));
    }
  }
  const double cpc = static_cast<double>(f.changed);
  f.entropy = h0_bits / 8 / cpc;
  f.context_entropy = (flag_ctx_bits + diff_ctx_bits) / 8 / cpc;
  f.h0_gap = gap_bits / 8 / cpc;
  f.h0_diff = diff_bits / 8 / cpc;
  f.ctx_flag = flag_ctx_bits / 8 / cpc;
  f.ctx_diff = diff_ctx_bits / 8 / cpc;
  return f;
}

Result<DeltaFigures> MeasureDeltaCodecs(const WeightState& base, std::span<const TensorChanges> changes,
                                        uint64_t version, int reps) {
  DeltaFigures f;
  for (const TensorChanges& c : changes) f.changed += c.count();
  if (f.changed == 0) return Status::InvalidArgument("no changed elements to measure");
  const double cpc = static_cast<double>(f.changed);
  const double model_bytes = static_cast<double>(base.total_bytes());
  const DeltaEntropy h = MeasureDeltaEntropy(base, changes);
  f.entropy = h.entropy;
  f.context_entropy = h.context_entropy;
  f.h0_gap = h.h0_gap;
  f.h0_diff = h.h0_diff;
  f.ctx_flag = h.ctx_flag;
  f.ctx_diff = h.ctx_diff;

  PatchInfo info;
  info.model_version = version;
  info.base_version = version - 1;
  info.total_elements = base.total_elements();
  info.encoding = IndexEncoding::kGapDelta;
  DS_ASSIGN_OR_RETURN(EncodedPatch gap_patch, EncodeDelta(info, changes));
  std::vector<uint8_t> gap = Flatten(gap_patch);
  info.encoding = IndexEncoding::kRaw;
  DS_ASSIGN_OR_RETURN(EncodedPatch raw_patch, EncodeDelta(info, changes));
  std::vector<uint8_t> z(ZSTD_compressBound(gap.size()));
  const size_t gap_zstd = ZSTD_compress(z.data(), z.size(), gap.data(), gap.size(), 3);
  if (ZSTD_isError(gap_zstd)) return Status::Internal(std::string("zstd: ") + ZSTD_getErrorName(gap_zstd));
  f.raw = static_cast<double>(raw_patch.size) / cpc;
  f.gap_delta = static_cast<double>(gap.size()) / cpc;
  f.gap_delta_zstd = static_cast<double>(gap_zstd) / cpc;

  const StateHash base_hash = HashState(base);
  info.encoding = IndexEncoding::kCompact;
  // Each stream version: size and encode time (1 thread), then both
  // versions' decode times (1 thread and all threads) measured in turns,
  // v2 then v3 in every round, so that a machine whose speed drifts over
  // the minutes of a run (a shared host) moves both alike and their ratio
  // stays meaningful.
  Status failure;
  auto encode = [&](int version, CompactFigures& out) -> Result<SafetensorsFile> {
    std::vector<uint8_t> compact;
    const double enc1 = BestSeconds(reps, [&] {
      Result<EncodedPatch> e = EncodeCompactDelta(info, base_hash, base, changes, 1, version);
      if (!e.ok()) return void(failure = e.status());
      compact = Flatten(*e);
    });
    DS_RETURN_IF_ERROR(failure);
    out.bytes_per_changed = static_cast<double>(compact.size()) / cpc;
    out.encode_gbps_1t = model_bytes / enc1 / 1e9;
    DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(Blob::FromVector(std::move(compact)), "bench"));
    DS_ASSIGN_OR_RETURN(CompactStreamSizes sizes, MeasureCompactDelta(file));
    out.header = static_cast<double>(sizes.header_bytes) / cpc;
    out.gaps = static_cast<double>(sizes.gap_bytes) / cpc;
    out.diffs = static_cast<double>(sizes.diff_bytes) / cpc;
    out.escapes = static_cast<double>(sizes.escape_bytes + sizes.value_bytes) / cpc;
    return file;
  };
  DS_ASSIGN_OR_RETURN(SafetensorsFile v2_file, encode(2, f.v2));
  DS_ASSIGN_OR_RETURN(SafetensorsFile v3_file, encode(3, f.v3));
  const std::pair<const SafetensorsFile*, CompactFigures*> versions[] = {{&v2_file, &f.v2}, {&v3_file, &f.v3}};
  // Each version's decodes into outputs reused across them (as the detect's
  // figure reuses its outputs: no fresh pages faulted in per decode).
  const std::vector<TensorView> base_views = base.views();
  CompactDelta decoded[2];
  for (int threads : {1, 0}) {
    double best[2] = {1e30, 1e30};
    for (int r = 0; r < reps; ++r) {
      for (int k = 0; k < 2; ++k) {
        best[k] = std::min(best[k], Seconds([&] {
          if (Status s = DecodeCompactDelta(*versions[k].first, base_views, base_hash, threads, decoded[k]); !s.ok()) {
            failure = s;
          }
        }));
      }
    }
    DS_RETURN_IF_ERROR(failure);
    for (int k = 0; k < 2; ++k) {
      double& gbps = threads == 1 ? versions[k].second->decode_gbps_1t : versions[k].second->decode_gbps_all;
      gbps = model_bytes / best[k] / 1e9;
    }
  }
  const CompactFigures& d = f.v3;  // the default (kCompactStreamAuto) on a delta this size
  f.compact = d.bytes_per_changed;
  f.encode_gbps_1t = d.encode_gbps_1t;
  f.decode_gbps_1t = d.decode_gbps_1t;
  f.decode_gbps_all = d.decode_gbps_all;
  return f;
}

Result<AnchorFigures> MeasureAnchorCodec(const WeightState& state, uint64_t version, int reps) {
  AnchorFigures f;
  std::vector<TensorView> views = state.views();
  std::map<int, uint64_t> exponents;
  uint64_t nbf16 = 0;
  for (const TensorView& t : views) {
    if (t.dtype != DType::kBF16) continue;
    for (uint64_t k = 0; k < t.num_elements(); ++k) {
      uint16_t v;
      std::memcpy(&v, t.data.data() + 2 * k, 2);
      exponents[(v >> 7) & 0xFF]++;
    }
    nbf16 += t.num_elements();
  }
  if (nbf16 == 0) return Status::InvalidArgument("no bf16 tensors to measure");
  f.exponent_entropy_bits = EntropyBits(exponents, nbf16) / static_cast<double>(nbf16);
  f.ceiling = 16.0 / (8.0 + f.exponent_entropy_bits);
  const double model_bytes = static_cast<double>(state.total_bytes());
  Status failure;
  std::vector<uint8_t> anchor;
  const double enc = BestSeconds(1, [&] {
    Result<EncodedPatch> e = EncodeCompressedAnchor(version, views, 0);
    if (!e.ok()) return void(failure = e.status());
    anchor = Flatten(*e);
  });
  DS_RETURN_IF_ERROR(failure);
  f.ratio = model_bytes / static_cast<double>(anchor.size());
  f.encode_gbps = model_bytes / enc / 1e9;
  DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Parse(Blob::FromVector(std::move(anchor)), "anchor"));
  const double dec1 = BestSeconds(reps, [&] {
    Result<DecodedAnchor> a = DecodeCompressedAnchor(file, 1);
    if (!a.ok()) failure = a.status();
  });
  DS_RETURN_IF_ERROR(failure);
  f.decode_gbps_1t = model_bytes / dec1 / 1e9;
  DS_ASSIGN_OR_RETURN(DecodedAnchor check, DecodeCompressedAnchor(file, 0));
  f.exact = check.tensors.size() == state.tensors().size();
  for (size_t i = 0; f.exact && i < check.tensors.size(); ++i) f.exact = check.tensors[i].data == state.tensors()[i].data;
  return f;
}

}  // namespace deltasync::cli
