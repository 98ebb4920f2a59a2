// Helpers for tests that publish into a local bucket and look at it.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "deltasync/manifest.h"
#include "deltasync/store.h"

namespace deltasync::testing {

// A LocalStore over `dir` (created when missing).
inline std::shared_ptr<Store> OpenDirStore(const std::string& dir) {
  auto s = LocalStore::Open(dir);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::shared_ptr<Store>(std::move(*s)) : nullptr;
}

// The bucket's manifest, parsed (a test failure when it is missing or bad).
inline Manifest ReadManifest(Store& store) {
  auto blob = store.Get(kManifestKey);
  EXPECT_TRUE(blob.ok()) << blob.status().ToString();
  if (!blob.ok()) return {};
  auto m = Manifest::Parse(blob->bytes());
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? *m : Manifest{};
}

// The three index encodings as a test parameter, named "compact",
// "gap_delta", "raw" in the test names.
inline auto AllEncodings() {
  return ::testing::Values(IndexEncoding::kCompact, IndexEncoding::kGapDelta, IndexEncoding::kRaw);
}
inline std::string EncodingParamName(const ::testing::TestParamInfo<IndexEncoding>& p) {
  return p.param == IndexEncoding::kCompact ? "compact" : p.param == IndexEncoding::kGapDelta ? "gap_delta" : "raw";
}

}  // namespace deltasync::testing
