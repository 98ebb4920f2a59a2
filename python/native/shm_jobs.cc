// deltasync._native.shm_take_jobs / shm_scatter_jobs: the node follower's
// pause (python/deltasync/_shm_plan.py). A worker's plan lists "jobs": one per
// checkpoint tensor of the --shm region (docs/shm.md) whose plain parameter
// it writes, with the part of the tensor this rank holds (a flat range of
// rows, optionally only the columns [c0, c0 + k) of each row: a row-parallel
// shard) and where that part starts in the parameter.
//
// shm_take_jobs copies, inside the caller's seqlock bracket, the changed
// elements of those parts out of the region into the caller's reused
// buffers: each index already mapped to its place in the parameter (u32)
// and its value. It reads the entries' change lists itself, checks every
// list against the change-list area and every index (strictly ascending,
// inside the tensor), and reports what it found as a code instead of raising:
// values read while the writer moved on are garbage, and only the caller's
// second look at the sequence counter tells a torn read (retry) from a
// corrupt region. shm_scatter_jobs then writes the buffers into the
// parameters. Both release the GIL and run on `threads` threads.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "common/thread_start.h"

namespace deltasync::py {
namespace {

using Bytes = nb::ndarray<nb::ro, uint8_t, nb::device::cpu, nb::c_contig, nb::ndim<1>>;
using Jobs = nb::ndarray<nb::ro, int64_t, nb::device::cpu, nb::c_contig, nb::ndim<2>>;
using Out64 = nb::ndarray<int64_t, nb::device::cpu, nb::c_contig, nb::ndim<2>>;
using OutIdx = nb::ndarray<uint32_t, nb::device::cpu, nb::c_contig, nb::ndim<1>>;
using ReadIdx = nb::ndarray<nb::ro, uint32_t, nb::device::cpu, nb::c_contig, nb::ndim<1>>;
using OutBytes = nb::ndarray<uint8_t, nb::device::cpu, nb::c_contig, nb::ndim<1>>;

// Columns of a take job (int64 each).
enum TakeCol {
  kEntry,      // byte offset of the tensor's table entry
  kData,       // byte offset of its data
  kItem,       // element size: 1, 2, 4 or 8
  kNumel,      // elements of the whole tensor
  kLo,         // flat range of this rank's rows: [lo, hi)
  kHi,
  kCols,       // columns of a row; kK < kCols: only columns [kC0, kC0 + kK)
  kC0,
  kK,
  kDstBase,    // where element lo goes in the parameter (elements)
  kDstLimit,   // the parameter's elements (< 2^32)
  kTakeCols
};
// Columns of the per-job result: elements taken, first slot in the index
// buffer, first byte in the value buffer.
enum ResultCol { kCount, kSlot, kValByte, kResultCols };

// Codes of shm_take_jobs (the job at fault in `bad_job`).
constexpr int kOk = 0, kBadList = 1, kBadIndex = 2, kTooSmall = 3;

constexpr uint64_t kChunk = 1 << 16;  // elements per work item of a row range

size_t Threads(int threads) {
  return threads > 0 ? static_cast<size_t>(threads) : std::max(1u, std::thread::hardware_concurrency());
}

// Runs items 0..n-1 (item(i)) on up to `threads` threads pulling from one
// counter; on fewer when the system refuses to start more (common/thread_start.h).
template <typename Item>
void Pull(size_t n, size_t threads, Item item) {
  threads = std::min(threads, n);
  std::atomic<size_t> next{0};
  auto run = [&] {
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) item(i);
  };
  if (threads <= 1) return run();
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (size_t t = 1; t < threads && TryStartThread(pool, run); ++t) {
  }
  run();
  for (std::thread& t : pool) t.join();
}

template <typename T>
T Load(const uint8_t* base, uint64_t off) {
  T v;
  std::memcpy(&v, base + off, sizeof(T));
  return v;
}

struct Item {
  size_t job;
  uint64_t begin, end;  // positions in the job's change list
};

// One chunk of a take job: positions [begin, end) of its list `idx` go to
// slots from `slot` (compacted when only some columns are kept). Returns the
// elements written, or -1 for an index out of order or range.
template <size_t kBytes>
int64_t TakeChunk(const int64_t* job, const uint64_t* idx, uint64_t begin, uint64_t end, const uint8_t* data,
                  uint32_t* out_idx, uint8_t* out_val) {
  const uint64_t numel = job[kNumel], lo = job[kLo], hi = job[kHi], cols = job[kCols], c0 = job[kC0], k = job[kK];
  const uint64_t base = job[kDstBase], limit = job[kDstLimit];
  uint64_t prev = begin > 0 ? idx[begin - 1] : 0;
  bool first = begin == 0;
  int64_t n = 0;
  for (uint64_t i = begin; i < end; ++i) {
    const uint64_t j = idx[i];
    if (j >= numel || j < lo || j >= hi || (!first && j <= prev)) return -1;
    first = false;
    prev = j;
    uint64_t local = j - lo;
    if (k != cols) {
      const uint64_t c = local % cols;
      if (c < c0 || c >= c0 + k) continue;
      local = local / cols * k + (c - c0);
    }
    local += base;
    if (local >= limit) return -1;
    out_idx[n] = static_cast<uint32_t>(local);
    std::memcpy(out_val + n * kBytes, data + j * kBytes, kBytes);
    ++n;
  }
  return n;
}

int64_t TakeChunkAs(size_t bytes, const int64_t* job, const uint64_t* idx, uint64_t b, uint64_t e,
                    const uint8_t* data, uint32_t* oi, uint8_t* ov) {
  switch (bytes) {
    case 1: return TakeChunk<1>(job, idx, b, e, data, oi, ov);
    case 2: return TakeChunk<2>(job, idx, b, e, data, oi, ov);
    case 4: return TakeChunk<4>(job, idx, b, e, data, oi, ov);
    default: return TakeChunk<8>(job, idx, b, e, data, oi, ov);
  }
}

template <size_t kBytes>
void ScatterRun(uint8_t* dst, const uint32_t* idx, const uint8_t* vals, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) std::memcpy(dst + uint64_t{idx[i]} * kBytes, vals + i * kBytes, kBytes);
}

}  // namespace

