// The Store conformance suite (see store_conformance.h). Every test starts
// from an empty store and uses only the Store interface.
#include "store/store_conformance.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "testing/test_bytes.h"

namespace deltasync::testing {
namespace {

using testing::Span;
using testing::Str;

std::vector<uint8_t> Bytes(std::string_view s) { return {s.begin(), s.end()}; }

// Deterministic, position-dependent bytes: a shifted or truncated copy differs.
std::vector<uint8_t> Pattern(size_t n, uint32_t seed) { return testing::Pattern<std::vector<uint8_t>>(n, seed); }

bool Contains(const std::string& haystack, std::string_view needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_P(StoreConformanceTest, PutThenGetReturnsTheBytes) {
  ASSERT_TRUE(store_->Put("a.bin", Span("hello")).ok());
  Result<Blob> got = store_->Get("a.bin");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(Str(*got), "hello");
  EXPECT_FALSE(store_->Describe().empty());
}

TEST_P(StoreConformanceTest, EmptyObject) {
  ASSERT_TRUE(store_->Put("empty", ByteSpan()).ok());
  Result<Blob> got = store_->Get("empty");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->size(), 0u);
  EXPECT_EQ(store_->Size("empty").value(), 0u);
  EXPECT_EQ(store_->List("").value(), std::vector<std::string>{"empty"});
}

TEST_P(StoreConformanceTest, MultiPartPutConcatenates) {
  std::vector<uint8_t> big = Pattern(100000, 1);
  std::vector<ByteSpan> parts = {Span("header|"), ByteSpan(), Span("middle|"), big, Span("|end")};
  ASSERT_TRUE(store_->Put("deltas/step_000001.safetensors", parts).ok());
  std::vector<uint8_t> want = Bytes("header|middle|");
  want.insert(want.end(), big.begin(), big.end());
  for (uint8_t c : Bytes("|end")) want.push_back(c);
  Result<Blob> got = store_->Get("deltas/step_000001.safetensors");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(std::vector<uint8_t>(got->bytes().begin(), got->bytes().end()), want);
  EXPECT_EQ(store_->Size("deltas/step_000001.safetensors").value(), want.size());
}

TEST_P(StoreConformanceTest, PutReplacesTheObject) {
  ASSERT_TRUE(store_->Put("manifest.json", Span("a much longer first version")).ok());
  Result<Blob> old_copy = store_->Get("manifest.json");
  ASSERT_TRUE(old_copy.ok());
  ASSERT_TRUE(store_->Put("manifest.json", Span("second")).ok());
  EXPECT_EQ(Str(store_->Get("manifest.json").value()), "second");
  EXPECT_EQ(store_->Size("manifest.json").value(), 6u);
  // A Blob read before the replace keeps the old bytes.
  EXPECT_EQ(Str(*old_copy), "a much longer first version");
  EXPECT_EQ(store_->List("").value(), std::vector<std::string>{"manifest.json"});
}

TEST_P(StoreConformanceTest, MissingObjectIsNotFound) {
  ASSERT_TRUE(store_->Put("deltas/step_000001.safetensors", Span("x")).ok());
  for (std::string key : {"deltas/step_000003.safetensors", "nope", "no/such/dir/key",
                          "deltas/step_000001.safetensors/below"}) {
    SCOPED_TRACE(key);
    Result<Blob> get = store_->Get(key);
    ASSERT_FALSE(get.ok());
    EXPECT_EQ(get.status().code(), ErrorCode::kNotFound) << get.status().ToString();
    EXPECT_TRUE(Contains(get.status().message(), key)) << get.status().message();
    EXPECT_EQ(store_->Size(key).status().code(), ErrorCode::kNotFound);
    EXPECT_EQ(store_->GetRange(key, 0, 0).status().code(), ErrorCode::kNotFound);
  }
  // A "directory" that holds objects is not itself an object.
  EXPECT_EQ(store_->Get("deltas").status().code(), ErrorCode::kNotFound);
}

TEST_P(StoreConformanceTest, GetRange) {
  std::vector<uint8_t> data = Pattern(1000, 2);
  ASSERT_TRUE(store_->Put("obj", data).ok());
  struct Case {
    uint64_t offset, length;
  };
  for (Case c :
       {Case{0, 10}, Case{990, 10}, Case{123, 456}, Case{0, 1000}, Case{500, 0}, Case{1000, 0}, Case{0, 0}}) {
    SCOPED_TRACE(std::to_string(c.offset) + "+" + std::to_string(c.length));
    Result<Blob> got = store_->GetRange("obj", c.offset, c.length);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->size(), c.length);
    EXPECT_TRUE(std::equal(got->bytes().begin(), got->bytes().end(), data.begin() + c.offset));
  }
  for (Case c : {Case{995, 10}, Case{1001, 0}, Case{0, 1001}, Case{UINT64_MAX, 2}, Case{1, UINT64_MAX}}) {
    SCOPED_TRACE(std::to_string(c.offset) + "+" + std::to_string(c.length));
    Result<Blob> got = store_->GetRange("obj", c.offset, c.length);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), ErrorCode::kInvalidArgument) << got.status().ToString();
    EXPECT_TRUE(Contains(got.status().message(), "obj")) << got.status().message();
  }
}

