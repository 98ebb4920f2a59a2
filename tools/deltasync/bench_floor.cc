// bench: the read floor of the trainer side (bench_floor.h).
#include "bench_floor.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "timing.h"

namespace deltasync::cli {

// XOR of every 8-byte word of [p, p + bytes) (and the tail's bytes), with
// four independent accumulators: a load-bound loop, far faster than memory
// on one core (two 8-byte loads a cycle), so the pass runs at the memory's
// speed as any SIMD read would.
uint64_t ReadFold(const uint8_t* p, size_t bytes) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    uint64_t w[4];
    std::memcpy(w, p + i, 32);
    a ^= w[0];
    b ^= w[1];
    c ^= w[2];
    d ^= w[3];
  }
  for (; i < bytes; ++i) a ^= p[i];
  return a ^ b ^ c ^ d;
}

namespace {

// Fold of fp32 masters and bf16 published elements side by side, 16
// elements a step (64 bytes of one, 32 of the other), as a detect reads them.
uint64_t Fold2(const uint8_t* m, const uint8_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    uint64_t w[8], v[4];
    std::memcpy(w, m + 4 * i, 64);
    std::memcpy(v, p + 2 * i, 32);
    a ^= w[0] ^ w[4] ^ v[0];
    b ^= w[1] ^ w[5] ^ v[1];
    c ^= w[2] ^ w[6] ^ v[2];
    d ^= w[3] ^ w[7] ^ v[3];
  }
  return a ^ b ^ c ^ d ^ ReadFold(m + 4 * i, 4 * (n - i)) ^ ReadFold(p + 2 * i, 2 * (n - i));
}

}  // namespace

double ReadFloorSeconds(std::span<const TensorView> masters, const WeightState& published, int threads, int reps) {
  struct Piece {
    const uint8_t* master;
    size_t master_bytes;
    const uint8_t* pub;
    size_t pub_bytes;
  };
  constexpr uint64_t kPiece = uint64_t{1} << 20;  // elements
  std::vector<Piece> pieces;
  for (const TensorView& m : masters) {
    const WeightState::Tensor* t = published.Find(m.name);
    const uint64_t n = m.num_elements();
    const size_t m_size = n > 0 ? m.data.size() / n : 0;
    const size_t p_size = t != nullptr && n > 0 ? t->data.size() / n : 0;
    for (uint64_t b = 0; b < n; b += kPiece) {
      const uint64_t e = std::min(n, b + kPiece);
      pieces.push_back({m.data.data() + b * m_size, (e - b) * m_size,
                        p_size > 0 ? t->data.data() + b * p_size : nullptr, (e - b) * p_size});
    }
  }
  std::atomic<uint64_t> sink{0};
  auto pass = [&] {
    std::atomic<size_t> next{0};
    auto work = [&] {
      uint64_t x = 0;
      for (size_t i; (i = next.fetch_add(1)) < pieces.size();) {
        const Piece& q = pieces[i];
        if (q.pub != nullptr && q.master_bytes == 2 * q.pub_bytes) {
          x ^= Fold2(q.master, q.pub, q.pub_bytes / 2);
        } else {
          x ^= ReadFold(q.master, q.master_bytes);
          if (q.pub != nullptr) x ^= ReadFold(q.pub, q.pub_bytes);
        }
      }
      sink.fetch_xor(x, std::memory_order_relaxed);
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (std::thread& th : pool) th.join();
  };
  pass();  // warm, as the memcpy baseline faults its pages in first
  const double s = BestSeconds(reps, pass);
  // The folded value is used, so no pass can be optimised away.
  if (sink.load() == 0x5EED5EED5EED5EEDull) std::fputs("", stderr);
  return s;
}

}  // namespace deltasync::cli
