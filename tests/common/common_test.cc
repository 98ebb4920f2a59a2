#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

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

// ParallelForAhead: every task once, and `next` is the task the same thread
// runs next (n after its last), on 1 to 4 threads, with tasks that wait for
// the task before them to have started (as the compact walk's look-back
// waits): no deadlock.
TEST(ParallelForTest, AheadVisitsEveryTaskOnceAndNextIsTheThreadsNextTask) {
  for (int threads : {1, 2, 3, 4}) {
    for (size_t n : {size_t{1}, size_t{2}, size_t{5}, size_t{1000}}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + ", tasks " + std::to_string(n));
      std::vector<std::atomic<int>> hits(n);
      std::vector<std::atomic<int>> started(n);
      std::mutex mu;
      std::map<std::thread::id, std::vector<std::pair<size_t, size_t>>> runs;  // per thread: (task, next)
      ParallelForAhead(n, threads, [&](size_t i, size_t next) {
        started[i].store(1);
        if (i > 0) {
          while (started[i - 1].load() == 0) std::this_thread::yield();
        }
        hits[i]++;
        // Long enough that every thread takes tasks.
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        std::lock_guard<std::mutex> hold(mu);
        runs[std::this_thread::get_id()].push_back({i, next});
      });
      for (auto& h : hits) EXPECT_EQ(h.load(), 1);
      EXPECT_LE(runs.size(), static_cast<size_t>(threads));
      if (n == 1000) EXPECT_EQ(runs.size(), static_cast<size_t>(threads));
      for (const auto& [id, seq] : runs) {
        for (size_t j = 0; j < seq.size(); ++j) {
          const size_t want = j + 1 < seq.size() ? seq[j + 1].first : n;
          EXPECT_EQ(seq[j].second, want) << "task " << seq[j].first;
          if (j > 0) EXPECT_LT(seq[j - 1].first, seq[j].first);
        }
      }
    }
  }
}

}  // namespace
}  // namespace deltasync