TEST_P(StoreConformanceTest, SizeOfObjects) {
  ASSERT_TRUE(store_->Put("a/one", Span("1")).ok());
  ASSERT_TRUE(store_->Put("a/ten", Pattern(10, 3)).ok());
  EXPECT_EQ(store_->Size("a/one").value(), 1u);
  EXPECT_EQ(store_->Size("a/ten").value(), 10u);
}

TEST_P(StoreConformanceTest, ListFiltersByPrefixAndSorts) {
  // Put in an order that is not sorted.
  std::vector<std::string> keys = {"manifest.json",
                                   "deltas/step_000003.safetensors",
                                   "anchors/step_000001.safetensors",
                                   "deltas/step_000002.safetensors",
                                   "deltas/nested/deep/x",
                                   "deltasX",
                                   "a/b",
                                   "a/bc"};
  for (const std::string& k : keys) ASSERT_TRUE(store_->Put(k, Span(k)).ok()) << k;

  auto list = [&](std::string_view prefix) {
    Result<std::vector<std::string>> r = store_->List(prefix);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::vector<std::string>{"<error>"};
  };
  std::vector<std::string> all = keys;
  std::sort(all.begin(), all.end());
  EXPECT_EQ(list(""), all);
  EXPECT_EQ(list("deltas/"),
            (std::vector<std::string>{"deltas/nested/deep/x", "deltas/step_000002.safetensors",
                                      "deltas/step_000003.safetensors"}));
  EXPECT_EQ(list("deltas"),
            (std::vector<std::string>{"deltas/nested/deep/x", "deltas/step_000002.safetensors",
                                      "deltas/step_000003.safetensors", "deltasX"}));
  EXPECT_EQ(list("deltas/step_00000"),
            (std::vector<std::string>{"deltas/step_000002.safetensors", "deltas/step_000003.safetensors"}));
  EXPECT_EQ(list("deltas/nested/"), std::vector<std::string>{"deltas/nested/deep/x"});
  EXPECT_EQ(list("a/b"), (std::vector<std::string>{"a/b", "a/bc"}));
  EXPECT_EQ(list("anchors/step_000001.safetensors"),
            std::vector<std::string>{"anchors/step_000001.safetensors"});
  EXPECT_EQ(list("nope/"), std::vector<std::string>{});
  EXPECT_EQ(list("manifest.json/"), std::vector<std::string>{});
  // Prefixes are not keys: one that no key can have lists nothing, without error.
  EXPECT_EQ(list("../"), std::vector<std::string>{});
  EXPECT_EQ(list("/"), std::vector<std::string>{});
  EXPECT_EQ(list("a//"), std::vector<std::string>{});
}

TEST_P(StoreConformanceTest, ListOfEmptyStore) {
  EXPECT_EQ(store_->List("").value(), std::vector<std::string>{});
}

TEST_P(StoreConformanceTest, UnusualCharactersInKeys) {
  std::vector<std::string> keys = {
      "sp ace/a+b=c", "utf8/\xc3\xbc\xc3\xb1\xc3\xaf", "punct/!$&'()*,;@~%20#?", ".hidden", "x/..y",
      "dots..."};
  for (const std::string& k : keys) {
    ASSERT_TRUE(store_->Put(k, Span(k)).ok()) << k;
    EXPECT_EQ(Str(store_->Get(k).value()), k);
  }
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(store_->List("").value(), keys);
}

