// Shared pieces of the deltasync._native bindings: Status -> Python
// exception, array import (zero-copy TensorView over a CPU array), and
// read-only array export of deltasync-owned buffers.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "deltasync/status.h"
#include "deltasync/tensor.h"
#include "deltasync/weight_state.h"

namespace deltasync::py {

namespace nb = nanobind;

// Sets the deltasync._errors class for status.code() (message = the C++
// message) as the pending Python error and throws nb::python_error, which
// nanobind hands to Python unchanged. REQUIRES: !status.ok(), GIL held.
[[noreturn]] void Raise(const Status& status);

// Raise(Status(code, message)).
[[noreturn]] void Raise(ErrorCode code, std::string message);

inline void ThrowIfError(const Status& status) {
  if (!status.ok()) Raise(status);
}

// A tensor borrowed from Python: `array` keeps the Python object's memory
// alive (destroy it with the GIL held), `view` points into it.
struct BorrowedTensor {
  nb::ndarray<nb::ro> array;
  TensorView view;
};

// Imports `obj` (anything nanobind reads as an ndarray: numpy arrays through
// the buffer protocol, torch CPU tensors and others through DLPack) without
// copying. `dtype_name` overrides the element type ("BF16" for a uint16
// array that holds bf16 bits); empty = derive it from the array's dtype.
// Raises InvalidArgumentError naming the tensor for non-CPU, non-contiguous
// or unsupported arrays. REQUIRES: GIL held.
BorrowedTensor ImportTensor(const std::string& name, nb::handle obj, std::string_view dtype_name);

// The dlpack dtype that exports deltasync `dtype` to `framework` ("numpy"
// or "torch"): native types where the framework has them, else an unsigned
// integer of the same width (bf16 -> uint16 for numpy, whose Python layer
// views it as ml_dtypes.bfloat16).
nb::dlpack::dtype ExportDType(DType dtype, bool torch);

// A read-only array over `size` bytes of `dtype` at `data` with `shape`,
// which keeps `owner` alive; numpy or torch (via DLPack).
nb::object ExportTensor(const void* data, DType dtype, const std::vector<uint64_t>& shape, nb::handle owner,
                        bool torch);

// "numpy" -> false, "torch" -> true; anything else raises InvalidArgumentError.
bool ParseFramework(std::string_view framework);

// One tensor of a state, as ExportItems hands it out.
struct StateItem {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  const void* data;
};

// The tensors of `state`. REQUIRES: the mutex guarding `state` held (any GIL state).
std::vector<StateItem> StateItems(const WeightState& state);

// [(name, dtype name, read-only array)] over `items`; the arrays keep `owner`
// alive. REQUIRES: GIL held.
nb::list ExportItems(const std::vector<StateItem>& items, nb::handle owner, bool torch);

// [(name, dtype name, read-only array)] over `state`'s tensors, read under
// `mutex` without the GIL; the arrays keep `owner` alive (their memory is
// owned by the object behind it).
nb::list ExportState(std::mutex& mutex, const WeightState& state, nb::handle owner, std::string_view framework);

// Runs f() with the GIL released and `mutex` held (in that order, so a thread
// waiting for the mutex never blocks other Python threads). f must not touch
// Python objects.
template <typename F>
auto WithoutGil(std::mutex& mutex, F&& f) {
  nb::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(mutex);
  return f();
}

}  // namespace deltasync::py
