// deltasync._native: the nanobind extension behind the deltasync package.
// Errors surface as the classes of deltasync._errors (see common.cc).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common.h"
#include "common/thread_start.h"
#include "deltasync/changes.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"

namespace deltasync::py {
void BindPublisher(nb::module_& m);
void BindReplica(nb::module_& m);
void BindParts(nb::module_& m);
void BindElements(nb::module_& m);
void BindShmJobs(nb::module_& m);
}  // namespace deltasync::py

NB_MODULE(_native, m) {
  namespace nb = nanobind;
  using namespace nb::literals;
  // Views returned by Replica.tensors() legitimately keep replicas alive
  // until interpreter shutdown; no "leaked instances" noise then.
  nb::set_leak_warnings(false);
  m.doc() = "deltasync's C++ core (Publisher, Replica); use the deltasync package rather than this module";
  deltasync::py::BindPublisher(m);
  deltasync::py::BindReplica(m);
  deltasync::py::BindParts(m);
  deltasync::py::BindElements(m);
  deltasync::py::BindShmJobs(m);
  // For tests of the error mapping: raises the class for `code`
  // ("integrity", ...) with `message`.
  m.def(
      "_raise",
      [](const std::string& code, const std::string& message) {
        for (int c = 1; c <= static_cast<int>(deltasync::ErrorCode::kInternal); ++c) {
          auto ec = static_cast<deltasync::ErrorCode>(c);
          if (deltasync::ErrorCodeName(ec) == code) deltasync::py::Raise(ec, message);
        }
        deltasync::py::Raise(deltasync::ErrorCode::kInvalidArgument, "unknown error code '" + code + "'");
      },
      "code"_a, "message"_a);
  // Test hook (common/thread_start.h): thread starts fail from the `after`-th
  // next one on, as if the system refused them; -1 stops it.
  m.def("_fail_thread_starts_after_for_testing", &deltasync::FailThreadStartsAfterForTesting, "after"_a);
  // The one wording of a tensor-set mismatch (include/deltasync/changes.h).
  m.def(
      "describe_tensor_set_diff",
      [](const std::vector<std::string>& base, const std::vector<std::string>& current) {
        return deltasync::DescribeTensorSetDiff(base, current);
      },
      "base"_a, "current"_a);
  m.def(
      "dtype_size", [](const std::string& name) -> size_t {
        auto dt = deltasync::ParseDType(name);
        if (!dt) deltasync::py::Raise(deltasync::ErrorCode::kInvalidArgument, "unknown dtype " + name);
        return deltasync::DTypeSize(*dt);
      },
      "name"_a);
}
