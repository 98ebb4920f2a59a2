// deltasync._native.gather_elements / scatter_elements: copying changed
// elements by flat index, off the GIL and on several threads. The node
// follower of deltasync.vllm (python/deltasync/_shm.py, _vllm_layout.py)
// copies the changed indices and values of a version out of the --shm region
// (gather) and writes them into the engine's plain parameters (scatter);
// torch's index_select / index_copy_ cost about 6 and 5 ns per element on the
// one thread vLLM gives a CPU worker, these about 1 ns (bench/vllm_pause_bench.py).
//
// Both check every index before writing anything: an out-of-range index (a
// change list read while the region's writer moved on, say) raises
// IndexError and leaves the output untouched.
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "common/thread_start.h"

namespace deltasync::py {
namespace {

using Array = nb::ndarray<nb::device::cpu, nb::c_contig>;
using ReadOnly = nb::ndarray<nb::ro, nb::device::cpu, nb::c_contig>;
using Indices = nb::ndarray<nb::ro, nb::device::cpu, nb::c_contig, nb::ndim<1>>;

template <typename A>
size_t ItemBytes(const A& a, const char* what) {
  const size_t bytes = (a.dtype().bits + 7) / 8;
  if (bytes != 1 && bytes != 2 && bytes != 4 && bytes != 8) {
    Raise(ErrorCode::kInvalidArgument, std::string(what) + ": elements of " + std::to_string(bytes) + " bytes");
  }
  return bytes;
}

// Runs body(begin, end) over [0, n) on up to `threads` threads (0: every
// core), in chunks of at least 256Ki elements. A chunk whose thread the system
// refuses to start runs on the caller's thread (common/thread_start.h).
template <typename Body>
void Split(size_t n, int threads, Body body) {
  size_t t = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
  t = std::max<size_t>(1, std::min(t, n / (256 * 1024)));
  if (t == 1) {
    body(size_t{0}, n);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(t);
  const size_t step = (n + t - 1) / t;
  for (size_t b = 0; b < n; b += step) {
    const size_t e = std::min(n, b + step);
    if (!TryStartThread(workers, [&body, b, e] { body(b, e); })) body(b, e);
  }
  for (std::thread& w : workers) w.join();
}

// The indices as unsigned 64-bit values (int64 and uint64 arrays hold the
// same bits for the valid, non-negative range; a negative int64 reads as a
// huge uint64 and fails the range check).
const uint64_t* IndexData(const Indices& idx, const char* what) {
  if (idx.dtype() != nb::dtype<int64_t>() && idx.dtype() != nb::dtype<uint64_t>()) {
    Raise(ErrorCode::kInvalidArgument, std::string(what) + ": indices must be int64 or uint64");
  }
  return static_cast<const uint64_t*>(idx.data());
}

[[noreturn]] void RaiseIndex(const std::string& message) {
  PyErr_SetString(PyExc_IndexError, message.c_str());
  throw nb::python_error();
}

// The first index >= `limit` in idx[0, n), or n (checked on the threads).
size_t FirstOutOfRange(const uint64_t* idx, size_t n, uint64_t limit, int threads) {
  std::vector<size_t> bad;
  std::mutex mu;
  Split(n, threads, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) {
      if (idx[i] >= limit) {
        std::lock_guard<std::mutex> lock(mu);
        bad.push_back(i);
        return;
      }
    }
  });
  return bad.empty() ? n : *std::min_element(bad.begin(), bad.end());
}

template <size_t kBytes>
void GatherAs(const uint8_t* src, const uint64_t* idx, uint8_t* out, size_t n, int threads) {
  Split(n, threads, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) std::memcpy(out + i * kBytes, src + idx[i] * kBytes, kBytes);
  });
}

// dst[map(idx[i])] = vals[i], map(j) = j - offset when `k` == `cols`; else
// j - offset = r * cols + c, written to r * k + (c - c0) when c0 <= c < c0 + k.
template <size_t kBytes>
void ScatterAs(uint8_t* dst, const uint64_t* idx, const uint8_t* vals, size_t n, uint64_t offset, uint64_t cols,
               uint64_t c0, uint64_t k, int threads) {
  Split(n, threads, [&](size_t b, size_t e) {
    if (k == cols) {
      for (size_t i = b; i < e; ++i) std::memcpy(dst + (idx[i] - offset) * kBytes, vals + i * kBytes, kBytes);
      return;
    }
    for (size_t i = b; i < e; ++i) {
      const uint64_t j = idx[i] - offset, r = j / cols, c = j % cols;
      if (c >= c0 && c < c0 + k) std::memcpy(dst + (r * k + c - c0) * kBytes, vals + i * kBytes, kBytes);
    }
  });
}

