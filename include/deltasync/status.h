// Status and Result<T>: how every fallible deltasync call reports failure.
//
// A Status is either OK or carries an ErrorCode plus a message meant for a
// person: it names the object (file, bucket key, tensor, version) and the rule
// that failed, e.g.
//   "deltas/step_000012.safetensors: xxh3-128 mismatch (manifest 3f.., got 9a..)".
// No deltasync API throws; exceptions from dependencies are caught at the
// boundary and turned into a Status.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace deltasync {

// A small, fixed set of error kinds. Callers branch on the code, people read
// the message.
enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,     // the caller's input is wrong (bad version, bad shape, ...)
  kNotFound,            // an object, tensor or version does not exist
  kCorruption,          // bytes violate a format rule (truncated, malformed, ...)
  kIntegrity,           // a hash does not match what the manifest promises
  kIOError,             // the OS or the network failed
  kUnsupported,         // well-formed but not supported here (e.g. nvcomp_cascaded)
  kConflict,            // another writer changed the bucket; version already exists
  kFailedPrecondition,  // the object is in the wrong state for this call
  kInternal,            // a bug in deltasync
};

// Stable lower-case name of a code ("corruption", "integrity", ...).
std::string_view ErrorCodeName(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return {}; }
  static Status InvalidArgument(std::string m) { return {ErrorCode::kInvalidArgument, std::move(m)}; }
  static Status NotFound(std::string m) { return {ErrorCode::kNotFound, std::move(m)}; }
  static Status Corruption(std::string m) { return {ErrorCode::kCorruption, std::move(m)}; }
  static Status Integrity(std::string m) { return {ErrorCode::kIntegrity, std::move(m)}; }
  static Status IOError(std::string m) { return {ErrorCode::kIOError, std::move(m)}; }
  static Status Unsupported(std::string m) { return {ErrorCode::kUnsupported, std::move(m)}; }
  static Status Conflict(std::string m) { return {ErrorCode::kConflict, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {ErrorCode::kFailedPrecondition, std::move(m)}; }
  static Status Internal(std::string m) { return {ErrorCode::kInternal, std::move(m)}; }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "corruption: <message>", or "ok".
  std::string ToString() const;
  // The same status with "<context>: " put before the message (OK stays OK);
  // unchanged when the message already starts with "<context>: ".
  Status WithContext(std::string_view context) const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                         // NOLINT
  Result(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).ok()); }  // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  // OK when a value is held.
  Status status() const { return ok() ? Status::OK() : std::get<Status>(v_); }
  // REQUIRES: ok().
  T& value() & { assert(ok()); return std::get<T>(v_); }
  const T& value() const& { assert(ok()); return std::get<T>(v_); }
  T&& value() && { assert(ok()); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace deltasync

#define DS_CONCAT_INNER_(a, b) a##b
#define DS_CONCAT_(a, b) DS_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function when `expr` is not OK.
#define DS_RETURN_IF_ERROR(expr)                       \
  do {                                                 \
    ::deltasync::Status ds_status_ = (expr);           \
    if (!ds_status_.ok()) return ds_status_;           \
  } while (0)

// `lhs = value of expr` or return its Status. lhs may declare a variable.
#define DS_ASSIGN_OR_RETURN(lhs, expr) \
  DS_ASSIGN_OR_RETURN_IMPL_(DS_CONCAT_(ds_result_, __LINE__), lhs, expr)
#define DS_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
