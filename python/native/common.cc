#include "common.h"

#include <nanobind/stl/string.h>

#include <optional>

namespace deltasync::py {

namespace {

using nb::dlpack::dtype_code;

// The class in deltasync._errors for `code` (looked up on every raise, so the
// Python module is the one definition of the hierarchy).
nb::object ErrorClass(ErrorCode code) {
  const char* name = "InternalError";
  switch (code) {
    case ErrorCode::kOk: name = "InternalError"; break;
    case ErrorCode::kInvalidArgument: name = "InvalidArgumentError"; break;
    case ErrorCode::kNotFound: name = "NotFoundError"; break;
    case ErrorCode::kCorruption: name = "CorruptionError"; break;
    case ErrorCode::kIntegrity: name = "IntegrityError"; break;
    case ErrorCode::kIOError: name = "StoreIOError"; break;
    case ErrorCode::kUnsupported: name = "UnsupportedError"; break;
    case ErrorCode::kConflict: name = "ConflictError"; break;
    case ErrorCode::kFailedPrecondition: name = "FailedPreconditionError"; break;
    case ErrorCode::kInternal: name = "InternalError"; break;
  }
  return nb::module_::import_("deltasync._errors").attr(name);
}

std::optional<DType> FromDlpack(nb::dlpack::dtype dt) {
  if (dt.lanes != 1) return std::nullopt;
  switch (static_cast<dtype_code>(dt.code)) {
    case dtype_code::Float:
      if (dt.bits == 16) return DType::kF16;
      if (dt.bits == 32) return DType::kF32;
      if (dt.bits == 64) return DType::kF64;
      break;
    case dtype_code::Bfloat:
      if (dt.bits == 16) return DType::kBF16;
      break;
    case dtype_code::Int:
      if (dt.bits == 8) return DType::kI8;
      if (dt.bits == 16) return DType::kI16;
      if (dt.bits == 32) return DType::kI32;
      if (dt.bits == 64) return DType::kI64;
      break;
    case dtype_code::UInt:
      if (dt.bits == 8) return DType::kU8;
      if (dt.bits == 16) return DType::kU16;
      if (dt.bits == 32) return DType::kU32;
      if (dt.bits == 64) return DType::kU64;
      break;
    case dtype_code::Bool:
      if (dt.bits == 8) return DType::kBool;
      break;
    case dtype_code::Float8_E4M3FN:
      if (dt.bits == 8) return DType::kF8_E4M3;
      break;
    case dtype_code::Float8_E5M2:
      if (dt.bits == 8) return DType::kF8_E5M2;
      break;
    default:
      break;
  }
  return std::nullopt;
}

std::string DlpackName(nb::dlpack::dtype dt) {
  return "dlpack dtype (code " + std::to_string(dt.code) + ", " + std::to_string(dt.bits) + " bits, " +
         std::to_string(dt.lanes) + " lanes)";
}

const char* DeviceName(int device_type) {
  switch (device_type) {
    case 1: return "cpu";
    case 2: return "cuda";
    case 3: return "cuda-pinned host";
    case 4: return "opencl";
    case 7: return "vulkan";
    case 8: return "metal";
    case 10: return "rocm";
    case 13: return "cuda-managed";
    case 14: return "oneapi";
    default: return "a non-CPU device";
  }
}

}  // namespace

void Raise(const Status& status) {
  nb::object cls = ErrorClass(status.code());
  PyErr_SetObject(cls.ptr(), nb::str(status.message().c_str(), status.message().size()).ptr());
  throw nb::python_error();
}

void Raise(ErrorCode code, std::string message) { Raise(Status(code, std::move(message))); }

BorrowedTensor ImportTensor(const std::string& name, nb::handle obj, std::string_view dtype_name) {
  BorrowedTensor out;
  if (!nb::try_cast(obj, out.array, /*convert=*/false) || !out.array.is_valid()) {
    std::string type = nb::type_name(obj.type()).c_str();
    Raise(ErrorCode::kInvalidArgument,
          "tensor '" + name + "': cannot read a " + type +
              " as an array (expected a numpy array, or a CPU tensor that supports DLPack)");
  }
  const nb::ndarray<nb::ro>& a = out.array;
  // DLPack's kDLCUDAHost (pinned host memory) is CPU-addressable.
  if (a.device_type() != nb::device::cpu::value && a.device_type() != nb::device::cuda_host::value) {
    Raise(ErrorCode::kInvalidArgument,
          "tensor '" + name + "' is on " + DeviceName(a.device_type()) + ":" + std::to_string(a.device_id()) +
              "; Publisher.publish reads CPU memory (for CUDA tensors use deltasync.torch)");
  }
  std::optional<DType> dtype;
  if (!dtype_name.empty()) {
    dtype = ParseDType(dtype_name);
    if (!dtype) Raise(ErrorCode::kInvalidArgument, "tensor '" + name + "': unknown dtype " + std::string(dtype_name));
    if (DTypeSize(*dtype) * 8 != a.dtype().bits || a.dtype().lanes != 1) {
      Raise(ErrorCode::kInvalidArgument, "tensor '" + name + "': an array of " + DlpackName(a.dtype()) +
                                             " cannot hold " + std::string(dtype_name) + " elements");
    }
  } else {
    dtype = FromDlpack(a.dtype());
    if (!dtype) {
      Raise(ErrorCode::kInvalidArgument, "tensor '" + name + "': unsupported element type " + DlpackName(a.dtype()));
    }
  }
  // Row-major contiguous: every dimension longer than 1 has the stride the
  // dimensions after it imply (strides are in elements).
  std::vector<uint64_t> shape(a.ndim());
  uint64_t elements = 1;
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = a.shape(i);
    elements *= shape[i];
  }
  if (elements != 0 && a.stride_ptr() != nullptr) {
    int64_t expected = 1;
    for (size_t i = a.ndim(); i-- > 0;) {
      if (shape[i] != 1 && a.stride(i) != expected) {
        std::string strides;
        for (size_t j = 0; j < a.ndim(); ++j) strides += (j ? ", " : "") + std::to_string(a.stride(j));
        Raise(ErrorCode::kInvalidArgument,
              "tensor '" + name + "' is not contiguous (shape " + ShapeToString(shape) + ", strides [" + strides +
                  "] elements); pass a contiguous array (numpy.ascontiguousarray, torch.Tensor.contiguous)");
      }
      expected *= static_cast<int64_t>(shape[i]);
    }
  }
  const uint8_t* data = static_cast<const uint8_t*>(static_cast<const void*>(a.data()));
  out.view = TensorView{name, *dtype, std::move(shape), ByteSpan(data, elements * DTypeSize(*dtype))};
  return out;
}

