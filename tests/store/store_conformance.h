// The Store conformance suite: what every Store must do, whatever is behind it.
//
// The tests (store_conformance_test.cc) are value-parameterised over a
// factory, so each backend runs the same suite. To add one, in a test file of
// the store_tests binary:
//
//   INSTANTIATE_TEST_SUITE_P(S3, StoreConformanceTest,
//                            ::testing::Values(StoreFactory{"s3", [] { return ...; }}),
//                            StoreFactoryName);
//
// Each call of `make` must return a store that is empty and not shared with
// any other call (a fresh directory, a fresh bucket prefix), and clean up when
// the last reference goes (a custom deleter on the shared_ptr).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "deltasync/store.h"

namespace deltasync::testing {

struct StoreFactory {
  std::string name;  // test name suffix: letters, digits, '_'
  std::function<std::shared_ptr<Store>()> make;
};

// For INSTANTIATE_TEST_SUITE_P: names the instantiation after the backend.
inline std::string StoreFactoryName(const ::testing::TestParamInfo<StoreFactory>& info) {
  return info.param.name;
}

class StoreConformanceTest : public ::testing::TestWithParam<StoreFactory> {
 protected:
  void SetUp() override {
    store_ = GetParam().make();
    ASSERT_NE(store_, nullptr) << "factory " << GetParam().name << " returned no store";
  }
  std::shared_ptr<Store> store_;
};

}  // namespace deltasync::testing
