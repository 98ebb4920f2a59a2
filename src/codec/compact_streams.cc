#include "codec/compact_streams.h"

// ZSTD_compressSequences (literal-only frames) is in zstd's experimental API
// (>= 1.5.0); the frames it makes are standard and decode with the stable API.
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "deltasync/uninit_vector.h"

namespace deltasync::compact {
namespace {
struct CCtxFree { void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); } };
struct DCtxFree { void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); } };
}  // namespace

std::optional<uint64_t> Reader::Varint() {
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (pos_ >= bytes_.size()) return std::nullopt;
    const uint8_t b = bytes_[pos_++];
    if (shift == 63 && (b & 0x7E) != 0) return std::nullopt;  // past 64 bits
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if ((b & 0x80) == 0) {
      if (b == 0 && shift > 0) return std::nullopt;  // non-canonical
      return v;
    }
    if (shift == 63) return std::nullopt;
  }
  return std::nullopt;
}

void PutBlock(std::vector<uint8_t>& out, ByteSpan data, int level) {
  // zstd's output, per thread and reused call after call (never
  // zero-filled: zstd writes what it returns; holds the largest block's
  // bound): a fresh buffer per block faulted in its pages every call (an
  // anchor's chunks: docs/benchmarks.md, session 42).
  thread_local UninitVector<uint8_t> z;
  z.clear();
  if (data.size() >= 32 && level != kStoredOnly) {
    z.resize(ZSTD_compressBound(data.size()));
    static thread_local std::unique_ptr<ZSTD_CCtx, CCtxFree> cctx(ZSTD_createCCtx());
    size_t n;
    if (level == kLiteralsOnly) {
      // One sequence per 128 KiB block with no match: every block is
      // Huffman-coded literals, zstd's order-0 coder.
      std::vector<ZSTD_Sequence> seqs;
      for (size_t b = 0; b < data.size(); b += ZSTD_BLOCKSIZE_MAX) {
        seqs.push_back({0, static_cast<unsigned>(std::min<size_t>(ZSTD_BLOCKSIZE_MAX, data.size() - b)), 0, 0});
      }
      ZSTD_CCtx_reset(cctx.get(), ZSTD_reset_session_and_parameters);
      ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, 3);
      ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_blockDelimiters, ZSTD_sf_explicitBlockDelimiters);
      n = ZSTD_compressSequences(cctx.get(), z.data(), z.size(), seqs.data(), seqs.size(), data.data(), data.size());
      ZSTD_CCtx_reset(cctx.get(), ZSTD_reset_session_and_parameters);
    } else {
      n = ZSTD_compressCCtx(cctx.get(), z.data(), z.size(), data.data(), data.size(), level);
    }
    if (ZSTD_isError(n)) n = z.size() + 1;  // fall back to stored
    z.resize(std::min(n, z.size()));
    if (n > data.size()) z.clear();
  }
  const bool use_zstd = !z.empty() && z.size() < data.size();
  out.push_back(use_zstd ? kZstd : kStored);
  PutVarint(out, data.size());
  ByteSpan payload = use_zstd ? ByteSpan(z) : data;
  PutVarint(out, payload.size());
  out.insert(out.end(), payload.begin(), payload.end());
}

std::optional<std::string> PeekBlock(Reader& in, uint64_t expected_raw, BlockRef& out) {
  std::optional<uint8_t> method = in.Byte();
  if (!method) return "truncated block header";
  if (*method != kStored && *method != kZstd) return "unknown block method " + std::to_string(*method);
  std::optional<uint64_t> raw = in.Varint();
  std::optional<uint64_t> stored = raw ? in.Varint() : std::nullopt;
  if (!raw || !stored) return "truncated or malformed block lengths";
  if (*raw != expected_raw) {
    return "block holds " + std::to_string(*raw) + " bytes, expected " + std::to_string(expected_raw);
  }
  // zstd cannot expand more than 32768:1 (a 128 KiB RLE block per 4 bytes);
  // refusing more bounds what a forged header can make a decoder allocate.
  if (*method == kZstd && *raw / 65536 > *stored) return "zstd block claims an impossible ratio";
  if (*method == kStored && *stored != *raw) return "stored block of " + std::to_string(*stored) + " bytes for " + std::to_string(*raw);
  std::optional<ByteSpan> payload = in.Take(*stored);
  if (!payload) return "block of " + std::to_string(*stored) + " bytes runs past the end of the stream";
  out = {*method, *raw, *payload};
  return std::nullopt;
}

std::optional<std::string> DecodeBlock(const BlockRef& ref, uint8_t* dst) {
  if (ref.method == kStored) {
    if (ref.raw_len) std::memcpy(dst, ref.payload.data(), ref.raw_len);
    return std::nullopt;
  }
  static thread_local std::unique_ptr<ZSTD_DCtx, DCtxFree> dctx(ZSTD_createDCtx());
  const size_t n = ZSTD_decompressDCtx(dctx.get(), dst, ref.raw_len, ref.payload.data(), ref.payload.size());
  if (ZSTD_isError(n)) return std::string("zstd: ") + ZSTD_getErrorName(n);
  if (n != ref.raw_len) return "zstd block decompresses to " + std::to_string(n) + " bytes, expected " + std::to_string(ref.raw_len);
  return std::nullopt;
}

std::optional<std::string> GetBlock(Reader& in, std::optional<uint64_t> expected_raw, uint64_t max_raw,
                                    std::vector<uint8_t>& out) {
  // Read the raw length first to check it against max_raw before allocating.
  Reader probe = in;
  probe.Byte();
  std::optional<uint64_t> raw = probe.Varint();
  if (!raw) return "truncated or malformed block header";
  if (expected_raw ? *raw != *expected_raw : *raw > max_raw) {
    return "block declares " + std::to_string(*raw) + " bytes, allowed " +
           (expected_raw ? "exactly " + std::to_string(*expected_raw) : "at most " + std::to_string(max_raw));
  }
  BlockRef ref;
  if (auto err = PeekBlock(in, *raw, ref)) return err;
  out.resize(ref.raw_len);
  return DecodeBlock(ref, out.data());
}

}  // namespace deltasync::compact