nb::dlpack::dtype ExportDType(DType dtype, bool torch) {
  nb::dlpack::dtype dt{};
  dt.lanes = 1;
  dt.bits = static_cast<uint8_t>(DTypeSize(dtype) * 8);
  auto code = dtype_code::UInt;
  switch (dtype) {
    case DType::kBool: code = dtype_code::Bool; break;
    case DType::kU8: case DType::kU16: case DType::kU32: case DType::kU64: code = dtype_code::UInt; break;
    case DType::kI8: case DType::kI16: case DType::kI32: case DType::kI64: code = dtype_code::Int; break;
    case DType::kF16: case DType::kF32: case DType::kF64: code = dtype_code::Float; break;
    case DType::kBF16: code = torch ? dtype_code::Bfloat : dtype_code::UInt; break;
    case DType::kF8_E4M3: code = torch ? dtype_code::Float8_E4M3FN : dtype_code::UInt; break;
    case DType::kF8_E5M2: code = torch ? dtype_code::Float8_E5M2 : dtype_code::UInt; break;
  }
  dt.code = static_cast<uint8_t>(code);
  return dt;
}

nb::object ExportTensor(const void* data, DType dtype, const std::vector<uint64_t>& shape, nb::handle owner,
                        bool torch) {
  std::vector<size_t> dims(shape.begin(), shape.end());
  // A zero-element tensor may have no buffer; DLPack consumers want a
  // non-null pointer.
  static const uint64_t kEmpty = 0;
  if (data == nullptr) data = &kEmpty;
  nb::dlpack::dtype dt = ExportDType(dtype, torch);
  if (torch) {
    nb::ndarray<nb::pytorch, nb::ro> a(data, dims.size(), dims.data(), owner, nullptr, dt, nb::device::cpu::value);
    return a.cast(nb::rv_policy::reference);
  }
  nb::ndarray<nb::numpy, nb::ro> a(data, dims.size(), dims.data(), owner, nullptr, dt, nb::device::cpu::value);
  return a.cast(nb::rv_policy::reference);
}

bool ParseFramework(std::string_view framework) {
  if (framework == "numpy") return false;
  if (framework == "torch") return true;
  Raise(ErrorCode::kInvalidArgument, "unknown framework '" + std::string(framework) + "' (numpy or torch)");
}

std::vector<StateItem> StateItems(const WeightState& state) {
  std::vector<StateItem> v;
  for (const WeightState::Tensor& t : state.tensors()) v.push_back(StateItem{t.name, t.dtype, t.shape, t.data.data()});
  return v;
}

nb::list ExportItems(const std::vector<StateItem>& items, nb::handle owner, bool torch) {
  nb::list list;
  for (const StateItem& it : items) {
    list.append(nb::make_tuple(it.name, std::string(DTypeName(it.dtype)),
                               ExportTensor(it.data, it.dtype, it.shape, owner, torch)));
  }
  return list;
}

nb::list ExportState(std::mutex& mutex, const WeightState& state, nb::handle owner, std::string_view framework) {
  const bool torch = ParseFramework(framework);
  std::vector<StateItem> items = WithoutGil(mutex, [&] { return StateItems(state); });
  return ExportItems(items, owner, torch);
}

}  // namespace deltasync::py
