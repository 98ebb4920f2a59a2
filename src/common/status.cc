#include "deltasync/status.h"

namespace deltasync {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kCorruption: return "corruption";
    case ErrorCode::kIntegrity: return "integrity";
    case ErrorCode::kIOError: return "io error";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kConflict: return "conflict";
    case ErrorCode::kFailedPrecondition: return "failed precondition";
    case ErrorCode::kInternal: return "internal";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(ErrorCodeName(code_)) + ": " + message_;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  // A message that already starts with this label (a file path, a key) is
  // not labelled twice: "x.safetensors: x.safetensors: ..." reads as a bug.
  if (message_.size() > context.size() + 1 && message_.starts_with(context) &&
      message_.compare(context.size(), 2, ": ") == 0) {
    return *this;
  }
  return Status(code_, std::string(context) + ": " + message_);
}

}  // namespace deltasync
