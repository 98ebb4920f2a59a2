// Request schemas. nlohmann::json is used without exceptions (parse with
// allow_exceptions=false, and every value's type is checked before get<>),
// so no malformed body can throw through a handler.
#include "server/requests.h"

#include <nlohmann/json.hpp>

#include "deltasync/store.h"

namespace deltasync::server {
namespace {

using nlohmann::json;

Result<json> ParseObject(std::string_view body) {
  // The JSON parser stops at a NUL as if the input ended there; a body with
  // bytes after it is not the JSON it looks like.
  if (body.find('\0') != std::string_view::npos) return Status::InvalidArgument("the body contains a NUL byte");
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument("the body is not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument("the body must be a JSON object");
  return j;
}

// The value of `field` when it is a string; absent -> nullopt.
Result<std::optional<std::string>> OptionalString(const json& object, const char* field, std::string_view where) {
  auto it = object.find(field);
  if (it == object.end()) return std::optional<std::string>();
  if (!it->is_string()) return Status::InvalidArgument(std::string(where) + "." + field + " must be a string");
  return std::optional<std::string>(it->get<std::string>());
}

}  // namespace

Result<UpdateWeightsRequest> ParseUpdateWeights(std::string_view body) {
  DS_ASSIGN_OR_RETURN(json j, ParseObject(body));
  auto info = j.find("update_info");
  if (info == j.end()) return Status::InvalidArgument("update_info is required");
  if (!info->is_object()) return Status::InvalidArgument("update_info must be an object");
  UpdateWeightsRequest r;
  DS_ASSIGN_OR_RETURN(std::optional<std::string> filename, OptionalString(*info, "filename", "update_info"));
  if (!filename) return Status::InvalidArgument("update_info.filename is required");
  Status valid = ValidateKey(*filename);
  if (!valid.ok()) return Status::InvalidArgument("update_info.filename is not a bucket key: " + valid.message());
  r.filename = std::move(*filename);
  DS_ASSIGN_OR_RETURN(std::optional<std::string> repo_id, OptionalString(*info, "repo_id", "update_info"));
  r.repo_id = repo_id.value_or("");
  DS_ASSIGN_OR_RETURN(std::optional<std::string> kind, OptionalString(*info, "update_kind", "update_info"));
  if (kind && *kind != "dense" && *kind != "sparse_flat") {
    return Status::InvalidArgument("update_info.update_kind must be \"dense\" or \"sparse_flat\"");
  }
  r.update_kind = kind.value_or("");
  return r;
}

Result<bool> ParseStartWeightUpdate(std::string_view body) {
  DS_ASSIGN_OR_RETURN(json j, ParseObject(body));
  auto it = j.find("is_checkpoint_format");
  if (it == j.end()) return Status::InvalidArgument("is_checkpoint_format is required");
  if (!it->is_boolean()) return Status::InvalidArgument("is_checkpoint_format must be true or false");
  return it->get<bool>();
}

Result<uint64_t> ParseNotify(std::string_view body) {
  DS_ASSIGN_OR_RETURN(json j, ParseObject(body));
  auto it = j.find("version");
  if (it == j.end()) return Status::InvalidArgument("version is required");
  // Unsigned JSON integers only: 1.0, -1 and "1" are refused.
  if (!it->is_number_unsigned() || it->get<uint64_t>() == 0) {
    return Status::InvalidArgument("version must be an integer >= 1");
  }
  return it->get<uint64_t>();
}

Status ParseOptionalObject(std::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return Status::OK();
  Result<json> j = ParseObject(body);
  return j.ok() ? Status::OK() : j.status();
}

Result<std::string> ParsePauseMode(const std::string* mode) {
  if (!mode) return std::string("keep");
  if (*mode == "keep" || *mode == "wait" || *mode == "abort") return *mode;
  return Status::InvalidArgument("mode must be keep, wait or abort, got '" + *mode + "'");
}

}  // namespace deltasync::server