TEST_P(StoreConformanceTest, DeleteRemovesAndMissingIsOk) {
  ASSERT_TRUE(store_->Put("a/b/c", Span("1")).ok());
  ASSERT_TRUE(store_->Put("a/d", Span("2")).ok());
  ASSERT_TRUE(store_->Delete("a/b/c").ok());
  EXPECT_EQ(store_->Get("a/b/c").status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(store_->List("").value(), std::vector<std::string>{"a/d"});
  EXPECT_TRUE(store_->Delete("a/b/c").ok());      // again
  EXPECT_TRUE(store_->Delete("never/was").ok());  // never existed
  EXPECT_TRUE(store_->Delete("a/d/below").ok());  // below an object
  // The same key can be written again after a delete.
  ASSERT_TRUE(store_->Put("a/b/c", Span("3")).ok());
  EXPECT_EQ(Str(store_->Get("a/b/c").value()), "3");
  ASSERT_TRUE(store_->Delete("a/d").ok());
  ASSERT_TRUE(store_->Delete("a/b/c").ok());
  EXPECT_EQ(store_->List("").value(), std::vector<std::string>{});
}

TEST_P(StoreConformanceTest, InvalidKeysAreRefusedEverywhere) {
  ASSERT_TRUE(store_->Put("ok", Span("x")).ok());
  std::string nul_key("a\0b", 3);
  for (std::string key :
       {std::string(), std::string("/abs"), std::string("a/"), std::string("a//b"), std::string("./a"),
        std::string("a/../ok"), std::string(".."), std::string("a\\b"), nul_key, std::string(1025, 'k')}) {
    SCOPED_TRACE(::testing::PrintToString(key));
    EXPECT_EQ(store_->Put(key, Span("y")).code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(store_->Get(key).status().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(store_->GetRange(key, 0, 0).status().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(store_->Size(key).status().code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(store_->Delete(key).code(), ErrorCode::kInvalidArgument);
  }
  // Nothing was written or removed.
  EXPECT_EQ(store_->List("").value(), std::vector<std::string>{"ok"});
  EXPECT_EQ(Str(store_->Get("ok").value()), "x");
}

TEST_P(StoreConformanceTest, LargeObjectRoundTrip) {
  constexpr size_t kSize = size_t{64} << 20;
  std::vector<uint8_t> data = Pattern(kSize, 4);
  // Uneven parts, as a safetensors header + tensors would be.
  ByteSpan all(data);
  std::vector<ByteSpan> parts = {all.subspan(0, 4096 + 8), all.subspan(4096 + 8, kSize / 3),
                                 all.subspan(4096 + 8 + kSize / 3)};
  ASSERT_TRUE(store_->Put("anchors/big.safetensors", parts).ok());
  EXPECT_EQ(store_->Size("anchors/big.safetensors").value(), kSize);
  Result<Blob> got = store_->Get("anchors/big.safetensors");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), kSize);
  EXPECT_TRUE(std::equal(data.begin(), data.end(), got->data()));
  Result<Blob> range = store_->GetRange("anchors/big.safetensors", kSize / 2 - 7, 1 << 20);
  ASSERT_TRUE(range.ok()) << range.status().ToString();
  EXPECT_TRUE(std::equal(range->bytes().begin(), range->bytes().end(), data.begin() + (kSize / 2 - 7)));
}

TEST_P(StoreConformanceTest, ConcurrentPutsOfDifferentKeys) {
  constexpr int kThreads = 4, kPerThread = 25;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Half the keys share one directory, half get their own per thread,
        // so directory creation races too.
        std::string key =
            (i % 2 ? "shared/" : "t" + std::to_string(t) + "/") + std::to_string(t) + "_" + std::to_string(i);
        if (!store_->Put(key, Pattern(1000 + i, t * 1000 + i)).ok()) ++failures;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  std::vector<std::string> keys = store_->List("").value();
  ASSERT_EQ(keys.size(), static_cast<size_t>(kThreads * kPerThread));
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      std::string key =
          (i % 2 ? "shared/" : "t" + std::to_string(t) + "/") + std::to_string(t) + "_" + std::to_string(i);
      Result<Blob> got = store_->Get(key);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      std::vector<uint8_t> want = Pattern(1000 + i, t * 1000 + i);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), got->data(), got->data() + got->size())) << key;
    }
  }
}

// Atomic replace: a reader racing a writer sees one whole version or another,
// never a mix or a prefix. Version v is v+1 KiB of the byte v.
TEST_P(StoreConformanceTest, ReadersNeverSeeAPartialObject) {
  auto version_bytes = [](int v) { return std::vector<uint8_t>(1024 * (v + 1), static_cast<uint8_t>(v)); };
  ASSERT_TRUE(store_->Put("manifest.json", version_bytes(0)).ok());
  std::atomic<bool> done{false};
  std::atomic<int> bad{0}, reads{0};
  std::thread reader([&] {
    while (!done.load()) {
      Result<Blob> got = store_->Get("manifest.json");
      if (!got.ok() || got->size() == 0) {
        ++bad;
        continue;
      }
      uint8_t v = got->data()[0];
      bool whole = got->size() == 1024u * (v + 1) &&
                   std::all_of(got->data(), got->data() + got->size(), [v](uint8_t c) { return c == v; });
      if (!whole) ++bad;
      ++reads;
    }
  });
  for (int v = 1; v < 40; ++v) {
    // Each version is written after the reader got at least one more reply,
    // so reads overlap the writes even when the scheduler favours this thread.
    while (reads.load() + bad.load() < v) std::this_thread::yield();
    ASSERT_TRUE(store_->Put("manifest.json", version_bytes(v)).ok());
  }
  done = true;
  reader.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(store_->Get("manifest.json")->size(), 1024u * 40);
}

