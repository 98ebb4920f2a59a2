// Fuzz target for the HTTP API's request decoders (src/server/requests.cc,
// auth.cc): the JSON bodies of /update_weights, /start_weight_update,
// /notify, /pause, /resume, /finish_weight_update, the /pause mode query,
// and the Authorization header. Properties, per input:
//   1. arbitrary bytes never crash (or throw out of) any decoder;
//   2. an accepted /notify gives a version >= 1 that is the body's own
//      (re-parsing {"version": V} gives V);
//   3. an accepted /update_weights has a filename that is a valid bucket key
//      and an update_kind that is "", "dense" or "sparse_flat"; the request
//      written back as JSON parses to the same request;
//   4. a body that any decoder accepts is a JSON object, so the bodiless
//      routes accept it too;
//   5. BearerMatches(header, token) holds exactly when header is
//      "Bearer " + token and the token is not empty.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "deltasync/store.h"
#include "fuzz/fuzz_check.h"
#include "server/auth.h"
#include "server/requests.h"

namespace {

using namespace deltasync;
using namespace deltasync::server;

using deltasync::fuzz::Check;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);

  Result<uint64_t> version = ParseNotify(body);
  if (version.ok()) {
    Check(*version >= 1, "/notify accepted version 0");
    Result<uint64_t> again = ParseNotify("{\"version\": " + std::to_string(*version) + "}");
    Check(again.ok() && *again == *version, "/notify's version does not round-trip");
  }
  Result<UpdateWeightsRequest> update = ParseUpdateWeights(body);
  if (update.ok()) {
    Check(ValidateKey(update->filename).ok(), "/update_weights accepted a filename that is not a key");
    Check(update->update_kind.empty() || update->update_kind == "dense" || update->update_kind == "sparse_flat",
          "/update_weights accepted an unknown update_kind");
    nlohmann::json info = {{"filename", update->filename}, {"repo_id", update->repo_id}};
    if (!update->update_kind.empty()) info["update_kind"] = update->update_kind;
    const std::string written = nlohmann::json{{"update_info", info}}.dump();
    Result<UpdateWeightsRequest> again = ParseUpdateWeights(written);
    Check(again.ok() && again->filename == update->filename && again->repo_id == update->repo_id &&
              again->update_kind == update->update_kind,
          "/update_weights does not round-trip");
  }
  Result<bool> checkpoint = ParseStartWeightUpdate(body);
  const bool object = ParseOptionalObject(body).ok();
  if (version.ok() || update.ok() || checkpoint.ok()) Check(object, "a decoder accepted a body that is no object");

  const std::string mode(body);
  Result<std::string> parsed = ParsePauseMode(&mode);
  if (parsed.ok()) Check(*parsed == mode, "the pause mode is not the one given");

  // The first line is a token, the rest a header.
  const size_t nl = body.find('\n');
  const std::string_view token = body.substr(0, nl);
  const std::string_view header = nl == std::string_view::npos ? std::string_view() : body.substr(nl + 1);
  const bool want = !token.empty() && header == "Bearer " + std::string(token);
  Check(BearerMatches(header, token) == want, "BearerMatches disagrees with plain comparison");
  if (!token.empty()) Check(BearerMatches("Bearer " + std::string(token), token), "the right token was refused");
  if (IsValidToken(token)) Check(token.find(' ') == std::string_view::npos, "a token with a space is valid");
  return 0;
}