// REQUIRES: bytes is 1, 2, 4 or 8 (ItemBytes checked it).
template <template <size_t> class Op, typename... Args>
void BySize(size_t bytes, Args... args) {
  switch (bytes) {
    case 1: return Op<1>::Run(args...);
    case 2: return Op<2>::Run(args...);
    case 4: return Op<4>::Run(args...);
    default: return Op<8>::Run(args...);
  }
}
template <size_t B>
struct Gather {
  static void Run(const uint8_t* s, const uint64_t* i, uint8_t* o, size_t n, int t) { GatherAs<B>(s, i, o, n, t); }
};
template <size_t B>
struct Scatter {
  static void Run(uint8_t* d, const uint64_t* i, const uint8_t* v, size_t n, uint64_t off, uint64_t cols, uint64_t c0,
                  uint64_t k, int t) {
    ScatterAs<B>(d, i, v, n, off, cols, c0, k, t);
  }
};

}  // namespace

void BindElements(nb::module_& m) {
  using namespace nb::literals;
  // out[i] = src.flat[idx[i]]. src and out: C-contiguous CPU arrays of the
  // same element size (any dtype; numpy or torch); idx: int64/uint64.
  m.def(
      "gather_elements",
      [](ReadOnly src, Indices idx, Array out, int threads) {
        const size_t bytes = ItemBytes(src, "gather_elements"), n = idx.shape(0);
        if (ItemBytes(out, "gather_elements") != bytes || out.size() != n) {
          Raise(ErrorCode::kInvalidArgument, "gather_elements: out must hold " + std::to_string(n) +
                                                 " elements of " + std::to_string(bytes) + " bytes");
        }
        const uint64_t* ix = IndexData(idx, "gather_elements");
        const auto* s = static_cast<const uint8_t*>(src.data());
        auto* o = static_cast<uint8_t*>(out.data());
        const uint64_t limit = src.size();
        size_t bad;
        {
          nb::gil_scoped_release release;
          bad = FirstOutOfRange(ix, n, limit, threads);
          if (bad == n) BySize<Gather>(bytes, s, ix, o, n, threads);
        }
        if (bad != n) {
          RaiseIndex("gather_elements: index " + std::to_string(ix[bad]) + " at position " + std::to_string(bad) +
                     " is outside the " + std::to_string(limit) + " elements");
        }
      },
      // noconvert: nanobind would otherwise hand a non-contiguous `out` over
      // as a contiguous temporary copy, fill that and drop it (TypeError now).
      "src"_a, "idx"_a, "out"_a.noconvert(), "threads"_a = 0);
  // dst.flat[idx[i] - offset] = vals[i]; with k < cols, only the columns
  // [c0, c0 + k) of a row-major source of `cols` columns, into a destination
  // of k columns (a row-parallel shard). Every target is checked against
  // dst's size before anything is written.
  m.def(
      "scatter_elements",
      [](Array dst, Indices idx, ReadOnly vals, uint64_t offset, uint64_t cols, uint64_t c0, uint64_t k, int threads) {
        const size_t bytes = ItemBytes(dst, "scatter_elements"), n = idx.shape(0);
        if (ItemBytes(vals, "scatter_elements") != bytes || vals.size() != n) {
          Raise(ErrorCode::kInvalidArgument, "scatter_elements: vals must hold " + std::to_string(n) +
                                                 " elements of " + std::to_string(bytes) + " bytes");
        }
        if (cols == 0 || k == 0 || c0 + k > cols) {
          Raise(ErrorCode::kInvalidArgument, "scatter_elements: columns [c0, c0 + k) must lie in [0, cols)");
        }
        const uint64_t* ix = IndexData(idx, "scatter_elements");
        const uint64_t limit = dst.size();
        // Ascending indices: the range check is the first and the last (a
        // shard of k < cols columns: the last row's end).
        bool sorted = true;
        for (size_t i = 1; i < n && sorted; ++i) sorted = ix[i - 1] < ix[i];
        const bool in_range = n == 0 || (ix[0] >= offset && (k == cols ? ix[n - 1] - offset < limit
                                                                          : (ix[n - 1] - offset) / cols * k + k <= limit));
        if (!sorted || !in_range) {
          RaiseIndex("scatter_elements: the indices are not ascending or fall outside the destination's " +
                     std::to_string(limit) + " elements");
        }
        {
          nb::gil_scoped_release release;
          BySize<Scatter>(bytes, static_cast<uint8_t*>(dst.data()), ix,
                          static_cast<const uint8_t*>(vals.data()), n, offset, cols, c0, k, threads);
        }
      },
      "dst"_a.noconvert(), "idx"_a, "vals"_a, "offset"_a = 0, "cols"_a = 1, "c0"_a = 0, "k"_a = 1, "threads"_a = 0);
}

}  // namespace deltasync::py