// Compare-and-swap: what keeps two publishers from overwriting each other's
// manifest.
TEST_P(StoreConformanceTest, PutIfUnchangedCreatesOnlyWhenAbsent) {
  ByteSpan a = Span("first");
  auto created = store_->PutIfUnchanged("m.json", std::span<const ByteSpan>(&a, 1), std::nullopt);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  ByteSpan b = Span("second");
  auto again = store_->PutIfUnchanged("m.json", std::span<const ByteSpan>(&b, 1), std::nullopt);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), ErrorCode::kConflict) << again.status().ToString();
  auto got = store_->Get("m.json");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(Str(*got), "first");
}

TEST_P(StoreConformanceTest, PutIfUnchangedDetectsAnotherWriter) {
  ASSERT_TRUE(store_->Put("m.json", Span("v1")).ok());
  auto read = store_->GetVersioned("m.json");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(Str(read->blob), "v1");
  // Another writer replaces it in between.
  ASSERT_TRUE(store_->Put("m.json", Span("v1 by someone else")).ok());
  ByteSpan mine = Span("v2 by me");
  auto lost = store_->PutIfUnchanged("m.json", std::span<const ByteSpan>(&mine, 1), read->token);
  ASSERT_FALSE(lost.ok());
  EXPECT_EQ(lost.status().code(), ErrorCode::kConflict) << lost.status().ToString();
  EXPECT_EQ(Str(*store_->Get("m.json")), "v1 by someone else");

  // With the current token the write goes through and yields a new token.
  auto fresh = store_->GetVersioned("m.json");
  ASSERT_TRUE(fresh.ok());
  auto won = store_->PutIfUnchanged("m.json", std::span<const ByteSpan>(&mine, 1), fresh->token);
  ASSERT_TRUE(won.ok()) << won.status().ToString();
  EXPECT_EQ(Str(*store_->Get("m.json")), "v2 by me");
  auto after = store_->GetVersioned("m.json");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->token, *won);
  EXPECT_NE(after->token, fresh->token);
  EXPECT_EQ(store_->GetVersioned("absent.json").status().code(), ErrorCode::kNotFound);
}

// Token (a HEAD on S3) is the token GetVersioned and PutIfUnchanged give:
// the publisher's pre-upload check compares it with the one it holds.
TEST_P(StoreConformanceTest, TokenIsTheTokenOfGetVersionedAndPutIfUnchanged) {
  ByteSpan first = Span("v1");
  auto created = store_->PutIfUnchanged("t.json", std::span<const ByteSpan>(&first, 1), std::nullopt);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  auto token = store_->Token("t.json");
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  EXPECT_EQ(*token, *created);
  EXPECT_EQ(*token, store_->GetVersioned("t.json")->token);
  ASSERT_TRUE(store_->Put("t.json", Span("v2 by someone else")).ok());
  auto moved = store_->Token("t.json");
  ASSERT_TRUE(moved.ok());
  EXPECT_NE(*moved, *token);
  EXPECT_EQ(*moved, store_->GetVersioned("t.json")->token);
  EXPECT_EQ(store_->Token("absent.json").status().code(), ErrorCode::kNotFound);
}

TEST_P(StoreConformanceTest, ConcurrentCompareAndSwapHasOneWinnerPerRound) {
  ASSERT_TRUE(store_->Put("counter", Span("0")).ok());
  std::atomic<int> wins{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 10; ++round) {
        auto read = store_->GetVersioned("counter");
        if (!read.ok()) continue;
        std::string next = std::to_string(std::stoi(Str(read->blob)) + 1) + "." + std::to_string(t);
        ByteSpan bytes = Span(next);
        if (store_->PutIfUnchanged("counter", std::span<const ByteSpan>(&bytes, 1), read->token).ok()) wins++;
      }
    });
  }
  for (auto& th : threads) th.join();
  // Every successful swap incremented the value it read: no lost update.
  std::string final_value = Str(*store_->Get("counter"));
  EXPECT_EQ(std::stoi(final_value), wins.load()) << final_value;
}

}  // namespace
}  // namespace deltasync::testing

// Binaries that include this file without a backend to test are fine.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(StoreConformanceTest);
