// Session 52 (h1, found by part_receipt_fuzz): a part receipt's numbers are
// read as exactly the JSON's numbers. Before, nlohmann's get<> converted
// whatever number it found: an object's size 98.654 was read as 98, a part
// 4294967297 as part 1, a version -1 as 2^64-1; and "objects" given as a JSON
// object (not an array) was iterated as if it were one.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "deltasync/part_publisher.h"
#include "testing/parts_util.h"

namespace deltasync {
namespace {

using Json = nlohmann::json;

TEST(PartReceiptParse, RoundTrips) {
  Result<PartReceipt> r = PartReceipt::Parse(testing::SampleReceipt().Serialize());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, testing::SampleReceipt());
}

TEST(PartReceiptParse, RefusesNumbersThatAreNotTheFieldsType) {
  const Json good = Json::parse(testing::SampleReceipt().Serialize());
  const std::vector<std::pair<std::string, Json>> cases = {
      {"/objects/0/size", 98.654},          {"/objects/0/size", -1},
      {"/part", uint64_t{4294967297}},      {"/parts", 1.0},
      {"/version", -1},                     {"/base_version", 11.5},
      {"/changed_elements", "4096"},        {"/objects/0/base_version", true},
  };
  for (const auto& [pointer, value] : cases) {
    SCOPED_TRACE(pointer + " = " + value.dump());
    Json bad = good;
    bad[Json::json_pointer(pointer)] = value;
    Result<PartReceipt> r = PartReceipt::Parse(bad.dump());
    EXPECT_FALSE(r.ok());
    if (!r.ok()) EXPECT_EQ(r.status().code(), ErrorCode::kCorruption) << r.status().ToString();
  }
}

TEST(PartReceiptParse, RefusesObjectsThatAreNotAnArray) {
  Json bad = Json::parse(testing::SampleReceipt().Serialize());
  bad["objects"] = Json{{"first", bad["objects"][0]}};
  Result<PartReceipt> r = PartReceipt::Parse(bad.dump());
  EXPECT_FALSE(r.ok()) << "read " << (r.ok() ? r->objects.size() : 0) << " objects";
}

}  // namespace
}  // namespace deltasync