void BindShmJobs(nb::module_& m) {
  using namespace nb::literals;
  // Returns (code, bad_job, slots_needed, value_bytes_needed); fills
  // result[j] = (count, slot, value byte) per job when code is 0.
  m.def(
      "shm_take_jobs",
      [](Bytes region, uint64_t changes_lo, uint64_t changes_hi, Jobs jobs, OutIdx out_idx, OutBytes out_val,
         Out64 result, int threads) {
        const size_t n_jobs = jobs.shape(0);
        if ((n_jobs && jobs.shape(1) != kTakeCols) || result.shape(0) != n_jobs || result.shape(1) != kResultCols) {
          Raise(ErrorCode::kInvalidArgument, "shm_take_jobs: jobs must be [n, 11] and result [n, 3]");
        }
        const uint8_t* r = region.data();
        const uint64_t size = region.shape(0);
        const int64_t* J = jobs.data();
        int64_t* R = result.data();
        for (size_t j = 0; j < n_jobs; ++j) {  // the plan's own fields: checked once, loudly
          const int64_t* job = J + j * kTakeCols;
          const int64_t item = job[kItem];
          if ((item != 1 && item != 2 && item != 4 && item != 8) || job[kEntry] < 0 ||
              uint64_t(job[kEntry]) + 56 > size || job[kData] < 0 || job[kNumel] < 0 ||
              uint64_t(job[kData]) + uint64_t(job[kNumel]) * item > size || job[kLo] < 0 || job[kHi] < job[kLo] ||
              job[kHi] > job[kNumel] || job[kCols] <= 0 || job[kK] <= 0 || job[kC0] < 0 ||
              job[kC0] + job[kK] > job[kCols] || job[kDstBase] < 0 || job[kDstLimit] < 0 ||
              job[kDstLimit] > (int64_t{1} << 32)) {
            Raise(ErrorCode::kInvalidArgument, "shm_take_jobs: job " + std::to_string(j) + " is malformed");
          }
        }
        int code = kOk;
        int64_t bad = -1;
        uint64_t slots = 0, val_bytes = 0;
        {
          nb::gil_scoped_release release;
          // Each job's part of its list: [a, b) by binary search (the list is
          // checked ascending below; a torn list gives a wrong range, never a
          // read outside the area).
          std::vector<uint64_t> a(n_jobs), b(n_jobs);
          std::vector<Item> items;
          for (size_t j = 0; j < n_jobs && code == kOk; ++j) {
            const int64_t* job = J + j * kTakeCols;
            const uint64_t off = Load<uint64_t>(r, job[kEntry] + 40), cnt = Load<uint64_t>(r, job[kEntry] + 48);
            if (off % 8 || off / 8 < changes_lo || off / 8 > changes_hi || cnt > changes_hi - off / 8) {
              code = kBadList, bad = j;
              break;
            }
            const auto* idx = reinterpret_cast<const uint64_t*>(r + off);
            a[j] = std::lower_bound(idx, idx + cnt, uint64_t(job[kLo])) - idx;
            b[j] = std::lower_bound(idx + a[j], idx + cnt, uint64_t(job[kHi])) - idx;
            R[j * kResultCols + kSlot] = slots;
            R[j * kResultCols + kValByte] = val_bytes;
            R[j * kResultCols + kCount] = 0;
            slots += b[j] - a[j];
            val_bytes += ((b[j] - a[j]) * job[kItem] + 7) / 8 * 8;
            if (job[kK] != job[kCols]) {  // compacted: one item, one thread
              if (b[j] > a[j]) items.push_back({j, a[j], b[j]});
            } else {
              for (uint64_t s = a[j]; s < b[j]; s += kChunk) items.push_back({j, s, std::min(b[j], s + kChunk)});
            }
          }
          if (code == kOk && (slots > out_idx.shape(0) || val_bytes > out_val.shape(0))) code = kTooSmall;
          if (code == kOk) {
            std::sort(items.begin(), items.end(), [](const Item& x, const Item& y) {  // the longest first
              return x.end - x.begin > y.end - y.begin;
            });
            std::atomic<int64_t> first_bad{-1};
            std::vector<std::atomic<int64_t>> counts(n_jobs);
            for (auto& c : counts) c.store(0, std::memory_order_relaxed);
            uint32_t* oi = out_idx.data();
            uint8_t* ov = out_val.data();
            Pull(items.size(), Threads(threads), [&](size_t i) {
              const Item& it = items[i];
              const int64_t* job = J + it.job * kTakeCols;
              const uint64_t off = Load<uint64_t>(r, job[kEntry] + 40);
              const auto* idx = reinterpret_cast<const uint64_t*>(r + off);
              const uint64_t slot = R[it.job * kResultCols + kSlot] + (it.begin - a[it.job]);
              const int64_t got = TakeChunkAs(job[kItem], job, idx, it.begin, it.end, r + job[kData], oi + slot,
                                              ov + R[it.job * kResultCols + kValByte] +
                                                  (it.begin - a[it.job]) * job[kItem]);
              if (got < 0) {
                int64_t none = -1;
                first_bad.compare_exchange_strong(none, int64_t(it.job));
              } else {
                counts[it.job].fetch_add(got, std::memory_order_relaxed);
              }
            });
            if (first_bad.load() >= 0) {
              code = kBadIndex, bad = first_bad.load();
            } else {
              for (size_t j = 0; j < n_jobs; ++j) {
                R[j * kResultCols + kCount] = counts[j].load(std::memory_order_relaxed);
                // an uncompacted job's chunks filled its slots without gaps
                if (J[j * kTakeCols + kK] == J[j * kTakeCols + kCols] && uint64_t(R[j * kResultCols + kCount]) !=
                                                                             b[j] - a[j]) {
                  code = kBadIndex, bad = j;
                }
              }
            }
          }
        }
        return nb::make_tuple(code, bad, slots, val_bytes);
      },
      // The outputs noconvert: nanobind would otherwise fill a converted
      // temporary copy of one of another dtype or order (TypeError now).
      "region"_a, "changes_lo"_a, "changes_hi"_a, "jobs"_a, "out_idx"_a.noconvert(), "out_val"_a.noconvert(),
      "result"_a.noconvert(), "threads"_a = 0);

  // dst_ptr[idx[slot + i]] = vals[val_byte + i * item] for each scatter job
  // (dst_ptr, dst_limit, item, count, slot, val_byte): the buffers of a
  // successful shm_take_jobs, whose indices are ascending and below
  // dst_limit (the first and last are checked again here).
  m.def(
      "shm_scatter_jobs",
      [](Jobs jobs, ReadIdx idx, Bytes vals, int threads) {
        const size_t n_jobs = jobs.shape(0);
        if (n_jobs && jobs.shape(1) != 6) Raise(ErrorCode::kInvalidArgument, "shm_scatter_jobs: jobs must be [n, 6]");
        const int64_t* J = jobs.data();
        for (size_t j = 0; j < n_jobs; ++j) {
          const int64_t* job = J + j * 6;
          const int64_t item = job[2], count = job[3], slot = job[4], vb = job[5];
          const bool ok = job[0] != 0 && (item == 1 || item == 2 || item == 4 || item == 8) && count >= 0 &&
                          slot >= 0 && uint64_t(slot + count) <= idx.shape(0) && vb >= 0 &&
                          uint64_t(vb + count * item) <= vals.shape(0) &&
                          (count == 0 || (idx.data()[slot] < uint64_t(job[1]) &&
                                          idx.data()[slot + count - 1] < uint64_t(job[1]) &&
                                          idx.data()[slot] <= idx.data()[slot + count - 1]));
          if (!ok) {
            PyErr_SetString(PyExc_IndexError,
                            ("shm_scatter_jobs: job " + std::to_string(j) + " falls outside its buffers or "
                             "its destination; nothing was written").c_str());
            throw nb::python_error();
          }
        }
        std::vector<Item> items;
        for (size_t j = 0; j < n_jobs; ++j) {
          const uint64_t count = J[j * 6 + 3];
          for (uint64_t s = 0; s < count; s += kChunk) items.push_back({j, s, std::min(count, s + kChunk)});
        }
        const uint32_t* ix = idx.data();
        const uint8_t* v = vals.data();
        nb::gil_scoped_release release;
        Pull(items.size(), Threads(threads), [&](size_t i) {
          const Item& it = items[i];
          const int64_t* job = J + it.job * 6;
          auto* dst = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(job[0]));
          const uint32_t* ji = ix + job[4] + it.begin;
          const uint8_t* jv = v + job[5] + it.begin * job[2];
          const uint64_t n = it.end - it.begin;
          switch (job[2]) {
            case 1: return ScatterRun<1>(dst, ji, jv, n);
            case 2: return ScatterRun<2>(dst, ji, jv, n);
            case 4: return ScatterRun<4>(dst, ji, jv, n);
            default: return ScatterRun<8>(dst, ji, jv, n);
          }
        });
      },
      "jobs"_a, "idx"_a, "vals"_a, "threads"_a = 0);
}

}  // namespace deltasync::py
