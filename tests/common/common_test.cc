#include <gtest/gtest.h>

#include <atomic>

#include "common/parallel.h"
#include "deltasync/status.h"
#include "deltasync/tensor.h"
#include "deltasync/weight_state.h"

namespace deltasync {
namespace {

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument(std::to_string(x) + " is odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  DS_ASSIGN_OR_RETURN(int h, Half(x));
  DS_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, CarriesCodeAndMessage) {
  EXPECT_TRUE(Status::OK().ok());
  Status s = Status::Corruption("x.safetensors: bad");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kCorruption);
  EXPECT_EQ(s.ToString(), "corruption: x.safetensors: bad");
  EXPECT_EQ(s.WithContext("version 3").message(), "version 3: x.safetensors: bad");
  // A label already at the front is not repeated.
  EXPECT_EQ(s.WithContext("x.safetensors").message(), "x.safetensors: bad");
  EXPECT_EQ(s.WithContext("x.safe").message(), "x.safe: x.safetensors: bad");
}

TEST(StatusTest, ResultPropagates) {
  EXPECT_EQ(Quarter(8).value(), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "3 is odd");
}

TEST(DTypeTest, NamesAndSizesRoundTrip) {
  for (int i = 0; i <= static_cast<int>(DType::kF64); ++i) {
    DType d = static_cast<DType>(i);
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.has_value()) << DTypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF64), 8u);
  EXPECT_FALSE(ParseDType("F4").has_value());
  EXPECT_FALSE(CheckedElementCount(std::vector<uint64_t>{1ull << 40, 1ull << 40}).has_value());
}

TEST(WeightStateTest, SortsAndRejectsBadInput) {
  std::vector<uint8_t> a(8), b(4);
  std::vector<TensorView> views = {{"z", DType::kBF16, {4}, a}, {"a", DType::kF32, {1}, b}};
  auto state = WeightState::FromViews(views);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->tensors()[0].name, "a");
  EXPECT_NE(state->Find("z"), nullptr);
  EXPECT_EQ(state->total_elements(), 5u);
  views.push_back({"a", DType::kF32, {1}, b});
  EXPECT_FALSE(WeightState::FromViews(views).ok());
  std::vector<TensorView> bad = {{"x", DType::kBF16, {3}, a}};
  EXPECT_FALSE(WeightState::FromViews(bad).ok());
}

TEST(ParallelForTest, VisitsEveryTaskOnce) {
  std::vector<std::atomic<int>> hits(1000);
  ParallelFor(hits.size(), 4, [&](size_t i) { hits[i]++; });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

}  // namespace
}  // namespace deltasync
