// Fuzz target for part receipts (PartReceipt::Parse, src/sync/part_committer.cc):
// the JSON each rank of a sharded publish hands the committing rank, read
// from another process. Properties, per input:
//   1. arbitrary bytes never crash (or throw out of) PartReceipt::Parse;
//   2. an accepted receipt holds exactly the values the JSON holds: each
//      field that Serialize writes equals the input's field of that name
//      (numbers compared as numbers: no wrap, no truncation, no rounding),
//      and "objects" is the input's array, element by element;
//   3. Serialize then Parse gives the same receipt, and Serialize is stable.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "deltasync/part_publisher.h"
#include "fuzz/fuzz_check.h"

namespace {

using deltasync::PartReceipt;
using Json = nlohmann::json;

using deltasync::fuzz::Check;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  deltasync::Result<PartReceipt> r = PartReceipt::Parse(text);
  if (!r.ok()) return 0;

  const std::string written = r->Serialize();
  const Json in = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  const Json out = Json::parse(written, nullptr, /*allow_exceptions=*/false);
  Check(in.is_object() && out.is_object(), "an accepted receipt is not a JSON object");
  // Fields are compared one by one: fields Serialize does not write are
  // ignored by Parse, in the receipt and in each object.
  auto same_fields = [](const Json& input, const Json& written, const char* what) {
    for (const auto& [key, value] : written.items()) {
      if (key == "state_hash" || key == "objects") continue;
      Check(input.contains(key), "Serialize wrote a field the input does not have");
      if (input[key] != value) std::fprintf(stderr, "%s: field %s: %s, read as %s\n", what, key.c_str(),
                                            input[key].dump().c_str(), value.dump().c_str());
      Check(input[key] == value, "a field of the receipt is not the input's value");
    }
  };
  same_fields(in, out, "receipt");
  Check(in.at("objects").is_array() && in["objects"].size() == out["objects"].size(),
        "the objects are not the input's array");
  for (size_t i = 0; i < out["objects"].size(); ++i) same_fields(in["objects"][i], out["objects"][i], "object");
  Check(in.at("state_hash").is_string() && in.at("state_hash").get<std::string>() == r->state_hash.Hex(),
        "the state hash is not the input's");
  if (in.contains("error")) Check(in["error"] == r->error, "the error is not the input's");

  deltasync::Result<PartReceipt> again = PartReceipt::Parse(written);
  Check(again.ok() && *again == *r, "Serialize then Parse gives another receipt");
  Check(again->Serialize() == written, "Serialize is not stable");
  return 0;
}
