// The compact decoder's per-block select alone, A/B in one process: the
// select and apply kernels the walk used before session 26
// (kernels::ClassSelect16, ClassApply16) against the ones it uses now
// (ClassPlace16, ClassPlaceApply16; src/bf16/class_place_kernels.cc), on
// the same blocks, masks and streams, alternated, best of --reps each, in
// thread CPU time (ns per change). The masks are built once beforehand
// (kernels::ClassMasksOfBytes16), so only the select is timed; the blocks
// stay in the caches (--blocks 256: 512 KiB of base). Values ~N(0, 0.02)
// as bf16, one in 64 set to 1.0, +-1..3 ULP changes at --rate. Figures,
// never pass/fail.
//
//   class_place_bench [--rate 0.03] [--blocks 256] [--reps 200]
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bf16/simd_kernels.h"
#include "codec/compact_bf16.h"
#include "timing.h"

namespace {

using namespace deltasync;
constexpr size_t kBlock = 1024, kWords = 16;

}  // namespace

int main(int argc, char** argv) {
  double rate = 0.03;
  size_t blocks = 256;
  int reps = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rate") rate = std::atof(argv[i + 1]);
    else if (a == "--blocks") blocks = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
  }
  const size_t n = blocks * kBlock;
  std::mt19937_64 rng(26);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint16_t> base(n);
  for (size_t i = 0; i < n; ++i) {
    const float f = i % 64 == 5 ? 1.0f : normal(rng);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    base[i] = static_cast<uint16_t>(b >> 16);
  }
  // The changes, class by class (ranks among the class's elements).
  std::array<std::vector<uint64_t>, 16> ranks_of;
  std::array<std::vector<uint8_t>, 16> diffs_of;
  std::array<uint64_t, 16> seen{};
  std::uniform_real_distribution<double> u(0, 1);
  std::uniform_int_distribution<int> step(1, 3);
  for (size_t i = 0; i < n; ++i) {
    const int c = compact::ClassOf(base[i]);
    if (u(rng) < rate) {
      const uint16_t v = static_cast<uint16_t>(base[i] + (u(rng) < 0.5 ? step(rng) : -step(rng)));
      ranks_of[c].push_back(seen[c]);
      diffs_of[c].push_back(compact::DiffByte(base[i], v));
    }
    ++seen[c];
  }
  std::vector<uint64_t> ranks;
  std::vector<uint8_t> diffs, escapes;
  std::array<uint64_t, 16> begin{}, end{};
  uint32_t classes = 0;
  for (int c = 0; c < 16; ++c) {
    begin[c] = ranks.size();
    ranks.insert(ranks.end(), ranks_of[c].begin(), ranks_of[c].end());
    diffs.insert(diffs.end(), diffs_of[c].begin(), diffs_of[c].end());
    end[c] = ranks.size();
    if (end[c] > begin[c]) classes |= 1u << c;
  }
  for (uint8_t d : diffs) {
    if (d == compact::kEscape) {
      std::fprintf(stderr, "class_place_bench: unexpected escape\n");
      return 1;
    }
  }
  const uint64_t changes = ranks.size();
  // Per block the masks of every class with changes (as the walk's
  // worst case: it builds only the classes with a change in the block).
  const int k = __builtin_popcount(classes);
  std::vector<uint64_t> masks(blocks * 16 * kWords);
  std::vector<uint32_t> before(blocks * 16 * (kWords + 1));
  {
    alignas(64) static uint8_t bytes[kBlock];
    uint16_t counts[16];
    for (size_t b = 0; b < blocks; ++b) {
      kernels::ClassCountsBytes16(base.data() + b * kBlock, kBlock, classes, counts, bytes);
      kernels::ClassMasksOfBytes16(bytes, kBlock, classes, masks.data() + b * 16 * kWords,
                                   before.data() + b * 16 * (kWords + 1));
    }
  }
  const kernels::ClassWalkStreams streams{ranks.data(), end.data(), diffs.data(), escapes.data()};
  auto start = [&] {
    kernels::ClassWalkCursor cur{};
    for (int c = 0; c < 16; ++c) {
      cur.g[c] = begin[c];
      cur.e[c] = 0;
      cur.rem[c] = begin[c] < end[c] ? ranks[begin[c]] : ~uint64_t{0};
    }
    return cur;
  };
  uint64_t hits[kWords];
  std::vector<uint16_t> values(kBlock);
  std::vector<uint64_t> undo_pos(kBlock);
  std::vector<uint16_t> undo_old(kBlock), h_new(kBlock);
  std::vector<uint16_t> work = base;
  uint64_t sink = 0;
  auto select = [&](bool fresh) {
    kernels::ClassWalkCursor cur = start();
    for (size_t b = 0; b < blocks; ++b) {
      const uint64_t* m = masks.data() + b * 16 * kWords;
      const uint32_t* p = before.data() + b * 16 * (kWords + 1);
      sink += fresh ? kernels::ClassPlace16(m, p, classes, base.data() + b * kBlock, kBlock, streams, cur, hits,
                                            values.data())
                    : kernels::ClassSelect16(m, p, classes, base.data() + b * kBlock, kBlock, streams, cur, hits,
                                             values.data());
      sink += hits[3];
    }
  };
  // The apply writes into `work`; the same values every time (each rep
  // starts from the base: the copy is outside the timed part's share,
  // identical for both).
  auto apply = [&](bool fresh) {
    kernels::ClassWalkCursor cur = start();
    for (size_t b = 0; b < blocks; ++b) {
      const uint64_t* m = masks.data() + b * 16 * kWords;
      const uint32_t* p = before.data() + b * 16 * (kWords + 1);
      const kernels::ClassApplyOut out{b * kBlock, undo_pos.data(), undo_old.data(), h_new.data()};
      size_t placed = 0;
      sink += fresh ? kernels::ClassPlaceApply16(m, p, classes, work.data() + b * kBlock, kBlock, streams, cur, out,
                                                 &placed)
                    : kernels::ClassApply16(m, p, classes, work.data() + b * kBlock, kBlock, streams, cur, out,
                                            &placed);
      sink += placed;
      // Put the block back (each change read its own base value).
      for (size_t h = 0; h < placed; ++h) work[undo_pos[h]] = undo_old[h];
    }
  };
  double best[4] = {1e30, 1e30, 1e30, 1e30};
  for (int r = 0; r < reps; ++r) {
    best[0] = std::min(best[0], cli::BestThreadSeconds(1, [&] { select(false); }));
    best[1] = std::min(best[1], cli::BestThreadSeconds(1, [&] { select(true); }));
    best[2] = std::min(best[2], cli::BestThreadSeconds(1, [&] { apply(false); }));
    best[3] = std::min(best[3], cli::BestThreadSeconds(1, [&] { apply(true); }));
  }
  const double ns = 1e9 / static_cast<double>(changes);
  std::printf("class_place_bench, target %s: %zu blocks, %llu changes (%.2f%%), %d classes, best of %d, alternated\n",
              kernels::ActiveTargetName().c_str(), blocks, static_cast<unsigned long long>(changes),
              100.0 * static_cast<double>(changes) / static_cast<double>(n), k, reps);
  std::printf("  select: ClassSelect16 %6.2f  ClassPlace16      %6.2f ns/change  (%.3fx)\n", best[0] * ns,
              best[1] * ns, best[0] / best[1]);
  std::printf("  apply:  ClassApply16  %6.2f  ClassPlaceApply16 %6.2f ns/change  (%.3fx; incl. putting back)\n",
              best[2] * ns, best[3] * ns, best[2] / best[3]);
  return sink == 42 ? 2 : 0;
}
